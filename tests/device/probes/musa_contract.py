"""The MUSA row's contract against the stand-in torch_musa (tests/fixtures/fake_musa on
PYTHONPATH, the mapping from the environment): which torch.musa calls each CUDA site of the
stock path reached, or the first line of its error. Prints one line ``RESULT<json>``.

Run by tests/device/test_musa.py (its ``contract`` fixture, once per mapping)."""

import json

import torch
from megatron_musa_patch import active_session as current  # activates the layer (after torch)
import torch_musa
import torch.distributed as dist
from megatron_musa_patch.base.errors import UnsupportedOnDeviceError

calls = torch_musa.CALLS


def reached(fn):
    # what a site reached: the torch.musa calls it made, or the first line of its error
    before = len(calls)
    try:
        fn()
        return {"calls": calls[before:]}
    except Exception as exc:
        return {"calls": calls[before:], "error": f"{type(exc).__name__}: "
                + (str(exc).splitlines() or [""])[0][:160]}


def api(out):
    out["api_is_musa"] = all(getattr(torch.cuda, n) is getattr(torch.musa, n) for n in (
        "current_device", "set_device", "Stream", "Event", "synchronize", "get_rng_state",
        "set_rng_state", "manual_seed", "memory_allocated", "empty_cache", "current_stream"))
    out["available"] = torch.cuda.is_available()
    out["graph_alias"] = torch.cuda.CUDAGraph is torch.musa.MUSAGraph
    try:
        torch.cuda.ExternalStream(0)
    except UnsupportedOnDeviceError as exc:
        out["missing_api"] = str(exc)
    torch.cuda.set_device(3)
    out["current"] = torch.cuda.current_device()
    out["devices"] = [str(torch.device("cuda")), str(torch.device("cuda:1")),
                      str(torch.device("cuda", 2)), str(torch.device(0)),
                      str(current().device.translate(5))]


def sites(x):
    return {
        "torch.empty(device='cuda')": lambda: torch.empty(2, device="cuda"),
        ".cuda()": lambda: x.cuda(),
        ".cuda(memory_format=)": lambda: x.cuda(memory_format=torch.contiguous_format),
        ".to('cuda')": lambda: x.to("cuda"),
        ".to(0)": lambda: x.to(0),
        "Module.cuda()": lambda: torch.nn.Linear(2, 2).cuda(),
        "new_empty(device='cuda')": lambda: x.new_empty(2, device="cuda"),
        "Generator(device='cuda')": lambda: torch.Generator(device="cuda"),
        "Generator(device=0)": lambda: torch.Generator(device=0),
        "type('torch.cuda.FloatTensor')": lambda: x.type("torch.cuda.FloatTensor"),
        "random.get_rng_state": lambda: torch.cuda.random.get_rng_state(),
        "import torch.cuda.random": lambda: __import__("torch.cuda.random").cuda.random
            .get_rng_state(),
        "memory_allocated": lambda: torch.cuda.memory_allocated(),
        "import torch.cuda.memory": lambda: __import__("torch.cuda.memory").cuda.memory
            .memory_allocated(),
        "streams": lambda: (torch.cuda.Stream(), torch.cuda.Event(),
                            torch.cuda.current_stream()),
    }


def megatron_sites(out):
    # megatron is imported only here, after the torch sites, as in a user's script
    import megatron.core.jit as jit

    fn = lambda x: x  # noqa: E731
    out["jit_eager"] = jit.jit_fuser(fn) is fn
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()

    def fork():
        tracker.add("model-parallel-rng", 1234)
        with tracker.fork("model-parallel-rng"):
            pass

    out["rng_tracker"] = reached(fork)


def collectives(out):
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    out["backend_seen_by_megatron"] = dist.get_backend()
    out["compound_group"] = dist.get_backend(dist.new_group([0], backend="cpu:gloo,cuda:nccl"))
    dist.destroy_process_group()


def main():
    out = {"device": current().device.name, "adapter": current().torch_mapping.adapter}
    api(out)
    x = torch.ones(2)
    out["sites"] = {name: reached(fn) for name, fn in sites(x).items()}
    out["autocast"] = [torch.autocast("cuda", dtype=torch.bfloat16).device,
                       torch.amp.autocast("cuda").device]
    out["cpu_tensor"] = [x.is_cuda, x.type(), torch.Tensor.is_cuda.fget(x)]
    megatron_sites(out)
    collectives(out)
    out["calls"] = calls
    print("RESULT" + json.dumps(out))


if __name__ == "__main__":
    main()
