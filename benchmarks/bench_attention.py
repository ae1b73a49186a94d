"""Core attention and MoE expert ops, side by side on one device in one run.

1. Attention: megatron-core's local ``DotProductAttention`` as upstream runs it (unfused:
   baddbmm, masked softmax, bmm) against the same module with ``config.use_flash_attn = True``
   (this layer's SDPA path, forced), forward + backward, causal mask passed as a tensor like
   pretrain_gpt does; "flag runs" is what --use-flash-attn picks there
   (``ops.attention.sdpa_preferred``, set from this table). Time per step and memory: on CPU the bytes the step keeps for backward
   (autograd saved tensors, unique storages); on a GPU the peak allocated memory.
2. Grouped GEMM (``ops.grouped_gemm``): torch's grouped_mm against one matmul per expert,
   forward + backward.
3. MoE permute + unpermute with probs (``ops.moe_permute``) against megatron-core's non-fused
   ``moe_utils.permute/unpermute``, forward + backward.

Settings are interleaved so machine drift hits all alike; the median of the repeats is printed.
On CPU the clock is this thread's CPU time and torch runs one thread (``--threads``), so other
load on a shared machine does not count.

Usage: python benchmarks/bench_attention.py [--seqs 512,1024,2048] [--hidden 1024] [--heads 16]
       [--dtypes fp32,bf16] [--repeats 3] [--skip gmm,permute]
       (MEGATRON_MUSA_PATCH_DEVICE=cuda|musa on a GPU.)
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import megatron_musa_patch  # noqa: E402,F401 - activates before Megatron is imported

import torch  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools/
from tools.machine import describe  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MIB = 2 ** 20


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--seqs", default="512,1024,2048")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    p.add_argument("--skip", default="", help="comma list of: attention, gmm, permute")
    return p.parse_args()


def device_type():
    from megatron_musa_patch import active_session as current

    return current().device.name


def clock():
    return time.thread_time if device_type() == "cpu" else time.perf_counter


def init_single_rank():
    from megatron.core import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)  # the device's backend
    parallel_state.initialize_model_parallel(1, 1)
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(1234)  # upstream forks the RNG tracker for dropout


class SavedBytes:
    """Bytes of the unique storages autograd keeps for backward while active."""

    def __init__(self):
        self.storages = {}

    def __enter__(self):
        def pack(t):
            try:
                storage = t.untyped_storage()
                self.storages[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError):
                pass
            return t

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    @property
    def mib(self):
        return sum(self.storages.values()) / MIB


def run_timed(cases, repeats, warmup=2):
    """cases: name -> callable doing one step; returns name -> (median s, memory MiB)."""
    now, cpu = clock(), device_type() == "cpu"
    times = {name: [] for name in cases}
    memory = {}
    for i in range(warmup + repeats):
        for name, step in cases.items():
            torch.cuda.synchronize()
            if not cpu:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            start = now()
            with SavedBytes() as saved:
                step()
            torch.cuda.synchronize()
            if i >= warmup:
                times[name].append(now() - start)
            memory[name] = saved.mib if cpu else (torch.cuda.max_memory_allocated() - base) / MIB
    return {name: (statistics.median(times[name]), memory[name]) for name in cases}


# ----------------------------------------------------------------------------- attention

def attention_cases(opts, seq, dtype):
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=opts.hidden,
                               num_attention_heads=opts.heads, attention_dropout=0.0,
                               masked_softmax_fusion=False, bf16=dtype == torch.bfloat16,
                               params_dtype=dtype)
    module = DotProductAttention(config, 1, AttnMaskType.causal, "self")
    hn = opts.hidden // opts.heads
    q, k, v = (torch.randn(seq, opts.batch, opts.heads, hn, device="cuda", dtype=dtype,
                           requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 1, seq, seq, dtype=torch.bool, device="cuda").triu(1)
    grad = torch.randn(seq, opts.batch, opts.hidden, device="cuda", dtype=dtype)

    from megatron_musa_patch.features.fused_ops.flash_attention import run_core_attention

    def step(sdpa):
        def run():
            for t in (q, k, v):
                t.grad = None
            # the SDPA case bypasses the per-device choice (ops.attention.sdpa_preferred)
            out = run_core_attention(module, q, k, v, mask) if sdpa else module(q, k, v, mask)
            out.backward(grad)
        return run

    config.use_flash_attn = False
    return {"unfused (upstream)": step(False), "sdpa (--use-flash-attn)": step(True)}


def bench_attention(opts):
    from megatron_musa_patch.lib.ops.attention import sdpa_preferred

    print("\n== core attention, forward + backward (local DotProductAttention) ==")
    what = "saved for backward" if device_type() == "cpu" else "peak allocated"
    print(f"{'dtype':5} {'seq':>5}  {'unfused ms':>10} {'sdpa ms':>9} {'speed-up':>8}  "
          f"{'unfused MiB':>11} {'sdpa MiB':>9}  {'flag runs':>9}  (MiB: {what})")
    for name in opts.dtypes.split(","):
        for seq in (int(s) for s in opts.seqs.split(",")):
            res = run_timed(attention_cases(opts, seq, DTYPES[name]), opts.repeats)
            (t0, m0), (t1, m1) = res["unfused (upstream)"], res["sdpa (--use-flash-attn)"]
            chosen = "sdpa" if sdpa_preferred(device_type(), DTYPES[name], seq, seq) else "unfused"
            print(f"{name:5} {seq:5}  {t0 * 1e3:10.1f} {t1 * 1e3:9.1f} {t0 / t1:7.2f}x  "
                  f"{m0:11.1f} {m1:9.1f}  {chosen:>9}", flush=True)


# ----------------------------------------------------------------------------- grouped GEMM

GMM_SHAPES = [(1024, 256, 512, 4), (2048, 512, 1024, 8), (4096, 1024, 1408, 8)]


def bench_gmm(opts):
    from megatron_musa_patch.lib.ops import grouped_gemm as gg

    print("\n== grouped GEMM, forward + backward: torch grouped_mm vs one matmul per expert ==")
    print(f"{'dtype':5} {'tokens x k x n, experts':>26}  {'loop ms':>8} {'grouped_mm ms':>13} "
          f"{'speed-up':>8}")
    for name in opts.dtypes.split(","):
        dtype = DTYPES[name]
        for tokens, k, n, experts in GMM_SHAPES:
            a = torch.randn(tokens, k, device="cuda", dtype=dtype, requires_grad=True)
            b = torch.randn(experts, k, n, device="cuda", dtype=dtype, requires_grad=True)
            sizes = torch.full((experts,), tokens // experts)
            sizes[0], sizes[1] = 0, 2 * (tokens // experts)  # one idle expert, one busy one

            def step(fn):
                def run():
                    a.grad = b.grad = None
                    fn(a, b, sizes).backward(torch.ones(tokens, n, device="cuda", dtype=dtype))
                return run

            if not gg.grouped_mm_usable(a, b):
                print(f"{name:5} {f'{tokens} x {k} x {n}, {experts}':>26}  grouped_mm unusable")
                continue
            res = run_timed({"loop": step(gg.gmm_loop), "grouped_mm": step(gg.gmm_grouped_mm)},
                            opts.repeats)
            t0, t1 = res["loop"][0], res["grouped_mm"][0]
            print(f"{name:5} {f'{tokens} x {k} x {n}, {experts}':>26}  {t0 * 1e3:8.1f} "
                  f"{t1 * 1e3:13.1f} {t0 / t1:7.2f}x", flush=True)


# ----------------------------------------------------------------------------- permute

PERMUTE_SHAPES = [(4096, 1024, 8, 2), (8192, 2048, 16, 4)]


def bench_permute(opts):
    from megatron.core.transformer.moe import moe_utils

    from megatron_musa_patch.lib.ops import moe_permute as mp

    print("\n== MoE permute + unpermute with probs, forward + backward ==")
    print(f"{'dtype':5} {'tokens x hidden, experts/topk':>30}  {'upstream ms':>11} "
          f"{'ops ms':>7} {'speed-up':>8}")
    for name in opts.dtypes.split(","):
        dtype = DTYPES[name]
        for tokens, hidden, experts, topk in PERMUTE_SHAPES:
            x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, requires_grad=True)
            logits = torch.randn(tokens, experts, device="cuda")
            top = logits.topk(topk, dim=-1)
            routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, top.indices, True)
            probs = torch.zeros_like(logits).scatter(1, top.indices, top.values.softmax(-1))

            def upstream():
                x.grad = None
                perm, _, idx = moe_utils.permute(x, routing_map, num_out_tokens=tokens * topk)
                moe_utils.unpermute(perm * 2, idx, x.shape, probs=probs,
                                    routing_map=routing_map).sum().backward()

            def ours():
                x.grad = None
                perm, _, idx = mp.permute(x, routing_map, num_out_tokens=tokens * topk)
                mp.unpermute(perm * 2, idx, x.shape, probs=probs).sum().backward()

            res = run_timed({"upstream": upstream, "ops": ours}, opts.repeats)
            t0, t1 = res["upstream"][0], res["ops"][0]
            print(f"{name:5} {f'{tokens} x {hidden}, {experts}/{topk}':>30}  {t0 * 1e3:11.1f} "
                  f"{t1 * 1e3:7.1f} {t0 / t1:7.2f}x", flush=True)


def main():
    opts = parse()
    if device_type() == "cpu":
        torch.set_num_threads(opts.threads)
    print(describe())
    print(f"device: {device_type()}, torch threads: {torch.get_num_threads()}, "
          f"repeats: {opts.repeats} (median)")
    skip = set(filter(None, opts.skip.split(",")))
    init_single_rank()
    if "attention" not in skip:
        bench_attention(opts)
    if "gmm" not in skip:
        bench_gmm(opts)
    if "permute" not in skip:
        bench_permute(opts)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
