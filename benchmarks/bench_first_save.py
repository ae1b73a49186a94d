"""The first torch_dist checkpoint save of the stock pretrain_gpt.py, with the feature
``startup.forked_write_queue`` (as shipped: the writer's results manager forked before the process
groups) against without it (upstream's manager, spawned at the first save:
``MEGATRON_MUSA_PATCH_DISABLE=startup.forked_write_queue``), side by side in one run.

Each launch is ``mmp run`` on 2 CPU ranks of the tests' tiny GPT, saving at iterations 2 and 4.
A save's time is Megatron's own, from its "saving checkpoint at iteration" line to its
"successfully saved checkpoint" line; the launch time is the whole command. Launches alternate
between the two so machine drift hits both; each figure is a median.

    MEGATRON_LM_PATH=... python benchmarks/bench_first_save.py [--runs 3]
"""

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.machine import describe  # noqa: E402
from tests.harness.stock import run_stock  # noqa: E402

VARIANTS = {"forked_write_queue (shipped)": "",
            "without it (upstream)": "startup.forked_write_queue"}
STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\]"
SAVING = re.compile(STAMP + r" saving checkpoint at iteration +(\d+)")
SAVED = re.compile(STAMP + r" successfully saved checkpoint from iteration +(\d+)")


def save_seconds(log: str) -> dict:
    """{iteration: seconds its save took}, from Megatron's two lines."""
    begun = {int(i): datetime.fromisoformat(t) for t, i in SAVING.findall(log)}
    return {int(i): (datetime.fromisoformat(t) - begun[int(i)]).total_seconds()
            for t, i in SAVED.findall(log)}


def launch(lm: str, disable: str) -> tuple:
    env = {"MEGATRON_MUSA_PATCH_DISABLE": disable} if disable else {}
    with tempfile.TemporaryDirectory(prefix="mmp-bench-first-save-") as out:
        begin = time.perf_counter()
        _, _, log = run_stock(lm, ["--save", out, "--save-interval", "2"], env=env)
        wall = time.perf_counter() - begin
    saves = save_seconds(log)
    if sorted(saves) != [2, 4]:
        raise SystemExit(f"bench_first_save: expected saves at 2 and 4, got {saves}:\n"
                         f"{log[-3000:]}")
    return saves[2], saves[4], wall


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    opts = p.parse_args(argv)
    lm = os.environ.get("MEGATRON_LM_PATH")
    if not lm:
        p.error("set MEGATRON_LM_PATH to a Megatron-LM checkout of your megatron-core's tag")
    results = {name: [] for name in VARIANTS}
    for run in range(opts.runs):
        order = list(VARIANTS.items())
        for name, disable in (order if run % 2 == 0 else order[::-1]):
            first, second, wall = launch(lm, disable)
            results[name].append((first, second, wall))
            print(f"run {run + 1}: {name:30} first save {first:5.2f} s, second {second:5.2f} s, "
                  f"launch {wall:5.1f} s", flush=True)
    medians = {name: [statistics.median(x[k] for x in got) for k in range(3)]
               for name, got in results.items()}
    base = medians["without it (upstream)"]
    print(f"\n{describe()}")
    import torch
    from megatron_musa_patch.upstream import installed

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, megatron-core "
          f"{installed.megatron_core_version()}; medians of {opts.runs} runs (2 CPU ranks, the "
          f"stock pretrain_gpt.py, torch_dist saves at iterations 2 and 4):")
    print(f"{'':31} {'first save':>11} {'vs upstream':>12} {'second save':>12} {'launch':>8} "
          f"{'vs upstream':>12}")
    for name, (first, second, wall) in medians.items():
        print(f"{name:31} {first:9.2f} s {first / base[0]:11.2f}x {second:10.2f} s "
              f"{wall:6.1f} s {wall / base[2]:11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
