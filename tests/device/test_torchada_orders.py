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

from tests.conftest import run_python
from tests.device.musa_rows import musa_env, needs_torchada

pytestmark = needs_torchada

#: prints, for every torch name either adapter may patch, which adapters its object reaches
OWNERS = r"""
import functools, inspect, json, os, sys, types
ORDER = os.environ["ORDER"]
if ORDER == "before":
    import torchada
import megatron_musa_patch, torch
import torch.distributed as dist
from megatron_musa_patch.device import torch_api


def owner(obj):
    target = obj.func if isinstance(obj, functools.partial) else obj
    target = getattr(target, "fget", target)
    code = getattr(target, "__code__", None)
    try:
        path = code.co_filename if code else inspect.getfile(target)
    except TypeError:  # builtins: torch's own
        return None
    for name in ("torchada", "megatron_musa_patch"):
        if os.sep + name + os.sep in path:
            return name
    return None


def reachable(obj, depth=4, seen=None):
    # every object a patched name can call into: __wrapped__ chains (functools, wrapt), wrapt's
    # wrapper, partials, properties and closure cells
    seen = set() if seen is None else seen
    if obj is None or id(obj) in seen or depth < 0:
        return []
    seen.add(id(obj))
    found = [obj]
    nexts = [getattr(obj, "__wrapped__", None), getattr(obj, "_self_wrapper", None),
             getattr(obj, "func", None), getattr(obj, "fget", None)]
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if callable(value) and not isinstance(value, type):
            nexts.append(value)
    for nxt in nexts:
        found += reachable(nxt, depth - 1, seen)
    return found


def adapters(obj):
    return sorted({o for o in map(owner, reachable(obj)) if o})


def provider(name):
    value = getattr(torch.cuda, name, None)
    alias = {"CUDAGraph": "MUSAGraph"}.get(name, name)
    if value is not None and value is getattr(torch.musa, alias, object()):
        return ["torch.musa"]
    return adapters(value)


names = {"torch.cuda": [type(sys.modules["torch.cuda"]).__module__.split(".")[0]]}
names.update({f"torch.cuda.{n}": provider(n) for n in torch_api.CUDA_API})
names.update({f"torch.{n}": adapters(getattr(torch, n)) for n in torch_api.FACTORY_FUNCTIONS
              if hasattr(torch, n)})
for n in ("to", "cuda", "type", "is_cuda", *torch_api.TENSOR_DEVICE_METHODS):
    names[f"Tensor.{n}"] = adapters(vars(torch.Tensor).get(n))
for n in ("to", "cuda"):
    names[f"Module.{n}"] = adapters(vars(torch.nn.Module).get(n))
names["torch.device"] = adapters(torch.device)
names["autocast_mode.autocast.__init__"] = adapters(
    vars(torch.amp.autocast_mode.autocast)["__init__"])
names["torch.amp.autocast"] = adapters(torch.amp.autocast)
for n in ("init_process_group", "new_group", "get_backend"):
    names[f"torch.distributed.{n}"] = adapters(getattr(dist, n))
for module in ("torch.cuda.random", "torch.cuda.memory", "torch.cuda.nvtx"):
    names[f"import {module}"] = [sys.modules[module].__name__]
ids = {k: id(v) for k, v in vars(torch.Tensor).items()}
if ORDER == "after":
    import torchada
    names["unchanged by a later import torchada"] = [
        k for k, v in vars(torch.Tensor).items() if ids.get(k) != id(v)] == []
session = megatron_musa_patch.active_session()
names["adapter"] = session.torch_mapping.adapter
names["origin"] = getattr(session.torch_mapping, "origin", None)
names["is_available"] = torch.cuda.is_available()
names["is_available record"] = session.registry.result("device.torch_cuda.is_available").status
print("RESULT" + json.dumps(names))
"""


def owners(order, **env):
    proc = run_python(OWNERS, env=musa_env("torchada", ORDER=order, **env))
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
