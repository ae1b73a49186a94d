"""The csrc kernels against torch eager and torch.compile on one GPU, in one run.

For each op (forward and backward): time per call, achieved bandwidth (the bytes the op must
move at least: inputs read once, outputs written once) and that bandwidth as a share of the
device's measured copy bandwidth (a large ``dst.copy_(src)``), next to torch eager, torch.compile,
torch's native op where it has one, and Liger-Kernel's triton ops where ``liger_kernel`` imports
(RMSNorm, SiLU-mul; ``benchmarks/e2e_gpu_pack.sh`` packs its wheel). Goal (issue 6): norm, SwiGLU and
RoPE kernels at >= 80% of copy bandwidth, and never slower than eager.

    python benchmarks/bench_kernels.py [--device cuda|musa] [--dtype bf16] [--no-compile]

Needs a CUDA or MUSA device; exits 2 with the reason otherwise. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("MEGATRON_MUSA_PATCH_AUTOACTIVATE", "0")  # measure the ops, not the layer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/
from tools.machine import describe  # noqa: E402
from megatron_musa_patch.device.select import builtin_select  # noqa: E402
from megatron_musa_patch.lib.ops import kernels  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def device_type(requested):
    """The requested accelerator, else the one the layer's auto choice finds (None: CPU)."""
    if requested:
        return requested
    found = builtin_select("auto")
    return None if found == "cpu" else found


class Timer:
    def __init__(self, dev, iters):
        self.mod = getattr(torch, dev)
        self.iters = iters

    def __call__(self, fn):
        for _ in range(3):
            fn()
        self.mod.synchronize()
        start, end = self.mod.Event(enable_timing=True), self.mod.Event(enable_timing=True)
        start.record()
        for _ in range(self.iters):
            fn()
        end.record()
        self.mod.synchronize()
        return start.elapsed_time(end) / self.iters  # ms


def copy_bandwidth(dev, timer):
    src = torch.empty(512 * 2**20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * src.numel() / ms / 1e6  # GB/s


def nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


# ---- references (what upstream runs without the fusions) -----------------------------------------


def rms_eager(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def ln_eager(x, w, b, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def swiglu_eager(x):
    a, b = torch.chunk(x, 2, -1)
    return F.silu(a) * b


def _rotate_half(x):
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_eager(t, freqs):
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    return t * cos + _rotate_half(t) * sin


def permute_eager(tokens, routing_map):
    try:
        from megatron.core.transformer.moe.moe_utils import permute

        # num_out_tokens: required from 0.17, which also returns pad offsets and counts
        return permute(tokens, routing_map, num_out_tokens=int(routing_map.sum()))[:3]
    except ImportError:
        num_tokens, num_experts = routing_map.shape
        mask_t = routing_map.T.contiguous()
        idx = torch.arange(num_tokens, device=tokens.device).expand(num_experts, -1).masked_select(mask_t)
        return tokens.index_select(0, idx), None, idx


def unpermute_eager(permuted, idx, shape):
    out = torch.zeros(shape, dtype=permuted.dtype, device=permuted.device)
    return out.scatter_add_(0, idx.unsqueeze(1).expand(-1, shape[1]), permuted)


def liger():
    """Liger-Kernel's triton ops (RMSNorm, SiLU-mul), or None where it does not import."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except Exception:  # noqa: BLE001 - optional column: not installed, or no triton
        return None

    def rms(x, w, eps=1e-5):  # in_place=False: the timed backward reuses its gradient
        return LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)

    def swiglu(x):
        a, b = torch.chunk(x, 2, -1)
        return LigerSiLUMulFunction.apply(a, b)

    return {"rms": rms, "swiglu": swiglu}


# ---- cases ------------------------------------------------------------------------------------------


def backward_of(fn, inputs, grad, n_grad=None):
    """A callable timing only the backward of fn(*inputs) with respect to the first n_grad
    inputs (all by default); the graph is built once and retained."""
    n_grad = len(inputs) if n_grad is None else n_grad
    leaves = [t.detach().requires_grad_(i < n_grad) for i, t in enumerate(inputs)]
    out = fn(*leaves)
    return lambda: torch.autograd.grad(out, leaves[:n_grad], grad, retain_graph=True)


def cases(dev, dtype, scale=1):
    """(name, shape, bytes moved, make(kernels) -> fn, eager fn, (fn, args) to compile, native fn,
    Liger-Kernel fn or None)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    lk = liger()

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dev, dtype)

    rows, hidden = 8192 // scale, 8192
    x, w, b, dy = rnd(rows, hidden), rnd(hidden), rnd(hidden), rnd(rows, hidden)
    yield ("rms_norm fwd", f"[{rows}, {hidden}]", nbytes(x, x, w),
           lambda k: (lambda: k["rms_norm_fwd"](x, w, 1e-5)), lambda: rms_eager(x, w), (rms_eager, (x, w)),
           lambda: F.rms_norm(x, (hidden,), w, 1e-5), lk and (lambda: lk["rms"](x, w)))
    _, rstd = kernels.get("rms_norm_fwd", dev)(x, w, 1e-5)
    yield ("rms_norm bwd", f"[{rows}, {hidden}]", nbytes(dy, x, x, w, w),
           lambda k: (lambda: k["rms_norm_bwd"](dy, x, w, rstd)), backward_of(rms_eager, (x, w), dy), None,
           backward_of(lambda a, c: F.rms_norm(a, (hidden,), c, 1e-5), (x, w), dy),
           lk and backward_of(lk["rms"], (x, w), dy))
    yield ("layer_norm fwd", f"[{rows}, {hidden}]", nbytes(x, x, w, b),
           lambda k: (lambda: k["layer_norm_fwd"](x, w, b, 1e-5)), lambda: ln_eager(x, w, b), (ln_eager, (x, w, b)),
           None, None)
    _, mean, rstd2 = kernels.get("layer_norm_fwd", dev)(x, w, b, 1e-5)
    yield ("layer_norm bwd", f"[{rows}, {hidden}]", nbytes(dy, x, x, w, w, b),
           lambda k: (lambda: k["layer_norm_bwd"](dy, x, w, mean, rstd2)), backward_of(ln_eager, (x, w, b), dy),
           None, None, None)

    tok, ffn = 8192 // scale, 14336
    xs, gs = rnd(tok, 2 * ffn), rnd(tok, ffn)
    yield ("swiglu fwd", f"[{tok}, 2x{ffn}]", nbytes(xs, gs), lambda k: (lambda: k["swiglu_fwd"](xs)),
           lambda: swiglu_eager(xs), (swiglu_eager, (xs,)), None, lk and (lambda: lk["swiglu"](xs)))
    yield ("swiglu bwd", f"[{tok}, 2x{ffn}]", nbytes(gs, xs, xs), lambda k: (lambda: k["swiglu_bwd"](gs, xs)),
           backward_of(swiglu_eager, (xs,), gs), None, None, lk and backward_of(lk["swiglu"], (xs,), gs))

    s, bb, h, d = 4096 // scale, 2, 32, 128
    t, dout = rnd(s, bb, h, d), rnd(s, bb, h, d)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    f = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    freqs = torch.cat((f, f), -1)[:, None, None, :].to(dev)
    yield ("rope fwd", f"[{s}, {bb}, {h}, {d}]", nbytes(t, t), lambda k: (lambda: k["rope_fwd"](t, freqs, False)),
           lambda: rope_eager(t, freqs), (rope_eager, (t, freqs)), None, None)
    yield ("rope bwd", f"[{s}, {bb}, {h}, {d}]", nbytes(dout, dout),
           lambda k: (lambda: k["rope_bwd"](dout, freqs, False)), backward_of(rope_eager, (t, freqs), dout, n_grad=1), None,
           None, None)

    ntok, hid, experts, topk = 16384 // scale, 4096, 64, 8
    tokens = rnd(ntok, hid)
    scores = torch.rand(ntok, experts, generator=g)
    routing_map = torch.zeros(ntok, experts, dtype=torch.bool).scatter_(1, scores.topk(topk, -1).indices, True)
    routing_map = routing_map.to(dev)
    permuted, _, idx = permute_eager(tokens, routing_map)
    yield ("permute", f"[{ntok}, {hid}] E{experts} top{topk}", 2 * nbytes(permuted),
           lambda k: (lambda: k["permute"](tokens, routing_map, None, idx.numel())),
           lambda: permute_eager(tokens, routing_map), None, None, None)
    yield ("unpermute", f"[{ntok}, {hid}] E{experts} top{topk}", nbytes(permuted, tokens),
           lambda k: (lambda: k["unpermute"](permuted, idx, (ntok, hid))),
           lambda: unpermute_eager(permuted, idx, (ntok, hid)), None, None, None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "musa"])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    parser.add_argument("--json", help="also write the rows as JSON here")
    opts = parser.parse_args(argv)
    dev = device_type(opts.device)
    if dev is None:
        print("bench_kernels: needs a CUDA or MUSA device", file=sys.stderr)
        return 2
    print(describe())
    print(f"device: {getattr(torch, dev).get_device_name()}  dtype: {opts.dtype}")
    t0 = time.time()
    if not kernels.available("rms_norm_fwd", dev):
        print(f"bench_kernels: kernels unavailable: {kernels.status(dev)}", file=sys.stderr)
        return 1
    print(f"kernels: {kernels.status(dev)} (load/build {time.time() - t0:.1f}s)")
    k = {op: kernels.get(op, dev) for op in kernels.OPS}
    timer = Timer(dev, opts.iters)
    copy = copy_bandwidth(dev, timer)
    print(f"device copy bandwidth: {copy:.0f} GB/s\n")

    header = (f"{'op':16} {'shape':28} {'kernel ms':>9} {'GB/s':>7} {'%copy':>6} {'eager ms':>9} "
              f"{'compile ms':>10} {'native ms':>9} {'liger ms':>9} {'vs eager':>8}")
    print(header)
    print("-" * len(header))
    rows = []
    for name, shape, moved, make, eager, to_compile, native, lk in cases(dev, DTYPES[opts.dtype]):
        ms = timer(make(k))
        eager_ms = timer(eager)
        compile_ms = None
        if to_compile is not None and not opts.no_compile:
            fn, args = to_compile
            try:
                compiled = torch.compile(fn)
                compile_ms = timer(lambda: compiled(*args))
            except Exception as exc:  # noqa: BLE001 - reported in the table
                print(f"  ({name}: torch.compile failed: {type(exc).__name__})")
        native_ms = timer(native) if native is not None else None
        liger_ms = timer(lk) if lk is not None else None
        gbs = moved / ms / 1e6
        row = dict(op=name, shape=shape, kernel_ms=ms, gbps=gbs, pct_copy=100 * gbs / copy, eager_ms=eager_ms,
                   compile_ms=compile_ms, native_ms=native_ms, liger_ms=liger_ms,
                   speedup_vs_eager=eager_ms / ms)
        rows.append(row)

        def fmt(v):
            return f"{v:.3f}" if v is not None else "-"

        print(f"{name:16} {shape:28} {ms:9.3f} {gbs:7.0f} {row['pct_copy']:5.0f}% {eager_ms:9.3f} "
              f"{fmt(compile_ms):>10} {fmt(native_ms):>9} {fmt(liger_ms):>9} "
              f"{row['speedup_vs_eager']:7.2f}x")
    print(f"\n(bandwidth = minimal bytes moved / kernel time; copy = {copy:.0f} GB/s; "
          f"total {time.time() - t0:.0f}s)")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(dict(copy_gbps=copy, device=dev, dtype=opts.dtype, rows=rows), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
