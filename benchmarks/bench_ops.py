"""The fused ops (megatron_musa_patch.lib.ops) against torch eager and torch.compile, side by side.

For each op -- RMSNorm, LayerNorm, SwiGLU, RoPE, scaled causal softmax, gradient-accumulation
GEMM -- and dtype, on one device in one run: forward and forward+backward time of

* ``ours``: what the op dispatches to on this device (csrc kernels on a GPU that has them, else
  the implementation chosen per device in the op module),
* ``eager``: upstream's unfused torch formula with autograd (what the --no-* flags run),
* ``compile``: ``torch.compile`` of that formula,

with the achieved bandwidth (minimum bytes each pass must move / time) next to the device's
measured copy bandwidth. Implementations are interleaved per repeat so machine drift hits all
alike; on the CPU the clock is this thread's CPU time (torch is set to one thread), so other
load on a shared machine does not count. Ratios are the result; absolute times depend on load.

``--e2e`` adds the step time of the stock pretrain_gpt.py (2 CPU ranks, a Llama-style model) with
upstream's fusion defaults against the run with all --no-* flags (needs MEGATRON_LM_PATH).

Usage: python benchmarks/bench_ops.py [--device cpu|cuda|musa] [--repeats 5] [--tokens 32,4096]
       [--hidden 1024] [--ops norm,swiglu,rope,softmax,grad_accum] [--e2e]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools/
from tools.machine import describe  # noqa: E402

from megatron_musa_patch.lib.ops import grad_accum, norm, rope, softmax, swiglu  # noqa: E402

IMPLS = ("ours", "eager", "compile")
NOISE = 0.05  # ratios within this of 1.0 are ties: the same code timed twice differs this much


def clock(device):
    return time.thread_time if device == "cpu" else time.perf_counter


def sync(device):
    if device != "cpu":
        getattr(torch, device).synchronize()


def copy_bandwidth(device, repeats):
    """GB/s of a device-to-device copy (read + write), the ceiling for memory-bound ops."""
    elements = (64 if device == "cpu" else 512) * 2 ** 20 // 4
    src = torch.randn(elements, device=device)
    dst = torch.empty_like(src)
    now, best = clock(device), float("inf")
    for _ in range(repeats + 1):
        sync(device)
        start = now()
        dst.copy_(src)
        sync(device)
        best = min(best, now() - start)
    return 2 * src.numel() * 4 / best / 1e9


# ----------------------------------------------------------------------------- cases
# each case: name, make() -> inputs (leaves requiring grad), {impl: fn(*inputs) -> output},
# bytes moved forward, bytes moved backward


def norm_cases(device, dtype, tokens, hidden):
    def make():
        x = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
        w = torch.ones(hidden, device=device, dtype=dtype, requires_grad=True)
        b = torch.zeros(hidden, device=device, dtype=dtype, requires_grad=True)
        return x, w, b

    size = tokens * hidden * dtype.itemsize
    rms_eager = lambda x, w, b: F.rms_norm(x, (hidden,), w, 1e-5)  # noqa: E731
    ln_eager = lambda x, w, b: F.layer_norm(x, (hidden,), w, b, 1e-5)  # noqa: E731
    yield ("rms_norm", make, {
        "ours": lambda x, w, b: norm.rms_norm(x, w, 1e-5),
        "eager": rms_eager, "compile": torch.compile(rms_eager, dynamic=False)},
        2 * size, 3 * size)
    yield ("layer_norm", make, {
        "ours": lambda x, w, b: norm.layer_norm(x, w, b, 1e-5),
        "eager": ln_eager, "compile": torch.compile(ln_eager, dynamic=False)},
        2 * size, 3 * size)


def swiglu_cases(device, dtype, tokens, hidden):
    ffn = 2 * hidden

    def make():
        return (torch.randn(tokens, 2 * ffn, device=device, dtype=dtype, requires_grad=True),)

    def eager(x):  # megatron-core's unfused glu: silu(x1) * x2
        a, b = torch.chunk(x, 2, -1)
        return F.silu(a) * b

    size = tokens * ffn * dtype.itemsize
    yield ("swiglu", make, {"ours": lambda x: swiglu.bias_swiglu(x), "eager": eager,
                            "compile": torch.compile(eager, dynamic=False)},
           3 * size, 5 * size)


def rope_cases(device, dtype, tokens, hidden):
    heads, dim = max(1, hidden // 128), 128
    seq, batch = max(1, tokens // 2), 2
    freqs = torch.randn(seq, 1, 1, dim, device=device)

    def make():
        return (torch.randn(seq, batch, heads, dim, device=device, dtype=dtype,
                            requires_grad=True),)

    def eager(t):  # megatron-core's unfused _apply_rotary_pos_emb_bshd
        return rope.rope_reference(t, freqs)

    size = seq * batch * heads * dim * dtype.itemsize
    yield ("rope", make, {"ours": lambda t: rope.apply_rope_bshd(t, freqs), "eager": eager,
                          "compile": torch.compile(eager, dynamic=False)},
           2 * size, 2 * size)


def softmax_cases(device, dtype, tokens, hidden):
    if dtype == torch.float32:
        return  # upstream fuses only fp16/bf16 scores
    seq = min(1024, tokens // 2)
    heads = max(1, hidden // 128)

    def make():
        return (torch.randn(2, heads, seq, seq, device=device, dtype=dtype, requires_grad=True),)

    def eager(x):  # upstream's forward_torch_softmax for causal scores
        return softmax.softmax_reference(x, None, 0.125, causal=True)

    size = 2 * heads * seq * seq * dtype.itemsize
    yield ("causal_softmax", make, {
        "ours": lambda x: softmax.scaled_upper_triang_masked_softmax(x, 0.125),
        "eager": eager, "compile": torch.compile(eager, dynamic=False)},
        2 * size, 3 * size)


def grad_accum_cases(device, dtype, tokens, hidden):
    """Backward only: the weight gradient of a [hidden -> hidden] linear added to main_grad."""
    main = torch.zeros(hidden, hidden, device=device)

    def make():
        return (torch.randn(tokens, hidden, device=device, dtype=dtype),
                torch.randn(tokens, hidden, device=device, dtype=dtype))

    def eager(x, dy):  # unfused: the gradient GEMM in the activation dtype, then main_grad += it
        main.add_(dy.t().matmul(x))
        return main

    def ours(x, dy):
        grad_accum.wgrad_gemm_accum_fp32(x, dy, main)
        return main

    size = 2 * tokens * hidden * dtype.itemsize + 2 * hidden * hidden * 4
    yield ("wgrad_accum", make, {"ours": ours, "eager": eager,
                                 "compile": torch.compile(eager, dynamic=False)}, size, 0)


CASES = {"norm": norm_cases, "swiglu": swiglu_cases, "rope": rope_cases,
         "softmax": softmax_cases, "grad_accum": grad_accum_cases}


# ----------------------------------------------------------------------------- timing


def time_case(device, make, fns, repeats, backward, min_sample_s=2e-3):
    """Median time of one call per implementation. A sample repeats the call enough times to
    last ``min_sample_s`` (small tensors run in tens of microseconds, below the clock's noise)."""
    now = clock(device)
    inputs = make()

    def call(fn):
        for t in inputs:
            t.grad = None
        out = fn(*inputs)
        if backward and out.requires_grad:
            out.backward(torch.ones_like(out))

    calls = {}
    for impl, fn in fns.items():  # two warm-up calls (compilation), then the calibration
        call(fn)
        call(fn)
        sync(device)
        start = now()
        call(fn)
        sync(device)
        calls[impl] = max(1, min(1000, int(min_sample_s / max(now() - start, 1e-7))))
    results = {impl: [] for impl in fns}
    order = list(fns)
    for r in range(repeats):  # the order rotates: no implementation always runs first
        for impl in order[r % len(order):] + order[:r % len(order)]:
            fn = fns[impl]
            sync(device)
            start = now()
            for _ in range(calls[impl]):
                call(fn)
            sync(device)
            results[impl].append((now() - start) / calls[impl])
    return {impl: statistics.median(v) for impl, v in results.items()}


def run_ops(opts):
    device = opts.device
    print(f"device: {device}; copy bandwidth {copy_bandwidth(device, opts.repeats):.1f} GB/s "
          f"(read + write); hidden {opts.hidden}; median of {opts.repeats}; large tensors use: "
          f"norm {norm.rms_norm_impl(device)}/{norm.layer_norm_impl(device)}, swiglu "
          f"{swiglu.swiglu_impl(device)}, rope {rope.rope_impl(device)}, softmax "
          f"{softmax.softmax_impl(device)} (small ones on the CPU: below "
          f"megatron_musa_patch.lib.ops.dispatch.CPU_MIN_NUMEL, unfused)")
    header = f"{'tokens':>7} {'op':<15}{'dtype':<10}{'pass':<9}" + "".join(
        f"{impl + ' ms':>12}{impl + ' GB/s':>13}" for impl in IMPLS) + f"{'eager/ours':>12}"
    print(header)
    slower = []
    for tokens, op, dtype in ((t, op, d) for t in opts.tokens for op in opts.ops.split(",")
                              for d in (torch.float32, torch.bfloat16)):
        for name, make, fns, fwd_bytes, bwd_bytes in CASES[op](device, dtype, tokens,
                                                                opts.hidden):
            passes = [("fwd", False, fwd_bytes)] + (
                [("fwd+bwd", True, fwd_bytes + bwd_bytes)] if bwd_bytes else [])
            for label, backward, nbytes in passes:
                t = time_case(device, make, fns, opts.repeats, backward)
                row = f"{tokens:>7} {name:<15}{str(dtype)[6:]:<10}{label:<9}"
                for impl in IMPLS:
                    row += f"{t[impl] * 1e3:>12.3f}{nbytes / t[impl] / 1e9:>13.2f}"
                ratio = t["eager"] / t["ours"]
                print(row + f"{ratio:>12.2f}", flush=True)
                if ratio < 1 - NOISE:
                    slower.append(f"{name} {str(dtype)[6:]} {label} at {tokens} tokens "
                                  f"({ratio:.2f})")
    print(f"slower than eager by more than {NOISE:.0%} (this machine's run-to-run noise): "
          + (", ".join(slower) if slower else "none"))


# ----------------------------------------------------------------------------- end to end

E2E_MODEL = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "8",
             "--seq-length", "256", "--max-position-embeddings", "256",
             "--tensor-model-parallel-size", "2", "--normalization", "RMSNorm", "--swiglu",
             "--position-embedding-type", "rope", "--disable-bias-linear"]


def run_e2e(opts):
    lm = os.environ.get("MEGATRON_LM_PATH")
    if not lm:
        print("end to end: skipped -- set MEGATRON_LM_PATH to a Megatron-LM checkout of tag "
              "core_v0.16.1")
        return
    from tests.harness import stock as runner
    from tests.features.fused_ops.test_stock import FUSED_TINY

    settings = {"fused defaults": FUSED_TINY, "all --no-* flags": list(runner.TINY)}
    times = {name: [] for name in settings}
    losses = {}
    for run in range(opts.e2e_runs):
        for name, tiny in settings.items():
            saved = runner.TINY
            runner.TINY = tiny
            try:
                loss, ms, _ = runner.run_stock(lm, E2E_MODEL + opts.e2e_extra.split(),
                                               iters=opts.e2e_iters)
            finally:
                runner.TINY = saved
            losses[name] = loss
            times[name] += [ms[i] for i in sorted(ms) if i > 3]  # after compile / warm-up
    print(f"end to end: stock pretrain_gpt.py, 2 CPU ranks, {' '.join(E2E_MODEL)} "
          f"{opts.e2e_extra}; median ms per iteration after iteration 3, {opts.e2e_runs} runs "
          f"alternating")
    for name, values in times.items():
        print(f"  {name:<18} {statistics.median(values):9.1f} ms   losses {losses[name]}")
    fused, plain = (statistics.median(times[n]) for n in settings)
    print(f"  speed-up of the fused defaults: {plain / fused:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", default="4096",
                        help="token counts, comma-separated (e.g. 32,512,4096: small sizes show "
                             "the cut-off to the unfused path)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    parser.add_argument("--ops", default=",".join(CASES))
    parser.add_argument("--e2e", action="store_true", help="also the stock step-time comparison")
    parser.add_argument("--e2e-only", action="store_true")
    parser.add_argument("--e2e-runs", type=int, default=2)
    parser.add_argument("--e2e-iters", type=int, default=10)
    parser.add_argument("--e2e-extra", default="", help="more pretrain_gpt.py flags (e.g. --bf16)")
    opts = parser.parse_args()
    opts.tokens = [int(t) for t in opts.tokens.split(",")]
    if opts.device == "musa":
        import torch_musa  # noqa: F401
    torch.set_num_threads(opts.threads)
    # importing the package activates the layer: on the CPU row "cuda" means the CPU
    opts.device = torch.empty(0, device=opts.device).device.type
    print(describe())
    if not opts.e2e_only:
        run_ops(opts)
    if opts.e2e or opts.e2e_only:
        run_e2e(opts)


if __name__ == "__main__":
    main()
