"""Does the layer add to a slow upstream test file's time? One selection of Megatron-LM's unit
tests on N CPU ranks, side by side in one run: every plugin (as the conformance runner runs
it) against a minimum the tests still pass with (``MEGATRON_MUSA_PATCH_ONLY``: the required
features, which make CPU ranks work at all, plus the ones named), alternating so that machine
drift hits both. Prints wall and CPU seconds (all ranks and what they started, so that other
load on the machine barely moves it), the tests' outcome per setting, and the ratios.

With ``--profile`` (needs py-spy on PATH) one more run of every plugin is sampled, and the CPU
samples inside the test bodies are split by what the test called, with the share spent in the
layer's own code (the innermost frame in ``megatron_musa_patch``) and under it (a layer frame
anywhere on the stack: wrappers around upstream functions, so upstream's work counts too).

    python benchmarks/bench_conformance_file.py --lm-path /path/Megatron-LM-core_v0.16.1 \\
        --python .venv/bin/python --minimum upstream_fixes,fused_ops.norm,moe_fusion \\
        tests/unit_tests/dist_checkpointing/test_optimizer.py \\
        -k "test_chained_optimizer_resharding and exp0" --runs 3 --profile
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE.parent / "tools" / "conformance" / "ranks" / "conformance_worker.py"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools/
from tools.machine import describe  # noqa: E402


def run_once(python: str, lm_path: Path, test_file: str, kexpr: str, nproc: int, env_extra: dict,
             profile_to: Path | None = None) -> dict:
    """One torchrun of the selection: wall and CPU seconds, and pytest's closing line."""
    with tempfile.TemporaryDirectory(prefix="mmp-bench-conformance-") as out:
        env = {**os.environ, "MEGATRON_MUSA_PATCH": "1", "MEGATRON_LM_PATH": str(lm_path),
               "MMP_CONFORMANCE_OUT": out, "OMP_NUM_THREADS": "1", **env_extra}
        env.setdefault("MEGATRON_MUSA_PATCH_DEVICE", "cpu")
        command = [python, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={nproc}", str(WORKER), test_file,
                   *(["-k", kexpr] if kexpr else [])]
        if profile_to is not None:  # 10 Hz: more falls behind on 2 cores shared by N ranks
            command = ["py-spy", "record", "--subprocesses", "--rate", "10", "--format", "raw",
                       "--output", str(profile_to), "--", *command]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        begin = time.monotonic()
        proc = subprocess.run(command, cwd=str(lm_path), env=env, capture_output=True,
                              text=True)
        wall = time.monotonic() - begin
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    closing = [line for line in proc.stdout.splitlines()
               if re.search(r"\d+ (passed|failed|error)", line)]
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) +
            (after.ru_stime - before.ru_stime), "returncode": proc.returncode,
            "outcome": closing[-1].strip("= ") if closing else proc.stdout[-300:]}


def frame_name(frame: str) -> str:
    return re.sub(r" \(.*", "", frame)


def split_profile(raw: Path) -> dict:
    """py-spy's raw stacks (``frame;frame;... count``) inside test bodies: the share of each
    call the test made (the frame below the test function), and the layer's shares."""
    in_tests = layer_self = layer_under = 0
    calls = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, count = stack.split(";"), int(count)
        start = next((i for i, f in enumerate(frames) if f.startswith("pytest_pyfunc_call")),
                     None)
        if start is None:
            continue  # start-up, collection, the launcher
        body = [f for f in frames[start + 1:] if "pluggy" not in f and "_pytest" not in f]
        in_tests += count
        calls[frame_name(body[1]) if len(body) > 1 else "(the test function itself)"] += count
        layer_under += count if any("megatron_musa_patch" in f for f in frames) else 0
        layer_self += count if "megatron_musa_patch" in frames[-1] else 0
    return {"samples": in_tests, "calls": calls, "layer_self": layer_self,
            "layer_under": layer_under}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="test file, a path inside the checkout")
    parser.add_argument("-k", dest="kexpr", default="", help="pytest -k expression")
    parser.add_argument("--lm-path", type=Path, default=os.environ.get("MEGATRON_LM_PATH"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--minimum", required=True,
                        help="the features the tests need beyond the required ones "
                             "(MEGATRON_MUSA_PATCH_ONLY's value)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="one more run of every plugin under py-spy: where the CPU goes")
    args = parser.parse_args(argv)
    if not args.lm_path or not (Path(args.lm_path) / args.file).is_file():
        parser.error(f"{args.file} is not in --lm-path {args.lm_path} (an unpacked Megatron-LM "
                     f"checkout: see ../shared/upstream/)")
    if args.profile and shutil.which("py-spy") is None:
        parser.error("--profile needs py-spy on PATH (pip install py-spy)")
    python = os.path.abspath(args.python) if os.sep in args.python else args.python
    lm_path = Path(args.lm_path).resolve()
    version = subprocess.run([python, "-c", "import sys, torch; print(sys.version.split()[0], "
                              "torch.__version__)"], capture_output=True, text=True).stdout.split()
    print(describe(*version) if len(version) == 2 else describe())
    settings = {"every plugin": {},
                f"minimum ({args.minimum})": {"MEGATRON_MUSA_PATCH_ONLY": args.minimum}}
    print(f"{args.file}" + (f" -k '{args.kexpr}'" if args.kexpr else "") +
          f", {args.nproc} ranks, {args.runs} runs of each setting, alternating", flush=True)
    runs = {name: [] for name in settings}
    for number in range(args.runs):
        for name, env in settings.items():
            result = run_once(python, lm_path, args.file, args.kexpr, args.nproc, env)
            runs[name].append(result)
            print(f"  run {number + 1} {name:40} wall {result['wall']:7.1f} s  cpu "
                  f"{result['cpu']:7.1f} s  {result['outcome']}", flush=True)
    medians = {name: {key: statistics.median(r[key] for r in results) for key in ("wall", "cpu")}
               for name, results in runs.items()}
    every, minimum = medians.values()
    print(f"median every plugin / minimum: wall {every['wall'] / minimum['wall']:.2f}, cpu "
          f"{every['cpu'] / minimum['cpu']:.2f}")
    failing = sorted({r["outcome"] for results in runs.values() for r in results
                      if r["returncode"] != 0})
    if failing:
        print(f"not every run passed (the ratio compares different work): {failing}")
    if args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "stacks.txt"
            run_once(python, lm_path, args.file, args.kexpr, args.nproc, {}, profile_to=raw)
            split = split_profile(raw)
        total = split["samples"] or 1
        print(f"profile of every plugin, CPU samples inside the test bodies ({split['samples']}):"
              f" the layer's own code {100 * split['layer_self'] / total:.1f}%, under a layer "
              f"frame (its wrappers, with the upstream work they call) "
              f"{100 * split['layer_under'] / total:.1f}%; by what the tests called:")
        for call, count in split["calls"].most_common(10):
            print(f"  {100 * count / total:5.1f}%  {call}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
