"""Run Megatron-LM's own ``tools/preprocess_data.py`` (from ``MEGATRON_LM_PATH``) to compare
against: the byte-identity tests and ``benchmarks/bench_data_prepare.py`` use it.

The checkout goes *after* site-packages on ``sys.path`` (its ``megatron/core`` would shadow
pip's). ``preprocess_data.py`` imports ``megatron.training``, whose ``initialize`` imports
triton at module level only for batch-invariant kernels; where triton is not installed a stand-in
for that one module is registered, so the upstream script runs unmodified.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Optional

from megatron_musa_patch.base.env_names import AUTOACTIVATE_ENV
from megatron_musa_patch.core.settings import LM_PATH_ENV as ENV

_RUNNER = r"""
import importlib.util, runpy, sys, types
checkout = sys.argv[1]
sys.path.append(checkout)
sys.path.append(checkout + "/tools")
if importlib.util.find_spec("triton") is None:
    name = "megatron.core.transformer.custom_layers.batch_invariant_kernels"
    stand_in = types.ModuleType(name)
    def _needs_triton(*args, **kwargs):
        raise RuntimeError("batch-invariant mode needs triton")
    for attr in ("set_batch_invariant_mode", "disable_batch_invariant_mode",
                 "enable_batch_invariant_mode"):
        setattr(stand_in, attr, _needs_triton)
    stand_in.is_batch_invariant_mode_enabled = lambda: False
    sys.modules[name] = stand_in
script = checkout + "/tools/preprocess_data.py"
sys.argv = [script] + sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def checkout() -> Optional[str]:
    """The Megatron-LM checkout named by MEGATRON_LM_PATH, if it has tools/preprocess_data.py."""
    path = os.environ.get(ENV)
    if path and os.path.isfile(os.path.join(path, "tools", "preprocess_data.py")):
        return os.path.abspath(path)
    return None


def command(argv: List[str], path: Optional[str] = None) -> List[str]:
    path = path or checkout()
    if path is None:
        raise RuntimeError(f"{ENV} does not name a Megatron-LM checkout with "
                           "tools/preprocess_data.py")
    return [sys.executable, "-c", _RUNNER, path] + list(argv)


def run_preprocess_data(argv: List[str], **kwargs) -> subprocess.CompletedProcess:
    """Run upstream preprocess_data.py with ``argv``; raises CalledProcessError on failure."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    env = dict(kwargs.pop("env", None) or os.environ)
    env.setdefault(AUTOACTIVATE_ENV, "0")
    proc = subprocess.run(command(argv), env=env, **kwargs)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return proc
