"""Upstream bugs that only appear without TransformerEngine (every device, CUDA included).

* ``CheckpointWithoutOutput(fp8=False)`` sets ``self.fp8 = fp8 is not None`` (True), so its
  forward takes the fp8 branch and hits ``FP8GlobalStateManager`` (NameError without TE).
* ``moe_utils`` imports ``te_general_gemm`` only inside its TE ``try`` and then tests
  ``te_general_gemm is not None`` (NameError without TE).
* ``OptimizerConfig.__post_init__`` calls ``is_te_min_version`` for the precision-aware
  optimizer; without TE that compares ``None`` with a version (TypeError).
"""

from __future__ import annotations

import importlib.util
import sys

from ..hookspecs import hookimpl
from ..registry import Patch

FEATURE = "no_te_fixes"
REQUIRED = False
DESCRIPTION = "fixes for upstream code paths that break when TransformerEngine is absent"


def _te_missing():
    return True if importlib.util.find_spec("transformer_engine") is None else "TE is installed"


@hookimpl
def mmp_register_patches(registry, device):
    registry.add(Patch(
        "no_te.checkpoint_without_output_fp8",
        "megatron.core.tensor_parallel.random:CheckpointWithoutOutput.__init__", "wrap",
        _checkpoint_without_output_init, FEATURE, condition=_te_missing,
        why="fp8=False/None means no fp8; without TE there is no fp8 at all"))
    registry.add(Patch(
        "no_te.moe_te_general_gemm", "megatron.core.transformer.moe.moe_utils:te_general_gemm",
        "attribute", None, FEATURE, create=True, condition=_moe_utils_lacks_gemm,
        why="define the name the router tests for (None: use torch.mm)"))
    registry.add(Patch(
        "no_te.optimizer_config_te_version",
        "megatron.core.optimizer.optimizer_config:is_te_min_version", "wrap",
        _false_without_te, FEATURE, condition=_te_missing,
        why="no TE means no TE version is new enough"))


def _checkpoint_without_output_init(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    fp8 = kwargs.get("fp8", args[0] if args else False)
    module = sys.modules["megatron.core.tensor_parallel.random"]
    instance.fp8 = bool(getattr(module, "HAVE_TE", False)) and fp8 not in (None, False)


def _moe_utils_lacks_gemm():
    module = sys.modules.get("megatron.core.transformer.moe.moe_utils")
    if module is not None and "te_general_gemm" in vars(module):
        return "moe_utils defines te_general_gemm"
    return True


def _false_without_te(wrapped, instance, args, kwargs):
    return False
