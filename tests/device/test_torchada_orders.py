"""torchada and the layer on the stand-in MUSA row: whether the user imports torchada before the
layer, after it, or not at all, every torch name ends up patched by one adapter, and the same
one; ``mmp doctor`` says which. Where the layer maps torch itself (TORCHADA=0, or a cpu row on a
machine with torch_musa), torchada is refused instead of patching the same names again.
"""

import json
import os
import shutil
import sys

import pytest

from tests.conftest import run_probe, run_python
from tests.device.musa_rows import musa_env, needs_torchada

pytestmark = needs_torchada


def owners(order, **env):
    """For every torch name either adapter may patch, which adapters its object reaches."""
    proc = run_probe("tests.device.probes.torchada_orders_owners",
                     env=musa_env("torchada", ORDER=order, **env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


@pytest.fixture(scope="module")
def orders():
    return {order: owners(order) for order in ("before", "after", "none")}


def patched_names(result):
    return {k: v for k, v in result.items() if isinstance(v, list)}


def test_each_torch_name_is_patched_by_one_adapter(orders):
    for order, result in orders.items():
        stacked = {k: v for k, v in patched_names(result).items() if len(v) > 1}
        assert not stacked, f"{order}: names patched by two adapters: {stacked}"


def test_the_three_import_orders_give_the_same_mapping(orders):
    none, after, before = (patched_names(orders[k]) for k in ("none", "after", "before"))
    assert after == none == before
    # imported before the layer without TORCHADA_FORCE_CUDA_AVAILABLE, torchada keeps
    # torch.cuda.is_available() False; there the layer's gap record points it at torch.musa
    assert none["torch.cuda.is_available"] == ["torch.musa"]
    assert [orders[k]["is_available record"] for k in ("none", "after", "before")] == [
        "skipped", "skipped", "applied"]
    assert all(r["is_available"] for r in orders.values())
    assert orders["after"]["unchanged by a later import torchada"] is True
    assert [orders[k]["origin"] for k in ("none", "after", "before")] == [
        "imported by the layer", "imported by the layer", "imported before the layer"]


def test_imported_before_with_force_leaves_is_available_to_torchada(orders):
    forced = owners("before", TORCHADA_FORCE_CUDA_AVAILABLE="1")
    assert patched_names(forced) == patched_names(orders["none"])
    assert forced["is_available record"] == "skipped" and forced["is_available"]


def test_who_maps_what(orders):
    """The measured split: torchada maps torch.cuda, devices, factories, .to, .is_cuda, nvtx
    and the module paths; the layer keeps Tensor.type, new_*, Tensor.cuda, autocast's
    __init__, the three collectives and the torch.cuda names torch.musa lacks."""
    names = orders["none"]
    assert names["adapter"] == "torchada" and names["torch.cuda"] == ["torchada"]
    torchada = {"torch.device", "torch.empty", "torch.zeros", "Tensor.to", "Tensor.is_cuda",
                "Module.cuda", "torch.amp.autocast"}
    ours = {"Tensor.type", "Tensor.cuda", "Tensor.new_empty", "Tensor.new_tensor",
            "autocast_mode.autocast.__init__", "torch.distributed.init_process_group",
            "torch.distributed.new_group", "torch.distributed.get_backend",
            "torch.cuda.ExternalStream", "torch.cuda.memory_stats"}
    assert {k for k in torchada if names[k] != ["torchada"]} == set()
    assert {k for k in ours if names[k] != ["megatron_musa_patch"]} == set()
    assert names["Module.to"] == [], "Module.to is torch's: it reaches torchada's Tensor.to"
    assert names["torch.cuda.current_device"] == ["torch.musa"]
    assert names["import torch.cuda.nvtx"] == ["torchada.cuda.nvtx"]
    assert names["import torch.cuda.memory"] == ["torch_musa.memory"]


def test_doctor_names_the_adapter_and_its_version():
    mmp = shutil.which("mmp", path=os.path.dirname(sys.executable))
    proc = run_python(None, args=(mmp, "doctor", "--no-import"), env=musa_env("torchada"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "torchada             0.1.103" in out
    assert "torch mapping        torchada 0.1.103 (imported by the layer)" in out
    assert "torch mapped by torchada 0.1.103" in out  # the table's header
    assert "mapped by torchada 0.1.103: torch.device('cuda')" in out
    assert "torchada leaves this (0.1.103): torchada's Tensor.cuda has no memory_format" in out
