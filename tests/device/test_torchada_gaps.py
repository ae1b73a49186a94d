"""The measurement behind ``device/torchada_coverage.py``: the MUSA contract's cases run with
torchada alone doing the mapping (the layer not active), against the stand-in torch_musa.

Every target the coverage calls mapped must work through torchada, and every gap must still be
one -- so a torchada release that closes a gap (the layer's record is then redundant) or opens
one (a skipped record is then needed) fails here, naming the target.
"""

import json

import pytest

from megatron_musa_patch.device import torchada_coverage as coverage

from tests.conftest import run_python
from tests.device.musa_rows import musa_env, needs_torchada

pytestmark = needs_torchada

ALONE = r"""
import json, os, sys
import torch
import torchada, torch_musa
import torch.distributed as dist
from megatron_musa_patch.device import torch_api  # AUTOACTIVATE=0: tables only

x = torch.ones(2)
MUSA = ("'musa' backend", "not linked with support for musa devices", "PrivateUse1Hooks")


def on_musa(fn):
    # allocations cannot succeed on the stand-in: True when the error comes from musa
    try:
        fn()
    except Exception as exc:
        return any(m in str(exc) for m in MUSA)
    return True


def raises(fn, kind=Exception):
    try:
        fn()
    except kind:
        return True
    return False


def in_child(probe):
    # a group torchada leaves on NCCL is a real ProcessGroupNCCL, whose destructor aborts the
    # process on a machine without an NVIDIA driver (torch 2.15): each probe runs in a forked
    # child that reports its answer and exits without tearing anything down
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            answer = probe()
        except Exception as exc:
            answer = type(exc).__name__
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data) if data else "no answer"


def backend_of(**kwargs):
    def probe():
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **kwargs)
        return str(dist.get_backend())
    return in_child(probe)


def group_backend(**kwargs):
    def probe():
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
        return str(dist.get_backend(dist.new_group([0], **kwargs)))
    return in_child(probe)


# target -> does torchada alone do what Megatron needs there?
works = {
    "torch:device": [str(torch.device(*a)) for a in (("cuda",), ("cuda:1",), ("cuda", 2))]
                    == ["musa", "musa:1", "musa:2"],
    "torch:Tensor.is_cuda": x.is_cuda is False and isinstance(torch.Tensor.is_cuda, property),
    "torch.nn:Module.cuda": on_musa(lambda: torch.nn.Linear(2, 2).cuda()),
    "torch:Generator": on_musa(lambda: torch.Generator(device="cuda"))
                       and on_musa(lambda: torch.Generator(device=0))
                       and isinstance(torch.default_generator, torch.Generator),
    "torch:Tensor.to": on_musa(lambda: x.to("cuda")) and on_musa(lambda: x.to(0))
                       and on_musa(lambda: x.to(device=torch.device("cuda"))),
    "torch.nn:Module.to": on_musa(lambda: torch.nn.Linear(2, 2).to("cuda")),
    "torch:Tensor.type": on_musa(lambda: x.type("torch.cuda.FloatTensor")),
    "torch:Tensor.cuda": on_musa(lambda: x.cuda(memory_format=torch.contiguous_format)),
    "torch.amp.autocast_mode:autocast.__init__":
        raises(lambda: torch.autocast("cuda"), AttributeError) is False
        and torch.autocast("cuda").device == "musa",
    "torch.distributed:init_process_group": backend_of(backend="cpu:gloo,cuda:nccl")
        == "cpu:gloo,musa:mccl" and backend_of(backend="nccl", _ranks=[0]) == "mccl",
    "torch.distributed:new_group": group_backend(backend="cpu:gloo,cuda:nccl")
        == "cpu:gloo,musa:mccl" and group_backend(backend="nccl", sort_ranks=True) == "mccl",
    "torch.distributed:get_backend": backend_of(backend="nccl") == "nccl",
}
for name in torch_api.TENSOR_DEVICE_METHODS:
    args = {"new_full": (2, 1.0), "new_tensor": ([1.0],), "new_empty_strided": ((2,), (1,))}
    works[f"torch:Tensor.{name}"] = on_musa(
        lambda n=name: getattr(x, n)(*args.get(n, (2,)), device="cuda"))
out = {"works": works}
out["unresolved"] = sorted(n for n in torch_api.CUDA_API if not hasattr(torch.cuda, n))
out["musa_lacks"] = sorted(n for n in torch_api.CUDA_API
                           if not hasattr(torch.musa, {"CUDAGraph": "MUSAGraph"}.get(n, n))
                           and n != "cudart")
out["available"] = torch.cuda.is_available()
out["factories_wrapped"] = sorted(n for n in torch_api.FACTORY_FUNCTIONS if hasattr(torch, n)
                                  and getattr(getattr(torch, n), "__wrapped__", None))
out["factories_on_musa"] = all(on_musa(lambda n=n: getattr(torch, n)(2, device="cuda"))
                               for n in ("empty", "zeros", "ones", "rand", "randn"))
out["submodules"] = {m: sys.modules[m].__name__ for m in
                     ("torch.cuda.random", "torch.cuda.memory", "torch.cuda.nvtx")}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def alone():
    proc = run_python(ALONE, env=musa_env("torchada", MEGATRON_MUSA_PATCH_AUTOACTIVATE="0",
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
