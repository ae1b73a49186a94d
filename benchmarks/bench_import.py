"""``import megatron.core`` in a fresh process with the layer active, with the
``startup.lazy_compile`` feature (as shipped) against without it (upstream's import,
``MEGATRON_MUSA_PATCH_DISABLE=startup.lazy_compile``), side by side in one run: what every rank, data
worker and checkpoint worker pays before it does anything. Runs alternate between the two so
machine drift hits both; each figure is the median wall time, with the process's CPU time.

    python benchmarks/bench_import.py [--runs 5]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.machine import describe  # noqa: E402

#: what reaches moe/router.py (megatron.training would add the same to both variants)
IMPORT = "import megatron.core"
VARIANTS = {"lazy_compile (shipped)": "", "without it (upstream's import)": "startup.lazy_compile"}


def once(disable: str) -> tuple:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.update(MEGATRON_MUSA_PATCH="1", MEGATRON_MUSA_PATCH_DEVICE="cpu", OMP_NUM_THREADS="1")
    if disable:
        env["MEGATRON_MUSA_PATCH_DISABLE"] = disable
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    begin = time.perf_counter()
    subprocess.run([sys.executable, "-W", "ignore", "-c", IMPORT], env=env, check=True)
    wall = time.perf_counter() - begin
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    opts = parser.parse_args(argv)
    from megatron_musa_patch.upstream import installed
    import torch

    print(describe())
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, megatron-core "
          f"{installed.megatron_core_version()}; {opts.runs} runs each, alternating")
    times = {name: [] for name in VARIANTS}
    for _ in range(opts.runs):
        for name, disable in VARIANTS.items():
            times[name].append(once(disable))
    medians = {name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
               for name, runs in times.items()}
    for name, (wall, cpu) in medians.items():
        print(f"  {name:32s} {wall:6.2f} s wall, {cpu:6.2f} s CPU")
    (shipped, _), (upstream, _) = medians.values()
    print(f"ratio shipped/upstream: {shipped / upstream:.2f}x ({upstream - shipped:+.2f} s a "
          f"process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
