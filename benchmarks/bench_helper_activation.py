"""The first dist_checkpointing save under ``mmp run``, with multiprocessing's helper processes
activating the layer at their first torch or megatron import (as shipped) against at start-up
(the baseline: benchmarks/startup_activation/ first on PYTHONPATH), side by side in one run.

Each launch is ``mmp run`` on 2 CPU ranks (DP2) of the selftest's tiny GPT
(benchmarks/helper_activation_save.py), which saves its weights once with megatron-core's
``dist_checkpointing`` (torch_dist): the first save spawns a Manager on every rank, and its
resource tracker. The save time is the slowest rank's; the launch time is the whole command.
Launches alternate between the two so machine drift hits both.

    python benchmarks/bench_helper_activation.py [--runs 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.machine import describe  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "helper_activation_save.py"
BASELINE = ROOT / "benchmarks" / "startup_activation"
VARIANTS = {"first import (shipped)": None, "start-up (baseline)": BASELINE}


def launch(shim) -> tuple:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.update(MEGATRON_MUSA_PATCH_DEVICE="cpu", OMP_NUM_THREADS="1")
    if shim is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="mmp-bench-helpers-") as out:
        begin = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", "import _megatron_musa_patch_boot as b; b.cli()", "run",
             "--standalone", "--nproc-per-node", "2", str(SCRIPT), out],
            env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - begin
        if proc.returncode != 0:
            raise SystemExit(f"bench_helper_activation: a launch failed:\n{proc.stderr[-3000:]}")
        save = max(json.loads(Path(out, f"rank{r}.json").read_text())["save_s"] for r in (0, 1))
    return save, wall


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    opts = p.parse_args(argv)
    results = {name: {"save": [], "wall": []} for name in VARIANTS}
    for run in range(opts.runs):
        order = list(VARIANTS.items())
        for name, shim in (order if run % 2 == 0 else order[::-1]):
            save, wall = launch(shim)
            results[name]["save"].append(save)
            results[name]["wall"].append(wall)
            print(f"run {run + 1}: {name:24} first save {save:5.2f} s, launch {wall:5.1f} s",
                  flush=True)
    base = {k: statistics.median(v) for k, v in results["start-up (baseline)"].items()}
    print(f"\n{describe()}")
    print(f"medians of {opts.runs} runs (2 CPU ranks, DP2, the first torch_dist save):")
    print(f"{'helpers activate at':26} {'first save':>11} {'vs baseline':>12} {'launch':>8} "
          f"{'vs baseline':>12}")
    for name, got in results.items():
        save, wall = statistics.median(got["save"]), statistics.median(got["wall"])
        print(f"{name:26} {save:9.2f} s {save / base['save']:11.2f}x {wall:6.1f} s "
              f"{wall / base['wall']:11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
