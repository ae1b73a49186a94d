"""``python -m tools.conformance``: run the chosen files for one release, store its results,
render the page."""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

from .classify import pass_rate, verdicts
from .render import _one_line, describe_release, stale, updated, write
from .runner import STALL_SECONDS, every_test_file, run_file
from .tables import CI_SET, DEFAULT_SET, LAUNCHERS, REMAINING, SINGLE_PROCESS

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------- main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files (paths inside the checkout)")
    parser.add_argument("--lm-path", type=Path, default=os.environ.get("MEGATRON_LM_PATH"),
                        help="unpacked Megatron-LM checkout (default: MEGATRON_LM_PATH)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--nproc", type=int, default=8, help="ranks (upstream assumes 8)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per file")
    parser.add_argument("--stall", type=float, default=STALL_SECONDS,
                        help="stop a file once every rank has sat idle this long (deadlocked; "
                             "0: only the timeout stops it)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="torchrun",
                        help="how the ranks start: torchrun, or forked from one process that "
                             "has imported megatron-core (a file's start-up in seconds, not a "
                             "minute, on a small machine; the CPU row only)")
    parser.add_argument("--set", choices=("default", "ci", "all"), default="default",
                        help="the issue's files, CI's slice, or every test_*.py of the tree")
    parser.add_argument("--results", type=Path, default=REPO / "docs" / "conformance")
    parser.add_argument("--markdown", type=Path, default=REPO / "docs" / "conformance.md")
    parser.add_argument("--no-write", action="store_true",
                        help="print the summary only; keep docs/ as it is (CI)")
    parser.add_argument("--update", action="store_true",
                        help="replace only these files' results in the release's results "
                             "(same --nproc and --timeout); the summary covers them all")
    parser.add_argument("--render-only", action="store_true",
                        help="write the page and the per-test data files from the results")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page or a per-test data file is not what the "
                             "results give (nothing is run or written)")
    parser.add_argument("--min-pass-rate", type=float, default=None,
                        help="exit 1 when the runnable tests' pass rate is below this (percent)")
    args = parser.parse_args(argv)
    if args.check:
        found = stale(args.results, args.markdown)
        for path in found:
            print(f"conformance: stale: {path}; run python -m tools.conformance --render-only",
                  file=sys.stderr)
        return 1 if found else 0
    if args.render_only:
        written = write(args.results, args.markdown)
        print(f"conformance: wrote {args.markdown} and {len(written) - 1} per-test data files")
        return 0
    if not args.lm_path or not (Path(args.lm_path) / "tests" / "unit_tests").is_dir():
        parser.error(f"--lm-path {args.lm_path}: not a Megatron-LM checkout with tests/unit_tests "
                     f"(unpack an archive of ../shared/upstream/ and point --lm-path at it)")
    lm_path = Path(args.lm_path).resolve()
    # the files run from the checkout: a relative interpreter path (.venv/bin/python) is made
    # absolute, without resolving the venv's symlink (the venv is what it names)
    if os.sep in args.python:
        args.python = os.path.abspath(args.python)
    chosen = args.files or [f"tests/unit_tests/{f}" for f in
                            {"ci": CI_SET, "default": DEFAULT_SET}.get(args.set) or
                            every_test_file(lm_path)]
    missing = [f for f in chosen if not (lm_path / f).is_file()]
    if missing:
        parser.error(f"not in {lm_path}: {', '.join(missing)}")
    release = describe_release(args.python, lm_path)
    from tools.machine import describe

    machine = describe(release["python"], release["torch"])  # the ranks' interpreter
    print(f"conformance: megatron-core {release['megatron_core']} with {lm_path.name}, "
          f"{args.nproc} ranks, {args.timeout:.0f} s per file; {machine}", flush=True)
    results_file = args.results / f"{release['tag']}.json"
    stored = (json.loads(results_file.read_text())
              if args.update and results_file.is_file() else None)
    if stored is not None:  # another release's results: say so before the first file runs
        updated(stored, {"release": release, "files": []})
    files = []
    for number, test_file in enumerate(chosen, 1):
        nproc = 1 if os.path.basename(test_file) in SINGLE_PROCESS else args.nproc
        result = run_file(args.python, lm_path, test_file, nproc, args.timeout, {},
                          args.stall or float("inf"), args.launcher)
        files.append({**result, "machine": machine})
        tally = collections.Counter(category for _, _, category, _, _ in verdicts([result]))
        print(f"[{number}/{len(chosen)}] {test_file}: {result['status']} in "
              f"{result['seconds']:.0f} s: " + ", ".join(f"{n} {c}" for c, n in
                                                        sorted(tally.items())), flush=True)
        if not result["tests"]:
            print(result["output_tail"], flush=True)
        run = {"release": release, "nproc": args.nproc, "timeout": args.timeout,
               "machine": machine, "date": time.strftime("%Y-%m-%d"), "files": list(files)}
        if stored is not None:
            run = updated(stored, run)
        if not args.no_write:  # after every file: a run stopped half-way keeps what finished
            args.results.mkdir(parents=True, exist_ok=True)
            results_file.write_text(json.dumps(run, indent=1))
    counts = collections.Counter()
    for _, nodeid, category, reason, _ in verdicts(run["files"]):
        counts[category] += 1
        if category in REMAINING:
            print(f"  {category}: {nodeid}: {_one_line(reason)}")
    passed, runnable, percent = pass_rate(counts)
    rate = 100.0 if percent is None else percent  # nothing runnable fails no bar
    print(f"conformance: {passed} of {runnable} runnable tests pass ({rate:.1f}%)")
    if not args.no_write:
        write(args.results, args.markdown)
        print(f"conformance: wrote {results_file}, {args.markdown} and the per-test data files")
    if args.min_pass_rate is not None and rate < args.min_pass_rate:
        print(f"conformance: error: pass rate {rate:.1f}% is below --min-pass-rate "
              f"{args.min_pass_rate}%", file=sys.stderr)
        return 1
    return 0
