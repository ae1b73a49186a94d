"""The measurement behind ``device/torchada_coverage.py``: the MUSA contract's cases run with
torchada alone doing the mapping (the layer not active), against the stand-in torch_musa.

Every target the coverage calls mapped must work through torchada, and every gap must still be
one -- so a torchada release that closes a gap (the layer's record is then redundant) or opens
one (a skipped record is then needed) fails here, naming the target.
"""

import json

import pytest

from megatron_musa_patch.device import torchada_coverage as coverage

from tests.conftest import run_probe
from tests.device.musa_rows import musa_env, needs_torchada

pytestmark = needs_torchada


@pytest.fixture(scope="module")
def alone():
    proc = run_probe("tests.device.probes.torchada_gaps_alone",
                     env=musa_env("torchada", MEGATRON_MUSA_PATCH_AUTOACTIVATE="0",
                                  TORCHADA_FORCE_CUDA_AVAILABLE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


@pytest.mark.parametrize("target", sorted(coverage.MAPPED) + list(coverage._INT_DEVICE_TARGETS))
def test_what_torchada_maps_works_without_the_layer(alone, target):
    assert alone["works"][target], f"{target}: torchada no longer maps it (the layer must)"


@pytest.mark.parametrize("target", sorted(coverage.GAPS))
def test_each_gap_is_still_a_gap(alone, target):
    assert not alone["works"][target], (
        f"{target}: torchada now handles it; drop it from GAPS (its record becomes redundant)")


def test_torch_cuda_names_fail_exactly_where_torch_musa_lacks_them(alone):
    # the live rule: torchada's redirect resolves every name torch.musa has (and cudart)
    assert alone["unresolved"] == alone["musa_lacks"]
    assert "ExternalStream" in alone["unresolved"] and "current_device" not in alone["unresolved"]
    assert alone["available"], "TORCHADA_FORCE_CUDA_AVAILABLE=1 makes is_available torch.musa's"


def test_factories_and_module_paths_are_torchadas(alone):
    from megatron_musa_patch.device import torch_api

    import torch

    assert alone["factories_wrapped"] == sorted(n for n in torch_api.FACTORY_FUNCTIONS
                                                if hasattr(torch, n))
    assert alone["factories_on_musa"]
    assert alone["submodules"] == {"torch.cuda.random": "torchada.cuda.random",
                                   "torch.cuda.memory": "torch_musa.memory",
                                   "torch.cuda.nvtx": "torchada.cuda.nvtx"}
