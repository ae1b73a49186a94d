"""From ``mmp run`` to the first iteration of a tiny stock ``pretrain_gpt.py`` (2 CPU ranks,
TP2), and from ``mmp run`` to the refusal of a mistyped flag; side by side, in one run, with
the variants interleaved.

Each variant is timed from the command's start to the first line of each kind, read as the
job prints it:

* ``first line``: the first line of any kind (the launcher's, the layer's, Megatron's);
* ``iteration 1``: Megatron's log line of the first iteration;
* ``refused``: the end of ``mmp run`` with a mistyped flag (``--tensor-model-paralel-size 2``),
  which the argument check refuses before any rank starts (exit 2).

Variants: the checked-out package (``here``), the same without the argument check
(``MEGATRON_MUSA_PATCH_ARGS_CHECK=0``), and with ``--against REV`` the package of git revision
REV (``git archive``, first on ``PYTHONPATH``; the ranks import it through the start-up hook).

    python benchmarks/bench_launch.py --lm-path $MEGATRON_LM_PATH [--repeat 5] [--against REV]

It needs the ``mmp`` of this environment and a Megatron-LM checkout of the installed
megatron-core's tag.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_checkpoint_import import package_at  # noqa: E402 - a revision's package
from tests.harness.stock import TINY  # noqa: E402 - the stock tests' tiny GPT

ITERATION = re.compile(r"iteration\s+1/\s*\d+ \|")
TYPO = ["--tensor-model-paralel-size", "2"]


def timed_launch(mmp: str, lm_path: Path, args, env, cwd: Path):
    """(seconds to the first line, seconds to iteration 1 or None, seconds to the end, rc,
    whether Megatron's "unrecognized arguments" was said)."""
    cmd = [mmp, "run", "--standalone", "--nproc-per-node", "2", str(lm_path / "pretrain_gpt.py"),
           *TINY, "--mock-data", "--tensor-model-parallel-size", "2", *args]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    first = iteration = None
    refused = False
    for line in proc.stdout:
        now = time.monotonic() - start
        first = first if first is not None else now
        if iteration is None and ITERATION.search(line):
            iteration = now
        refused = refused or "unrecognized arguments: --tensor-model-paralel-size" in line
    code = proc.wait()
    return first, iteration, time.monotonic() - start, code, refused


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lm-path", type=Path, default=os.environ.get("MEGATRON_LM_PATH"),
                        help="Megatron-LM checkout (default: $MEGATRON_LM_PATH)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", metavar="REV",
                        help="also time the package of this git revision")
    opts = parser.parse_args(argv)
    if opts.lm_path is None or not (opts.lm_path / "pretrain_gpt.py").is_file():
        parser.error("--lm-path: a Megatron-LM checkout with pretrain_gpt.py is needed")
    mmp = shutil.which("mmp", path=str(Path(sys.executable).parent)) or shutil.which("mmp")
    if mmp is None:
        parser.error("the mmp command of this environment is not installed")
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    base.update(OMP_NUM_THREADS="1", MEGATRON_LM_PATH=str(opts.lm_path), PYTHONUNBUFFERED="1",
                CUDA_DEVICE_MAX_CONNECTIONS="1")
    with tempfile.TemporaryDirectory(prefix="mmp-bench-launch-") as tmp:
        root = Path(tmp)
        variants = {"here": dict(base),
                    "here, ARGS_CHECK=0": dict(base, MEGATRON_MUSA_PATCH_ARGS_CHECK="0")}
        if opts.against:
            package = package_at(opts.against, root / "against")
            variants[opts.against] = dict(base, PYTHONPATH=os.pathsep.join(filter(None, (
                str(package), base.get("PYTHONPATH")))))
        results = {name: {"first line": [], "iteration 1": [], "refused": []}
                   for name in variants}
        for round_ in range(opts.repeat):
            for name, env in variants.items():
                first, iteration, _, code, _ = timed_launch(mmp, opts.lm_path, ["--train-iters",
                                                                                "2"], env, root)
                if code != 0 or iteration is None:
                    sys.exit(f"{name}: the run failed (exit {code})")
                results[name]["first line"].append(first)
                results[name]["iteration 1"].append(iteration)
                _, _, end, code, refused = timed_launch(mmp, opts.lm_path, TYPO, env, root)
                if code == 0 or not refused:
                    sys.exit(f"{name}: the mistyped flag was not refused (exit {code})")
                results[name]["refused"].append(end)
                print(f"round {round_ + 1}: {name}: first line {first:.1f} s, iteration 1 "
                      f"{iteration:.1f} s, typo ended after {end:.1f} s (exit {code})",
                      flush=True)
    from tools.machine import describe

    print(f"\n{describe()}; {opts.repeat} rounds, variants interleaved; median (min-max) s")
    print(f"{'variant':22} {'first line':>18} {'iteration 1':>18} {'typo refused':>18}")
    for name, kinds in results.items():
        cells = [f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
                 for v in (kinds["first line"], kinds["iteration 1"], kinds["refused"])]
        print(f"{name:22} " + " ".join(f"{c:>18}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
