"""One rank of ``mmp plan --calibrate``, started by ``mmp run`` so that it runs as a training rank
does (the layer active, the device's threads and collective backend): every rank measures at the
same time, so a node's ranks share its memory bandwidth and cores as they will in training.

Measured, with cold operands (more than the caches hold, as a step's ops read them): a linear
layer's matrix products by size (16- and 32-bit), an elementwise add (bytes per second, per
width), a softmax (elements per second), a compiled region (its rate and its call), a small op's
cost (issuing it), all-reduce, all-gather, reduce-scatter and a send/receive by message size
among all ranks, a collective after compute, and one megatron-core layer real against priced.
Rank 0 writes the ``measured`` section to ``MMP_PLAN_CALIBRATE_OUT``.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import sys

import torch
import torch.distributed as dist

from megatron_musa_patch.device.names import CPU


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


#: more than a CPU's last-level cache or a GPU's L2, so that every op reads cold operands, as the
#: ops of a training step do
COLD_BYTES = 256 * 2 ** 20


def _rotating(make, nbytes_each: int):
    """Enough copies of ``make()``'s operands to exceed the caches, handed out in turn."""
    copies = [make() for _ in range(max(2, min(64, COLD_BYTES // max(nbytes_each, 1))))]
    state = {"i": 0}

    def next_one():
        state["i"] = (state["i"] + 1) % len(copies)
        return copies[state["i"]]

    return next_one


def gemm(device, sizes, dtype) -> list:
    """A linear layer's three products (forward, input gradient, weight gradient) of tokens x
    hidden by hidden x 4 hidden, cold: FLOP/s by the product's FLOPs."""
    out = []
    size = torch.tensor([], dtype=dtype).element_size()
    for h in sizes:
        t, f = 2 * h, 4 * h

        def make():
            return (torch.randn(t, h, device=device, dtype=dtype),
                    torch.randn(f, h, device=device, dtype=dtype),
                    torch.randn(t, f, device=device, dtype=dtype))

        operands = _rotating(make, (t * h + f * h + t * f) * size)

        def three():
            x, w, g = operands()
            torch.mm(x, w.t())
            torch.mm(g, w)
            torch.mm(g.t(), x)

        dist.barrier()
        seconds = _timed(three, repeat=10 if h >= 1024 else 30) / 3
        flops = 2.0 * t * h * f
        out.append([flops, flops / seconds])
    return out


def elementwise(device, dtype, elements: int) -> float:
    """Bytes read and written per second by an add of two cold tensors."""
    size = torch.tensor([], dtype=dtype).element_size()
    operands = _rotating(lambda: (torch.randn(elements, device=device, dtype=dtype),
                                  torch.randn(elements, device=device, dtype=dtype)),
                         2 * elements * size)

    def add():
        x, y = operands()
        torch.add(x, y)

    dist.barrier()
    return 3.0 * elements * size / _timed(add, repeat=40)


def math_rate(device, elements: int) -> float:
    """Elements per second of a softmax (exponentials and a reduction), cold, in 32 bits."""
    operands = _rotating(lambda: torch.randn(elements // 1024, 1024, device=device),
                         elements * 4)
    dist.barrier()
    return elements / _timed(lambda: torch.softmax(operands(), dim=-1), repeat=40)


def fused(device, elements: int) -> dict:
    """A compiled region's rate and call cost (``torch.compile`` of an RMSNorm in 16 bits, as
    the layer's fused ops and Megatron's ``jit_fuser`` make them): bytes read and written per
    second, cold; the seconds of a call on a few elements."""
    weight = torch.ones(1024, device=device, dtype=torch.bfloat16)

    @torch.compile(dynamic=False)
    def rms_norm(x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)
        return (y * weight.float()).to(x.dtype)

    operands = _rotating(lambda: torch.randn(elements // 1024, 1024, device=device,
                                             dtype=torch.bfloat16), elements * 2)
    tiny = torch.ones(1, 1024, device=device, dtype=torch.bfloat16)
    dist.barrier()
    seconds = _timed(lambda: rms_norm(operands()), repeat=40)
    dist.barrier()
    call = _timed(lambda: rms_norm(tiny), repeat=200)
    return {"fused_bytes_per_s": {"16": 2.0 * elements * 2 / seconds},
            "fused_overhead_s": call}


def op_overhead(device) -> float:
    a = torch.ones(8, device=device)
    b = torch.ones(8, device=device)

    def many():
        for _ in range(1000):
            torch.add(a, b)

    dist.barrier()
    return _timed(many, repeat=5) / 1000


def megatron_layer(hidden: int, sequence: int, device):
    """One megatron-core GPT layer of the local spec (RMSNorm, SwiGLU, no biases) in bf16, its
    input and causal mask: the framework's own code between the ops, as in training."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1, hidden_size=hidden, ffn_hidden_size=4 * hidden,
        num_attention_heads=max(hidden // 64, 1), bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, gradient_accumulation_fusion=False)
    layer = build_module(get_gpt_layer_local_spec(normalization="RMSNorm"), config=config,
                         layer_number=1)
    x = torch.randn(sequence, 2, hidden, device=device, dtype=torch.bfloat16,
                    requires_grad=True)
    mask = torch.ones(1, 1, sequence, sequence, device=device, dtype=torch.bool).triu(1)
    return layer, x, mask


def layer_step(layer, x, mask) -> None:
    out = layer(hidden_states=x, attention_mask=mask)
    out = out[0] if isinstance(out, tuple) else out
    out.float().sum().backward()


def price_layer(hidden: int, sequence: int) -> list:
    """The layer's step on fake tensors, as ``mmp plan`` runs a rank: its ops' work rows."""
    os.environ.update({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "MEGATRON_MUSA_PATCH_DEVICE": CPU})
    from torch._subclasses.fake_tensor import FakeTensorMode

    from megatron_musa_patch import activation
    from megatron_musa_patch.lib.plan import fake_world
    from megatron_musa_patch.lib.plan.tracker import Tracker

    recorder = fake_world.Recorder()
    with fake_world.applied(recorder):
        activation.activate()
        fake_world.groups_on_fake_backend()
        fake_world.init_fake_world(0, 1)
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(1234)
        tracker = Tracker()
        recorder.tracker = tracker
        with FakeTensorMode(allow_non_fake_inputs=True), tracker:
            layer, x, mask = megatron_layer(hidden, sequence, CPU)
            tracker.work.clear()
            layer_step(layer, x, mask)
    return [[*key, n] for counter in tracker.work.values() for key, n in counter.items()]


def step_efficiency(device, measured: dict, sizes) -> dict:
    """What a step adds to its ops priced one by one from the tables above: a megatron-core
    layer's forward and backward at two sizes, real against priced, solved for a factor on the
    ops' time (allocations, operand layouts) and a cost per op (autograd and the framework's
    Python between ops): real = factor x priced + ops x per_op."""
    import subprocess
    import sys

    from megatron_musa_patch.lib.plan import fit
    from megatron_musa_patch.lib.plan import profile as profiles

    profile = profiles.from_dict(dict(_BASE_FIELDS, measured=measured))
    points = []
    for hidden, sequence in sizes:
        layer, x, mask = megatron_layer(hidden, sequence, device)
        dist.barrier()
        real = _timed(lambda: layer_step(layer, x, mask), repeat=30)
        done = subprocess.run(
            [sys.executable, "-m", "megatron_musa_patch.cli.plan_calibrate_rank",
             "--price-layer", str(hidden), str(sequence)],
            env=dict(os.environ, MEGATRON_MUSA_PATCH_AUTOACTIVATE="0"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
        if done.returncode != 0:
            raise RuntimeError("pricing the layer on fake tensors failed:\n"
                               + done.stderr.decode(errors="replace")[-3000:])
        rows = json.loads(done.stdout.decode().strip().splitlines()[-1])
        priced = sum(n * profile.op_seconds(f, b, w, e, fused=bool(k))
                     for f, b, w, e, k, n in rows)
        points.append((real, priced, sum(row[-1] for row in rows)))
    factor, per_op = fit.factor_and_per_op(points)
    return {"step_efficiency": factor, "framework_op_overhead_s": per_op,
            "calibrated_on": "layer",
            "layers": [{"hidden": h, "sequence": s, "real_s": r, "priced_s": p, "ops": n}
                       for (h, s), (r, p, n) in zip(sizes, points)]}


#: the fields a profile needs to price ops from measured figures alone
_BASE_FIELDS = {
    "name": "calibration", "title": "calibration", "memory_bytes": 0,
    "runtime_reserved_bytes": 0, "allocator_margin": 0.0, "peak_flops": {"32": 1.0},
    "memory_bandwidth": 1.0, "op_overhead_s": 0.0, "gemm_efficiency": [[1.0, 1.0]],
    "memory_efficiency": 1.0, "sources": {},
    "links": {"intra_node": {"bandwidth": 1.0, "latency_s": 0.0},
              "inter_node": {"bandwidth": 1.0, "latency_s": 0.0}},
}


def _extra_bytes(fn, on_cpu: bool) -> int:
    """What ``fn`` allocates beyond what exists when it starts, at most at once."""
    if not on_cpu:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    from megatron_musa_patch.lib.plan.allocator import peak_allocated

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return peak_allocated(prof)


def collective_transient(device, on_cpu: bool) -> dict:
    """Bytes the backend holds while a gather or a reduction to shards runs, per byte of the
    whole tensor (gloo: a flat copy of it; NCCL: none of the caching allocator's)."""
    world = dist.get_world_size()
    if world < 2:
        return {}
    shard = torch.ones(1 << 20, device=device)
    whole = torch.empty(world << 20, device=device)
    whole_bytes = whole.numel() * whole.element_size()
    dist.barrier()
    return {
        "all_gather": round(_extra_bytes(lambda: dist.all_gather_into_tensor(whole, shard),
                                         on_cpu) / whole_bytes, 3),
        "reduce_scatter": round(_extra_bytes(lambda: dist.reduce_scatter_tensor(shard, whole),
                                             on_cpu) / whole_bytes, 3),
    }


def collectives(device, sizes) -> dict:
    """Each collective's time by size among this node's ranks (none on one rank: its
    collectives return at once and say nothing of a link)."""
    world = dist.get_world_size()
    rank = dist.get_rank()
    if world < 2:
        return {}
    out = {"all_reduce": [], "all_gather": [], "reduce_scatter": [], "all_to_all": [],
           "p2p": []}
    for nbytes in sizes:
        n = max(nbytes // 4, 1)
        x = torch.ones(n, device=device)
        big = torch.empty(n * world, device=device)
        # MoE's token exchange: the whole tensor recorded, a 1/world share to each peer
        whole = torch.ones(-(-n // world) * world, device=device)
        exchanged = torch.empty_like(whole)
        dist.barrier()
        out["all_reduce"].append([nbytes, _timed(lambda: dist.all_reduce(x), repeat=5)])
        out["all_gather"].append([nbytes, _timed(lambda: dist.all_gather_into_tensor(big, x),
                                                 repeat=5)])
        out["reduce_scatter"].append([nbytes, _timed(
            lambda: dist.reduce_scatter_tensor(x, big), repeat=5)])
        out["all_to_all"].append([nbytes, _timed(
            lambda: dist.all_to_all_single(exchanged, whole), repeat=5)])
        peer = 1 - rank if rank < 2 else None

        def p2p():
            if peer is None:
                return
            if rank == 0:
                dist.send(x, peer)
            else:
                dist.recv(x, peer)

        out["p2p"].append([nbytes, _timed(p2p, repeat=5)])
    return {k: {"ranks": world, "seconds_by_bytes": v} for k, v in out.items() if v}


def in_step_collectives(device, on_cpu: bool) -> dict:
    """What a collective costs inside a step beyond its table above: after compute its backend
    must wake and its peers arrive (``collective_in_step_s``, added to each); and how much of an
    asynchronous one hides behind the compute issued after it (``collective_overlap``: 1 where
    the backend has its own engines, near 0 where it shares the cores with the compute)."""
    if dist.get_world_size() < 2:
        return {}
    h = 256 if on_cpu else 4096  # a product of about a millisecond (four in a row on the CPU)
    x = torch.randn(2 * h, h, device=device, dtype=torch.bfloat16)
    w = torch.randn(h, 4 * h, device=device, dtype=torch.bfloat16)
    tensor = torch.ones(1 << 17, device=device, dtype=torch.bfloat16)  # 256 KiB

    def compute():
        for _ in range(4 if on_cpu else 1):
            torch.mm(x, w)

    def serial():
        compute()
        dist.all_reduce(tensor)

    def overlapped():
        handle = dist.all_reduce(tensor, async_op=True)
        compute()
        handle.wait()

    figures = {}
    for name, fn in (("alone", lambda: dist.all_reduce(tensor)), ("compute", compute),
                     ("serial", serial), ("overlapped", overlapped)):
        dist.barrier()
        figures[name] = _timed(fn, repeat=60)
    extra = max(figures["serial"] - figures["compute"] - figures["alone"], 0.0)
    hideable = min(figures["alone"] + extra, figures["compute"])
    overlap = (figures["serial"] - figures["overlapped"]) / hideable if hideable else 0.0
    return {"collective_in_step_s": extra, "collective_overlap": min(max(overlap, 0.0), 1.0),
            "collective_in_step_figures_s": figures}


def main() -> None:
    import megatron_musa_patch  # noqa: F401 - the layer, as in a training rank (activates)

    if not dist.is_initialized():
        dist.init_process_group("nccl")  # the layer maps it: gloo on the CPU, mccl on MUSA
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    on_cpu = device.type == CPU or os.environ.get("MEGATRON_MUSA_PATCH_DEVICE") == CPU
    sizes = [64, 128, 256, 512, 1024] if on_cpu else [256, 512, 1024, 2048, 4096, 8192]
    elements = (4 if on_cpu else 64) * 2 ** 20
    measured = {
        "gemm": {"16": gemm(device, sizes, torch.bfloat16),
                 "32": gemm(device, sizes, torch.float32)},
        "elementwise_bytes_per_s": {"16": elementwise(device, torch.bfloat16, elements),
                                    "32": elementwise(device, torch.float32, elements)},
        "math_elements_per_s": math_rate(device, elements),
        "op_overhead_s": op_overhead(device),
        **fused(device, elements),
        "collectives": collectives(device, [2 ** k for k in range(10, 25, 2)]),
        "collective_transient": collective_transient(device, on_cpu),
        **in_step_collectives(device, on_cpu),
        "threads_per_rank": torch.get_num_threads(),
    }
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(1234)
    measured.update(step_efficiency(
        device, measured, [(128, 128), (512, 512)] if on_cpu else [(512, 512), (4096, 2048)]))
    if dist.get_rank() == 0:
        with open(os.environ["MMP_PLAN_CALIBRATE_OUT"], "w", encoding="utf-8") as f:
            json.dump(measured, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--price-layer"]:
        print(json.dumps(price_layer(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        main()
