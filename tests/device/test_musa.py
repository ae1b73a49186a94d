"""Contract of the MUSA row, against a stand-in torch_musa (tests/fixtures/fake_musa), with each
of its torch mappings: torchada (the default) and the layer's built-in one (TORCHADA=0).

No MUSA hardware or torch_musa is available to this project: these tests check that the stock
path's CUDA sites -- torch.cuda.*, device='cuda', .cuda(), torch.device, Tensor.type strings,
autocast, nccl, the RNG tracker, streams, memory statistics -- are routed to ``torch.musa`` and
``mccl``, not that kernels run. The stand-in cannot allocate, so a site that allocates passes
when its error comes from the musa backend, not from CUDA.
"""

import json

import pytest

from tests.conftest import run_probe
from tests.device.musa_rows import MAPPINGS, musa_env

MUSA_BACKEND = ("'musa' backend", "not linked with support for musa devices",
                "PrivateUse1HooksInterface")


@pytest.fixture(scope="module", params=MAPPINGS)
def contract(request):
    proc = run_probe("tests.device.probes.musa_contract", env=musa_env(request.param))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    result = json.loads(line[len("RESULT"):])
    result["mapping"] = request.param
    return result


def test_auto_selects_musa_and_the_requested_mapping(contract):
    assert contract["device"] == "musa"
    expected = {"torchada": "torchada", "builtin": "megatron_musa_patch"}[contract["mapping"]]
    assert contract["adapter"] == expected


def test_torch_cuda_api_is_torch_musa(contract):
    assert contract["api_is_musa"] and contract["available"]
    assert contract["graph_alias"], "CUDAGraph must map to torch.musa.MUSAGraph"
    assert "set_device" in contract["calls"] and contract["current"] == 3


def test_names_torch_musa_lacks_fail_clearly(contract):
    assert "torch.cuda.ExternalStream has no counterpart on the musa device" in \
        contract["missing_api"]


def test_cuda_devices_become_musa_devices(contract):
    assert contract["devices"] == ["musa", "musa:1", "musa:2", "musa:0", "musa:5"]


@pytest.mark.parametrize("site", [
    "torch.empty(device='cuda')", ".cuda()", ".cuda(memory_format=)", ".to('cuda')", ".to(0)",
    "Module.cuda()", "new_empty(device='cuda')", "type('torch.cuda.FloatTensor')",
    "Generator(device='cuda')", "Generator(device=0)"])
def test_allocating_sites_reach_the_musa_backend(contract, site):
    # the stand-in has no kernels: the allocation must fail in the musa backend, not in CUDA
    error = contract["sites"][site].get("error", "")
    assert any(mark in error for mark in MUSA_BACKEND), (site, error)


@pytest.mark.parametrize("site,call", [
    ("random.get_rng_state", "get_rng_state"), ("import torch.cuda.random", "get_rng_state"),
    ("memory_allocated", "memory_allocated"), ("import torch.cuda.memory", "memory_allocated"),
    ("streams", "Stream")])
def test_rng_memory_and_stream_sites_call_torch_musa(contract, site, call):
    reached = contract["sites"][site]
    assert "error" not in reached and call in reached["calls"], (site, reached)


def test_rng_tracker_forks_the_musa_generator(contract):
    reached = contract["rng_tracker"]
    assert "error" not in reached, reached
    assert {"manual_seed", "get_rng_state", "generator.set_state"} <= set(reached["calls"])


def test_autocast_cuda_means_musa(contract):
    assert contract["autocast"] == ["musa", "musa"]


def test_is_cuda_means_on_musa_and_host_tensors_keep_their_type(contract):
    is_cuda, type_name, via_property = contract["cpu_tensor"]
    assert (is_cuda, via_property) == (False, False)
    assert type_name == "torch.FloatTensor"


def test_nccl_runs_on_mccl_and_megatron_sees_nccl(contract):
    assert "mccl_backend" in contract["calls"]
    assert contract["backend_seen_by_megatron"] == "nccl"
    assert contract["compound_group"] == "cpu:gloo,musa:mccl"


def test_jit_defaults_to_eager_on_musa(contract):
    assert contract["jit_eager"]
