"""Fine-grained recompute, side by side: bytes held for backward per layer and step time.

Settings: none, upstream full recompute, upstream selective (core_attn), --recompute-variance,
--attn-recompute, --mlp-recompute, both; each recompute flag with and without
--recompute-variance. A block of transformer layers (megatron-core local spec, fp32) at a
realistic shape scaled to the machine (default: Llama-7B's layer -- hidden 4096, 32 heads, seq
4096, SwiGLU ffn 11008 -- divided by 4), forward + backward of the block, settings interleaved
so machine drift hits all of them alike.

Derived: the share of full recompute's saving that --attn-recompute --mlp-recompute reaches
(goal >= 80%), and the share of the recompute time (attn+mlp vs none) that --recompute-variance
removes, next to the share its skipped operators (linear_proj, linear_fc2) take of the
recomputed forward, timed on their own.

Usage: python benchmarks/bench_recompute.py [--scale 4] [--repeats 5] [--layers 2]
(MEGATRON_MUSA_PATCH_DEVICE=cuda on a GPU also reports peak device memory.)
"""

import argparse
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

from tests.features.recompute import recompute_layer as rl  # noqa: E402

ORDER = ["none", "upstream full", "upstream selective core_attn", "variance", "attn",
         "attn+variance", "mlp", "mlp+variance", "attn+mlp", "attn+mlp+variance"]
MIB = 2 ** 20


def clock(device):
    """On CPU: this thread's CPU time (torch runs single-threaded here, and the autograd engine
    runs CPU backward on the calling thread), so other load on a shared machine does not count;
    on a GPU: wall-clock around synchronisation."""
    return time.thread_time if device == "cpu" else time.perf_counter


def timed_steps(blocks, shape, repeats, now, warmup=1):
    """setting -> list of seconds per forward+backward, settings interleaved."""
    x, mask, rope = rl.inputs(shape)
    grad = torch.ones_like(x)
    times = {name: [] for name in blocks}
    for i in range(warmup + repeats):
        for name, block in blocks.items():
            torch.cuda.synchronize()
            start = now()
            out = block(x, mask, rotary_pos_emb=rope)
            out.backward(grad)
            torch.cuda.synchronize()
            if i >= warmup:
                times[name].append(now() - start)
            block.zero_grad(set_to_none=True)
            x.grad = None
    return times


def peak_memory(block, shape):
    x, mask, rope = rl.inputs(shape)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    block(x, mask, rotary_pos_emb=rope).backward(torch.ones_like(x))
    torch.cuda.synchronize()
    block.zero_grad(set_to_none=True)
    return torch.cuda.max_memory_allocated() - base


def skipped_share(block, shape, repeats, now):
    """Seconds of the forward of linear_proj + linear_fc2 (what variance skips) against the
    forward of everything --attn-recompute --mlp-recompute recomputes, for one layer, measured
    by timing the modules' forward calls inside a plain forward."""
    layer = block.layers[0]
    spent = {"skipped": 0.0, "layer": 0.0}
    marks = {}

    def pre(key):
        def hook(module, args):
            torch.cuda.synchronize()
            marks[key] = now()
        return hook

    def post(key):
        def hook(module, args, output):
            torch.cuda.synchronize()
            spent[key] += now() - marks[key]
        return hook

    handles = [layer.register_forward_pre_hook(pre("layer")),
               layer.register_forward_hook(post("layer"))]
    for linear in (layer.self_attention.linear_proj, layer.mlp.linear_fc2):
        handles += [linear.register_forward_pre_hook(pre("skipped")),
                    linear.register_forward_hook(post("skipped"))]
    x, mask, rope = rl.inputs(shape)
    with torch.no_grad():
        layer(x, attention_mask=mask, rotary_pos_emb=rope)  # warm-up
        spent.update(skipped=0.0, layer=0.0)
        for _ in range(repeats):
            layer(x, attention_mask=mask, rotary_pos_emb=rope)
    for handle in handles:
        handle.remove()
    return spent["skipped"] / spent["layer"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=4, help="divide Llama-7B's layer by this")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads on CPU (default 1: the step time is that thread's "
                             "CPU time)")
    opts = parser.parse_args()
    rl.init_single_rank()
    s = opts.scale
    shape = rl.Shape(hidden=4096 // s, heads=32 // s, query_groups=32 // s, ffn=11008 // s,
                     seq=4096 // s, batch=opts.batch, layers=opts.layers, swiglu=True)
    device = torch.empty(0, device="cuda").device.type
    if device == "cpu":
        torch.set_num_threads(opts.threads)
    now = clock(device)
    print(describe())
    print(f"device: {device}, torch threads: {torch.get_num_threads()}, step time: "
          + ("CPU time of the training thread" if device == "cpu" and opts.threads == 1
             else "wall-clock"))
    if device == "cpu" and opts.threads != 1:
        now = time.perf_counter
    print(f"shape: {shape.describe()} (Llama-7B's layer / {s})\n")

    held = {name: rl.block_bytes(shape, name) for name in ORDER}
    blocks = {name: rl.build(shape, name).train() for name in ORDER}
    times = timed_steps(blocks, shape, opts.repeats, now)
    peaks = ({name: peak_memory(b, shape) for name, b in blocks.items()}
             if device != "cpu" else None)
    best = {name: min(v) for name, v in times.items()}
    med = {name: statistics.median(v) for name, v in times.items()}

    none_b, full_b = held["none"]["per_layer"], held["upstream full"]["per_layer"]
    print(f"{'setting':30} {'held/layer':>11} {'vs none':>8} {'attn blk':>9} {'mlp blk':>9} "
          f"{'step (s)':>9} {'vs none':>8} {'median':>8}" + ("  peak MiB" if peaks else ""))
    for name in ORDER:
        h = held[name]
        line = (f"{name:30} {h['per_layer'] / MIB:9.1f}Mi {h['per_layer'] / none_b:8.1%} "
                f"{h['attention'] / MIB:7.1f}Mi {h['mlp'] / MIB:7.1f}Mi "
                f"{best[name]:9.3f} {best[name] / best['none']:8.3f} {med[name]:8.3f}")
        if peaks:
            line += f"  {peaks[name] / MIB:8.1f}"
        print(line)
    print(f"(step: fastest of {opts.repeats} forward+backward of the {shape.layers}-layer block, "
          f"median beside it; attn blk / mlp blk: bytes held by the first layer's attention and "
          f"MLP blocks run on their own -- upstream full recompute acts per layer, so its "
          f"per-block numbers are those of none)")

    full_saves = none_b - full_b
    print("\nbytes saved per layer, as a share of what upstream full recompute saves:")
    for name in ("upstream selective core_attn", "variance", "attn", "mlp", "attn+mlp",
                 "attn+mlp+variance"):
        print(f"  {name:30} {(none_b - held[name]['per_layer']) / full_saves:6.1%}")

    print("\nrecompute time (setting - none) removed by --recompute-variance, from the fastest "
          "steps (medians in brackets):")
    for base in ("attn", "mlp", "attn+mlp"):
        rec = best[base] - best["none"]
        removed = best[base] - best[f"{base}+variance"]
        rec_med = med[base] - med["none"]
        removed_med = med[base] - med[f"{base}+variance"]
        print(f"  {base:9} recompute {rec * 1e3:8.1f} ms, variance removes {removed * 1e3:8.1f} ms"
              f" = {removed / rec:6.1%}   [{removed_med * 1e3:.1f} of {rec_med * 1e3:.1f} ms = "
              f"{removed_med / rec_med:.1%}]")
    share = skipped_share(blocks["none"], shape, opts.repeats, now)
    print(f"  linear_proj + linear_fc2 take {share:.1%} of a layer's forward (timed on their "
          f"own): the share variance can remove from attn+mlp's recompute")


if __name__ == "__main__":
    main()
