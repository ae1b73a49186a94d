"""The training-step stall of a checkpoint save, synchronous vs megatron-core's async writer
(``--async-save``), side by side in one run, on CPU ranks through the layer.

The stock pretrain_gpt.py on 2 CPU ranks (DP2, distributed optimizer, ``--ckpt-format
torch_dist``) saves every ``--save-interval`` iterations. The stall is what a save costs the
training loop: Megatron's own ``save-checkpoint`` timer (the slowest rank), for every save but
the first (the first also starts the writer: forked helpers, the persistent async worker). The
async runs add ``--use-persistent-ckpt-worker`` (both releases refuse ``--async-save``
without it) and, where the release has the flag, ``--async-strategy mcore`` (its default,
nvidia-resiliency-ext's writer, does not install on these machines). Runs alternate between the
two so machine drift hits both; the step time is Megatron's "elapsed time per iteration"
(median of the iterations that did not save).

    MEGATRON_LM_PATH=... python benchmarks/bench_async_save.py [--runs 2] [--iters 16]
"""

import argparse
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools/
from tools.machine import describe  # noqa: E402
from tests.harness.stock import run_stock  # noqa: E402

# about 43 M parameters: a save writes ~0.5 GB (fp32 weights and Adam's two moments)
MODEL = ["--num-layers", "6", "--hidden-size", "768", "--num-attention-heads", "12",
         "--seq-length", "128", "--max-position-embeddings", "128",
         "--use-distributed-optimizer", "--ckpt-format", "torch_dist"]
SAVE_TIMER = re.compile(r"save-checkpoint \.+: \(([0-9.]+), ([0-9.]+)\)")


def async_flags(lm_path: str):
    flags = ["--async-save", "--use-persistent-ckpt-worker"]
    arguments = Path(lm_path, "megatron", "training", "arguments.py").read_text()
    if "async_strategy" in arguments:  # from 0.17; the flag is made from a config dataclass
        flags += ["--async-strategy", "mcore"]
    return flags


def one_run(lm_path, extra, iters, interval):
    with tempfile.TemporaryDirectory(prefix="mmp-bench-save-") as ckpt:
        losses, ms, log = run_stock(lm_path, [*MODEL, "--save", ckpt, "--save-interval",
                                              str(interval), *extra], iters=iters, timeout=1800)
    stalls = [float(hi) for _, hi in SAVE_TIMER.findall(log)]
    saved = {i for i in ms if i % interval == 0}
    steps = [ms[i] for i in sorted(ms) if i > 2 and i not in saved and i - 1 not in saved]
    return stalls[1:], steps, losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--iters", type=int, default=16)
    parser.add_argument("--save-interval", type=int, default=4)
    opts = parser.parse_args()
    lm = os.environ.get("MEGATRON_LM_PATH")
    if not lm:
        sys.exit("set MEGATRON_LM_PATH to a Megatron-LM checkout of a supported tag")
    import megatron.core

    print(describe())
    print(f"megatron-core {megatron.core.__version__}, Megatron-LM at {lm}")
    settings = {"sync": [], "async": async_flags(lm)}
    stalls = {name: [] for name in settings}
    steps = {name: [] for name in settings}
    losses = {}
    for _ in range(opts.runs):
        for name, extra in settings.items():
            s, t, loss = one_run(lm, extra, opts.iters, opts.save_interval)
            stalls[name] += s
            steps[name] += t
            losses[name] = loss
    print(f"\nstock pretrain_gpt.py on 2 CPU ranks, {' '.join(MODEL)}; a save every "
          f"{opts.save_interval} of {opts.iters} iterations, {opts.runs} runs each:")
    for name in settings:
        print(f"  {name:5}  stall per save median {statistics.median(stalls[name]):8.1f} ms "
              f"(n={len(stalls[name])}, min {min(stalls[name]):.1f}, max "
              f"{max(stalls[name]):.1f})   step median {statistics.median(steps[name]):7.1f} ms")
    ratio = statistics.median(stalls["async"]) / statistics.median(stalls["sync"])
    print(f"  stall ratio async / sync: {ratio:.3f}")
    print(f"  step ratio async / sync (iterations that did not save): "
          f"{statistics.median(steps['async']) / statistics.median(steps['sync']):.3f}")
    print(f"  same losses: {losses['sync'] == losses['async']}")


if __name__ == "__main__":
    main()
