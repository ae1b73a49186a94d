"""Importing torchada at the right moment: before torch, torch_musa and any patch record.

torchada syncs ``MUSA_VISIBLE_DEVICES`` with ``CUDA_VISIBLE_DEVICES`` before it imports torch (a
MUSA build may initialise its runtime while torch or torch_musa load), and every record of the
layer captures torch objects when it is built. So activation calls :func:`preload` first, and
this module imports neither torch nor the device package (which does). Which adapter then maps
torch, and what follows from that, is ``device/adapter.py``'s business.
"""

from __future__ import annotations

import importlib
import os
import sys

from megatron_musa_patch.upstream import conditions
from megatron_musa_patch.core.settings import TORCHADA_ENV, TORCHADA_FORCE_ENV

MODULE = "torchada"
#: the release the coverage was measured on (setup.py's musa extra pins it)
TESTED_VERSION = "0.1.103"
SWITCH = TORCHADA_ENV
EXTRA = 'pip install "megatron-musa-patch[musa]"'


def would_map_musa(settings) -> bool:
    """Whether ``import torchada`` would patch torch for MUSA here (its own detection: a
    TORCHADA_PLATFORM of cpu or cuda stops it; otherwise an importable torch_musa decides)."""
    return settings.torchada_platform not in ("cpu", "cuda") and \
        conditions.importable("torch_musa")


def preload(settings) -> bool:
    """Import torchada now if the musa row is the likely choice and will use it. Returns True
    when this call imported it (False: not wanted here, not installed, or imported already)."""
    if not settings.torchada or settings.device not in ("auto", "musa") or MODULE in sys.modules:
        return False
    if not conditions.importable(MODULE) or not would_map_musa(settings):
        return False
    import_now(settings)
    return True


def import_now(settings) -> None:
    """Import torchada with ``TORCHADA_FORCE_CUDA_AVAILABLE=1`` unless the user set it: Megatron
    asserts ``torch.cuda.is_available()``, which torchada otherwise keeps False on MUSA. The
    variable stays set, so the ranks this process starts import it the same way."""
    if settings.torchada_force_cuda_available is None:
        os.environ[TORCHADA_FORCE_ENV] = "1"
    importlib.import_module(MODULE)
