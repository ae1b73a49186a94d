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

from megatron_musa_patch import releases  # noqa: E402 - leaves: they activate nothing
from megatron_musa_patch.settings import ENV_NAMES, FOREIGN_ENV_NAMES  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: every variable of the layer (and torchada's, which it reads): a developer's shell must not
#: leak into subprocess tests
_LAYER_ENV = ENV_NAMES + FOREIGN_ENV_NAMES


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
        pytest.skip(f"needs a Megatron-LM checkout of a supported tag ({releases.tags()}): set "
                    f"MEGATRON_LM_PATH (archives: ../shared/upstream/)")
    path = Path(value)
    if not (path / "pretrain_gpt.py").is_file():
        pytest.fail(f"MEGATRON_LM_PATH={value} has no pretrain_gpt.py")
    return path
