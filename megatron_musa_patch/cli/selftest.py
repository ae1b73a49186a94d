"""``mmp selftest``: check an installation on this device with megatron-core alone.

Trains a tiny GPT for a few steps on 1 rank (the reference), then in each requested layout on
2 ranks under torchrun, from the same initial weights and batches, and checks that the loss
falls and that every layout's per-step loss matches the reference within a tolerance.

The tolerance (5e-5 in fp32, about 1e-5 of the loss) is rounding, not a bug's margin: TP2 splits
the row-parallel matmuls' and the vocab-parallel softmax's sums into per-rank partial sums, so its
fp32 rounding differs from one rank's, and Adam's normalised update grows that difference over
the steps (measured: 1.3e-5 by step 4 on a 2-core AVX-512 Xeon, torch 2.13.0).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Dict, List

from megatron_musa_patch.core import settings
from megatron_musa_patch.base.env_names import AUTOACTIVATE_ENV
from megatron_musa_patch.lib.heartbeat import Heartbeat, say

#: layout name -> worker flags; each runs on 2 ranks
LAYOUTS: Dict[str, List[str]] = {
    "tp2": ["--tp", "2"],
    "pp2": ["--pp", "2"],
    "vpp2": ["--pp", "2", "--vpp", "2"],
    "dp2": [],
    "dp2-distopt": ["--distributed-optimizer"],
    "ep2": ["--ep", "2", "--dispatcher", "alltoall"],
    "ep2-allgather": ["--ep", "2", "--dispatcher", "allgather"],
}
#: model name -> worker flags, for the reference and every layout alike
MODELS: Dict[str, List[str]] = {
    "dense": [],
    "moe": ["--experts", "4"],
    "mla": ["--mla"],
    "deepseek": ["--experts", "4", "--mla"],
}
DEFAULT_LAYOUTS = ("tp2", "pp2", "dp2-distopt")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mmp selftest", description=__doc__.split("\n\n")[0].replace("``", ""),
        epilog="Exit status: 0 every layout matched the 1-rank losses; 1 one did not, or a run "
               "failed (its log is shown); 2 a bad option.")
    p.add_argument("--layouts", default=",".join(DEFAULT_LAYOUTS),
                   help=f"comma-separated, from {', '.join(LAYOUTS)} (default: %(default)s)")
    p.add_argument("--model", default="dense", choices=tuple(MODELS),
                   help="tiny GPT variant: dense (GQA, SwiGLU, RoPE), moe (4 experts, top-2, "
                        "shared expert), mla, deepseek (MLA + MoE); ep2 layouts need MoE")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tolerance", type=float, default=5e-5,
                   help="largest allowed |loss - reference loss| per step (fp32)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--keep", help="keep the run directory here (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds one torchrun launch may take before it is killed")
    return p


def parse(argv):
    return parser().parse_args(argv)


def run_worker(nproc: int, flags: List[str], out: str, workdir: str, timeout: float,
               name: str = "", shown: List[str] = ()) -> dict:
    """One torchrun launch of the worker; ``name`` (and its own flags, ``shown``) is said when
    it starts and while it runs."""
    print(f"mmp selftest: {name or 'reference'} on {nproc} rank{'s' if nproc > 1 else ''}"
          f"{' (' + ' '.join(shown) + ')' if shown else ''}", flush=True)
    with Heartbeat(say, lambda elapsed: f"mmp selftest: {name or 'reference'} still running "
                                         f"({elapsed:.0f} s)"):
        return _run_worker(nproc, flags, out, workdir, timeout)


def _run_worker(nproc: int, flags: List[str], out: str, workdir: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "megatron_musa_patch.cli.selftest_worker",
           *flags, "--out", out]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env.pop(AUTOACTIVATE_ENV, None)
    # a session of its own, so a hang can be ended with every rank it started
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        tail = "\n".join(output.strip().splitlines()[-40:])
        raise RuntimeError(f"{' '.join(flags) or 'reference'} did not finish in {timeout:.0f} s "
                           f"(killed):\n{tail}")
    if proc.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-40:])
        raise RuntimeError(f"{' '.join(flags) or 'reference'} failed (exit {proc.returncode}):\n"
                           f"{tail}")
    with open(out) as f:
        return json.load(f)


def main(argv=None) -> int:
    p = parser()
    opts = p.parse_args(sys.argv[1:] if argv is None else argv)
    layouts = [name.strip() for name in opts.layouts.split(",") if name.strip()]
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        p.error(f"--layouts: unknown layouts {unknown}; choose from {', '.join(LAYOUTS)}")
    if any(name.startswith("ep") for name in layouts) and "--experts" not in MODELS[opts.model]:
        p.error("--layouts: ep2 layouts need an MoE model: add --model moe (or deepseek)")
    workdir = opts.keep or tempfile.mkdtemp(prefix="mmp-selftest-")
    os.makedirs(workdir, exist_ok=True)
    common = ["--steps", str(opts.steps), *MODELS[opts.model]]
    init = os.path.join(workdir, "init")
    try:
        ref = run_worker(1, common + ["--save-init", init],
                         os.path.join(workdir, "reference.json"), workdir, opts.timeout,
                         name=f"reference ({opts.model} model)")
    except RuntimeError as exc:
        print(f"mmp selftest: error: {exc}", file=sys.stderr)
        return 1
    full = settings.from_env().log == "full" or ref.get("patch_failed", True)
    print(ref["patch_table"] if full else ref["patch_summary"])
    print(f"\nreference ({opts.model} model, 1 rank, {ref['device']}): losses "
          + " ".join(f"{x:.6f}" for x in ref["losses"]))
    results = {"device": ref["device"], "reference": ref["losses"], "layouts": {}}
    failed = []
    if not ref["losses"][-1] < ref["losses"][0]:
        failed.append("reference loss did not fall")
    for name in layouts:
        try:
            res = run_worker(2, common + ["--load-init", init] + LAYOUTS[name],
                             os.path.join(workdir, f"{name}.json"), workdir, opts.timeout,
                             name=name, shown=LAYOUTS[name])
        except RuntimeError as exc:
            print(f"{name:14} FAILED\n{exc}")
            failed.append(name)
            results["layouts"][name] = {"error": str(exc)}
            continue
        diff = max(abs(a - b) for a, b in zip(res["losses"], ref["losses"]))
        ok = diff <= opts.tolerance and len(res["losses"]) == len(ref["losses"])
        print(f"{name:14} {'ok    ' if ok else 'MISMATCH'} max |loss - reference| = {diff:.2e} "
              f"(tolerance {opts.tolerance:.0e}); losses "
              + " ".join(f"{x:.6f}" for x in res["losses"]))
        results["layouts"][name] = {"losses": res["losses"], "max_abs_diff": diff, "ok": ok}
        if not ok:
            failed.append(name)
    results["ok"] = not failed
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=2)
    print("\nselftest " + ("passed" if not failed else f"FAILED: {', '.join(failed)}"))
    return 0 if not failed else 1
