"""Shared test set-up.

Unit tests import the package without activating it (activation patches torch for the whole
process); tests that need an activated layer start a subprocess, which gets a clean
environment from ``subprocess_env``.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["MEGATRON_MUSA_PATCH_AUTOACTIVATE"] = "0"

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
_LAYER_ENV = ("MEGATRON_MUSA_PATCH", "MEGATRON_MUSA_PATCH_AUTOACTIVATE",
              "MEGATRON_MUSA_PATCH_DEVICE", "MEGATRON_MUSA_PATCH_DISABLE",
              "MEGATRON_MUSA_PATCH_ONLY", "MEGATRON_MUSA_PATCH_PLUGINS",
              "MEGATRON_MUSA_PATCH_ALLOW_LATE", "MEGATRON_MUSA_PATCH_JIT")


def subprocess_env(**overrides):
    """The test process's environment without the layer's own variables, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k not in _LAYER_ENV}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update({k: str(v) for k, v in overrides.items() if v is not None})
    return env


def run_python(code, *, env=None, cwd=None, timeout=300, args=()):
    """Run ``python -c code`` (or a file) with a clean layer environment."""
    cmd = [sys.executable, "-c", code, *args] if code is not None else [sys.executable, *args]
    return subprocess.run(cmd, env=env or subprocess_env(), cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def lm_path():
    value = os.environ.get("MEGATRON_LM_PATH", "")
    if not value:
        pytest.skip("needs a Megatron-LM checkout of tag core_v0.16.1: set MEGATRON_LM_PATH")
    path = Path(value)
    if not (path / "pretrain_gpt.py").is_file():
        pytest.fail(f"MEGATRON_LM_PATH={value} has no pretrain_gpt.py")
    return path
