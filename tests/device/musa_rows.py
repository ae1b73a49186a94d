"""The MUSA row's two torch mappings, for contract tests against the stand-in torch_musa:
``torchada`` (the default: Moore Threads' adapter maps torch, the layer fills its gaps) and
``builtin`` (``MEGATRON_MUSA_PATCH_TORCHADA=0``: the layer's own mapping)."""

import importlib.util

import pytest

from tests.conftest import FIXTURES, subprocess_env

STAND_IN = str(FIXTURES / "fake_musa")
TORCHADA_MISSING = importlib.util.find_spec("torchada") is None
needs_torchada = pytest.mark.skipif(
    TORCHADA_MISSING, reason="torchada is not installed: the musa extra (pip install "
    "'.[musa]'; scripts/bootstrap.sh installs it)")

MAPPINGS = [pytest.param("torchada", marks=needs_torchada), "builtin"]


def musa_env(mapping: str, **overrides):
    """A subprocess environment on the stand-in MUSA row with ``mapping`` doing the torch side."""
    extra = {"MEGATRON_MUSA_PATCH_TORCHADA": "0"} if mapping == "builtin" else {}
    return subprocess_env(PYTHONPATH=STAND_IN, **extra, **overrides)
