"""torchada alone maps torch (the layer imported for its tables only, AUTOACTIVATE=0), against
the stand-in torch_musa: for each target of device/torchada_coverage.py, whether it does what
Megatron needs there, and which torch.cuda names, factories and module paths are torchada's.
Prints one line ``RESULT<json>``.

Run by tests/device/test_torchada_gaps.py (its ``alone`` fixture)."""

import json
import os
import sys

import torch
import torchada  # maps torch on import
import torch_musa
import torch.distributed as dist
from megatron_musa_patch.device import torch_api  # AUTOACTIVATE=0: tables only

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


def works(x):
    """target -> does torchada alone do what Megatron needs there?"""
    found = {
        "torch:device": [str(torch.device(*a)) for a in (("cuda",), ("cuda:1",), ("cuda", 2))]
                        == ["musa", "musa:1", "musa:2"],
        "torch:Tensor.is_cuda": x.is_cuda is False
                                and isinstance(torch.Tensor.is_cuda, property),
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
        found[f"torch:Tensor.{name}"] = on_musa(
            lambda n=name: getattr(x, n)(*args.get(n, (2,)), device="cuda"))
    return found


def main():
    assert torchada.is_patched() and torch.musa is torch_musa, "torchada maps the stand-in"
    out = {"works": works(torch.ones(2))}
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


if __name__ == "__main__":
    main()
