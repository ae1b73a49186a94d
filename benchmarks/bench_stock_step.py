"""Step time of the stock pretrain_gpt.py through the layer: every plugin registered (their
features' flags off) vs the minimum patch set (MEGATRON_MUSA_PATCH_ONLY=none), side by side.

Needs MEGATRON_LM_PATH. Runs alternate between the two settings so machine drift hits both;
the iteration time is Megatron's own "elapsed time per iteration", median over the iterations
after the first two (warm-up) of every run.

Usage: MEGATRON_LM_PATH=... python benchmarks/bench_stock_step.py [--runs 3] [--iters 12]
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools/
from tools.machine import describe  # noqa: E402
from tests.harness.stock import run_stock  # noqa: E402

# big enough that an iteration is compute, small enough for a 2-core machine
MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8",
         "--seq-length", "256", "--max-position-embeddings", "256",
         "--tensor-model-parallel-size", "2", "--normalization", "RMSNorm", "--swiglu",
         "--position-embedding-type", "rope", "--disable-bias-linear"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iters", type=int, default=12)
    opts = parser.parse_args()
    lm = os.environ.get("MEGATRON_LM_PATH")
    if not lm:
        sys.exit("set MEGATRON_LM_PATH to a Megatron-LM checkout of tag core_v0.16.1")
    print(describe())
    settings = {"all plugins": {}, "minimum patch set": {"MEGATRON_MUSA_PATCH_ONLY": "none"}}
    times = {name: [] for name in settings}
    losses = {}
    for _ in range(opts.runs):
        for name, env in settings.items():
            loss, ms, _ = run_stock(lm, MODEL, nproc=2, iters=opts.iters, env=env)
            times[name] += [ms[i] for i in sorted(ms) if i > 2]
            losses[name] = loss
    print(f"\nstock pretrain_gpt.py, TP2 on 2 CPU ranks, {opts.runs} runs x "
          f"{opts.iters - 2} timed iterations each:")
    for name, values in times.items():
        print(f"  {name:18} median {statistics.median(values):8.1f} ms/iter  "
              f"(min {min(values):.1f}, max {max(values):.1f})")
    ratio = statistics.median(times["all plugins"]) / statistics.median(times["minimum patch set"])
    print(f"  ratio all / minimum: {ratio:.3f}")
    print(f"  same losses: {losses['all plugins'] == losses['minimum patch set']}")


if __name__ == "__main__":
    main()
