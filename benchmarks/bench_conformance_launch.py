"""How much of a conformance file's time is its ranks' start-up? The same upstream test files run
through tools/conformance's runner, side by side in one run: ranks started by torchrun
(the reference: N fresh interpreters) against ranks forked from one process that has imported
megatron-core (``--launcher fork``), alternating so that machine drift hits both. Prints wall
and CPU seconds per file and launcher, the ratios, and whether every test had the same outcome
under both (the fork launcher is only worth having if it changes nothing but the time).

    python benchmarks/bench_conformance_launch.py --lm-path /path/Megatron-LM-core_v0.17.1 \\
        --python .venv317/bin/python --runs 2 \\
        tests/unit_tests/tensor_parallel/test_mappings.py tests/unit_tests/test_utils.py
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools/
from tools.conformance import render, runner, tables  # noqa: E402
from tools.machine import describe  # noqa: E402


def timed_run(python: str, lm_path: Path, test_file: str, nproc: int, launcher: str) -> dict:
    """One run of the file: the runner's result with the CPU seconds of everything it started."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = runner.run_file(python, lm_path, test_file, nproc, timeout=900.0,
                                  env_extra={}, launcher=launcher)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def outcomes(result: dict) -> dict:
    return {nodeid: test["outcome"] for nodeid, test in result["tests"].items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="test files (paths inside the checkout)")
    parser.add_argument("--lm-path", type=Path, default=os.environ.get("MEGATRON_LM_PATH"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2, help="runs per file and launcher")
    args = parser.parse_args(argv)
    if not args.lm_path or not (Path(args.lm_path) / "tests" / "unit_tests").is_dir():
        parser.error(f"--lm-path {args.lm_path}: not a Megatron-LM checkout with tests/unit_tests")
    lm_path = Path(args.lm_path).resolve()
    python = os.path.abspath(args.python) if os.sep in args.python else args.python
    release = render.describe_release(python, lm_path)
    print(f"bench_conformance_launch: megatron-core {release['megatron_core']}, {args.nproc} "
          f"ranks; {describe(release['python'], release['torch'])}", flush=True)
    same_everywhere = True
    wall_ratios, cpu_ratios = [], []
    for test_file in args.files:
        runs = {launcher: [] for launcher in tables.LAUNCHERS}
        for _ in range(args.runs):
            for launcher in tables.LAUNCHERS:
                runs[launcher].append(timed_run(python, lm_path, test_file, args.nproc,
                                                launcher))
        reference = outcomes(runs["torchrun"][0])
        same = all(outcomes(r) == reference for rs in runs.values() for r in rs)
        same_everywhere &= same
        wall = {k: statistics.median(r["seconds"] for r in rs) for k, rs in runs.items()}
        cpu = {k: statistics.median(r["cpu"] for r in rs) for k, rs in runs.items()}
        wall_ratios.append(wall["fork"] / wall["torchrun"])
        cpu_ratios.append(cpu["fork"] / cpu["torchrun"])
        print(f"{test_file}: {len(reference)} tests, same outcomes: {same}; median of "
              f"{args.runs}: torchrun {wall['torchrun']:.1f} s wall / {cpu['torchrun']:.0f} s "
              f"CPU, fork {wall['fork']:.1f} s / {cpu['fork']:.0f} s; fork/torchrun "
              f"{wall_ratios[-1]:.2f} wall, {cpu_ratios[-1]:.2f} CPU", flush=True)
    print(f"bench_conformance_launch: fork/torchrun over {len(args.files)} files: wall "
          f"{statistics.geometric_mean(wall_ratios):.2f}, CPU "
          f"{statistics.geometric_mean(cpu_ratios):.2f} (geometric means); every test the same "
          f"outcome under both: {same_everywhere}")
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    sys.exit(main())
