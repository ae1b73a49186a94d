"""``mmp plan``: will this run fit, how fast will it go, and which layout is best, before a rank
starts.

``mmp plan [--device NAME|PROFILE] [--nodes N] [--nproc-per-node N] [--json] [--search]
SCRIPT ARGS...``: the same tail as ``mmp run``. Each pipeline stage's busiest rank runs, in its
own process, the release's own training step on fake tensors (``plan_worker``); what it
allocates and computes is priced on the device's profile (``lib/plan``). Levers and searched
layouts are the same command line with flags changed, planned the same way.
``mmp plan --calibrate [SCRIPT ARGS...]`` measures this machine's device (and, given a script,
its training step) into a profile file.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

from megatron_musa_patch.base.env_names import AUTOACTIVATE_ENV
from megatron_musa_patch.base.errors import ArgumentError, MegatronMusaPatchError

DESCRIPTION = ("Predict a training run's memory per rank and step time on a device, before any "
               "rank starts: each pipeline stage's busiest rank runs the release's own training "
               "step on fake tensors, priced on the device's profile; --search ranks layouts.")
EXIT_STATUS = ("Exit status: 0 the plan was printed (whether or not it fits: see `fits`); 2 bad "
               "input (Megatron's own refusal of the arguments, an unknown device, a profile "
               "without a field); 1 a planned rank failed for another reason (its traceback is "
               "shown).")
#: each planned rank's own limit
RANK_TIMEOUT_S = 900.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmp plan", description=DESCRIPTION, epilog=EXIT_STATUS)
    p.add_argument("--device", default="h100",
                   help="a device profile: h100, h200, s4000, s5000, cpu, or a JSON file; "
                        "several, comma-separated, plan once and price on each (default h100)")
    p.add_argument("--nodes", type=int, default=1, help="nodes in the job (default 1)")
    p.add_argument("--nproc-per-node", type=int, default=8,
                   help="ranks per node (default 8)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--search", action="store_true",
                   help="rank the layouts (TP/PP/VPP/CP/EP, micro-batch, recompute) that fit")
    p.add_argument("--top", type=int, default=3, help="layouts shown by --search (default 3)")
    p.add_argument("--no-levers", action="store_true",
                   help="do not plan the levers of a plan that does not fit or idles")
    p.add_argument("--every-stage", action="store_true",
                   help="plan every middle pipeline stage, instead of the second and the one "
                        "before the last with those between from them (when they run the same "
                        "layers)")
    p.add_argument("--jobs", type=int, default=0,
                   help="planned ranks run at once (default: this machine's cores, at most 4)")
    p.add_argument("--calibrate", action="store_true",
                   help="measure this machine's device into a profile file (--output) and exit; "
                        "with SCRIPT ARGS (a small data-parallel model with --seq-length, "
                        "--num-layers and --hidden-size) its training step too, timed for real")
    p.add_argument("--output", default=None,
                   help="with --calibrate: the profile file to write (default "
                        "mmp-profile-<device>.json)")
    p.add_argument("script", nargs="?", help="the training script (pretrain_gpt.py)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def main(argv: Sequence[str]) -> int:
    options = parser().parse_args(list(argv))
    if options.calibrate:
        from .plan_calibrate import calibrate

        return calibrate(options, Planner)
    if not options.script:
        parser().error("the training script is missing (mmp plan [options] SCRIPT ARGS...)")
    if options.nodes < 1 or options.nproc_per_node < 1:
        raise ArgumentError(f"--nodes {options.nodes} --nproc-per-node "
                            f"{options.nproc_per_node}: both must be at least 1.")
    if not os.path.isfile(options.script):
        raise ArgumentError(f"{options.script}: no such training script.")
    from megatron_musa_patch.lib.plan import profile as profiles

    devices = [profiles.load(name) for name in options.device.split(",") if name]
    planner = Planner(options.script, options.nodes, options.nproc_per_node, devices[0],
                      jobs=options.jobs or min(os.cpu_count() or 1, 4), quiet=options.json,
                      every_stage=options.every_stage)
    return planner.run_on(devices, list(options.script_args), options)


class Planner:
    """Plans of one script's command lines for one job on a device (``device``, which ``run``
    moves through the devices asked for). The planned ranks' results are kept per command line
    and backend behaviour (a device's collective transients), so another device prices them
    again without running them again."""

    def __init__(self, script: str, nodes: int, nproc: int, device, jobs: int, quiet: bool,
                 every_stage: bool = False):
        self.script, self.nodes, self.nproc, self.device = script, nodes, nproc, device
        self.world = nodes * nproc
        self.jobs, self.quiet = max(jobs, 1), quiet
        #: plan every middle stage instead of deriving them from two (``--every-stage``)
        self.every_stage = every_stage
        self.release = ""
        self._results: Dict[Tuple, object] = {}
        self._estimates: Dict[Tuple, object] = {}

    # ---------------------------------------------------------------- one layout
    def estimate(self, args: List[str], label: str = "the command line", ends: bool = False):
        """The plan of ``args`` on the device: an Estimate, or the refusal's text (str).
        ``ends``: only the first and last stages are run, and each middle stage is taken to be
        the first (more micro-batches in flight, the embedding: a bound), to rank many layouts."""
        from megatron_musa_patch.lib.plan.estimate import estimate

        key = (tuple(args), ends, self.device.path)
        if key not in self._estimates:
            results = self.results(args, label, ends)
            self._estimates[key] = results if isinstance(results, str) else estimate(
                results, self.device, self.nodes, self.nproc, list(args))
        return self._estimates[key]

    def results(self, args: List[str], label: str, ends: bool):
        """Every stage's result (a bound for the middle ones with ``ends``), or a refusal."""
        backend = json.dumps(self.device.transients(), sort_keys=True)
        full = self._results.get((tuple(args), False, backend))
        key = (tuple(args), ends, backend)
        if full is not None:
            return full
        if key not in self._results:
            self._results[key] = self._run_stages(args, label, ends)
        return self._results[key]

    def _run_stages(self, args: List[str], label: str, ends: bool):
        from megatron_musa_patch.lib.plan import stages as middle

        begin = time.monotonic()
        first = self._rank(args, 0)
        if "error" in first:
            return self._refusal(first, label)
        pp = first["pp"]
        per_stage = self.world // pp
        by_stage = {0: first}

        def plan(wanted):
            with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
                ranks = [s * per_stage for s in wanted]
                for s, result in zip(wanted, pool.map(lambda r: self._rank(args, r), ranks)):
                    if "error" in result:
                        return self._refusal(result, label)
                    by_stage[s] = result
                    self._say(f"  {label}: stage {s} of {pp} planned "
                              f"({time.monotonic() - begin:.0f} s)")
            return None

        if ends:
            wanted = [pp - 1] if pp > 1 else []
        elif not self.every_stage and middle.interpolable(pp, first["vpp"],
                                                          first["microbatches"]):
            wanted = [1, pp - 2, pp - 1]
        else:
            wanted = list(range(1, pp))
        refused = plan(wanted)
        if refused is not None:
            return refused
        if not ends:
            rest = [s for s in range(1, pp) if s not in by_stage]
            for s in rest:
                found = middle.between(by_stage[1], by_stage[pp - 2], s, s * per_stage)
                if found is not None:
                    by_stage[s] = found
            missing = [s for s in rest if s not in by_stage]
            if missing:  # the middle stages differ in more than what they hold in flight
                refused = plan(missing)
                if refused is not None:
                    return refused
            elif rest:
                self._say(f"  {label}: stages 2 to {pp - 3} from stages 1 and {pp - 2} (the "
                          f"same layers; memory in proportion to the micro-batches in flight)")
        for s in range(pp):
            if s not in by_stage:  # a middle stage, bounded by the first
                by_stage[s] = dict(first, stage=s, rank=s * per_stage, approximated=True)
        results = [by_stage[s] for s in range(pp)]
        for stage, result in enumerate(results):
            if result["stage"] != stage:
                raise MegatronMusaPatchError(
                    f"mmp plan: rank {result['rank']} is pipeline stage {result['stage']}, not "
                    f"{stage}: this planner knows Megatron's default rank order only "
                    f"(tp-cp-ep-dp-pp). Plan without --use-tp-pp-dp-mapping.")
        self.release = first["megatron_core"]
        self._say(f"planned {label}: {pp} stage{'s' if pp > 1 else ''} in "
                  f"{time.monotonic() - begin:.1f} s")
        return results

    def _refusal(self, result: dict, label: str):
        if result.get("kind") == "refused":
            return result["error"]
        raise MegatronMusaPatchError(
            f"mmp plan: planning {label} failed on rank {result.get('rank', '?')}: "
            f"{result['error']}\n{result.get('traceback', '')}".rstrip())

    def _rank(self, args: List[str], rank: int) -> dict:
        request = {"script": self.script, "script_args": args, "world_size": self.world,
                   "nproc_per_node": self.nproc, "rank": rank,
                   "transients": self.device.transients(),
                   # the benchmark's cross-check against a run whose compiled regions ran eagerly
                   "compiled_as_eager": os.environ.get("MMP_PLAN_COMPILED_AS_EAGER") == "1"}
        with tempfile.TemporaryDirectory(prefix="mmp-plan-") as tmp:
            req, out = os.path.join(tmp, "request.json"), os.path.join(tmp, "result.json")
            with open(req, "w", encoding="utf-8") as f:
                json.dump(request, f)
            env = dict(os.environ, **{AUTOACTIVATE_ENV: "0"})
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "megatron_musa_patch.cli.plan_worker", req, out],
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    timeout=RANK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return {"error": f"did not finish in {RANK_TIMEOUT_S:.0f} s", "kind": "failed",
                        "rank": rank}
            if not os.path.exists(out):
                tail = done.stdout.decode(errors="replace")[-4000:]
                return {"error": f"exited {done.returncode} without a result", "kind": "failed",
                        "traceback": tail, "rank": rank}
            with open(out, encoding="utf-8") as f:
                result = json.load(f)
        result.setdefault("rank", rank)
        return result

    # ---------------------------------------------------------------- the command
    def run_on(self, devices, args: List[str], options) -> int:
        """``run`` on each device in turn; with more than one and --json, one object each
        under ``devices``."""
        if len(devices) == 1:
            self.device = devices[0]
            return self.run(args, options)
        outputs = []
        for device in devices:
            self.device = device
            if options.json:
                outputs.append(self.run(args, options, printed=False))
            else:
                status = self.run(args, options)
                print()
                if status:
                    return status
        if options.json:
            if any(isinstance(o, int) for o in outputs):
                return next(o for o in outputs if isinstance(o, int))
            print(json.dumps({"devices": outputs}, indent=2))
        return 0

    def run(self, args: List[str], options, printed: bool = True):
        from megatron_musa_patch.lib.plan import report

        self._say(f"planning {os.path.basename(self.script)} for {self.world} ranks on "
                  f"{self.device.name} ...")
        base = self.estimate(args)
        if isinstance(base, str):
            print(base, file=sys.stderr)
            return 2
        levers = [] if options.no_levers else self.levers(args, base)
        found, considered, dropped = ([], 0, [])
        if options.search:
            found, considered, dropped = self.search(args, options.top)
        if options.json:
            out = base.to_json()
            out["megatron_core"] = self.release
            out["levers"] = [{"why": why, "flags": change,
                              "plan": est.to_json() if est is not None else None,
                              "refused": error or None}
                             for why, change, est, error in levers]
            if options.search:
                out["search"] = {"considered": considered,
                                 "dropped": [{"layout": a, "why": b} for a, b in dropped],
                                 "ranked": [{"layout": label, "flags": change,
                                             "plan": est.to_json()}
                                            for label, change, est in found]}
            if not printed:
                return out
            print(json.dumps(out, indent=2))
            return 0
        print(report.render(base, os.path.basename(self.script), self.release))
        text = report.render_levers(base, levers)
        if text:
            print(text)
        if options.search:
            print(report.render_search(found, considered, dropped, options.top))
        return 0

    def levers(self, args: List[str], base) -> list:
        from megatron_musa_patch.lib.plan import flags, levers

        wanted = []
        if not base.fits:
            wanted += levers.for_memory(args, base.layout)
        worst = max((r.bubble for r in base.ranks), default=0.0)
        wanted += levers.for_speed(args, base.layout, worst,
                                   int(flags.value(args, "--num-layers", "1")))
        out = []
        for lever in wanted:
            est = self.estimate(lever.args, label=lever.why)
            change = flags.difference(args, lever.args)
            if isinstance(est, str):
                out.append((lever.why, change, None, _first_sentence(est)))
            else:
                out.append((lever.why, change, est, ""))
        return out

    def search(self, args: List[str], top: int = 3):
        """Every layout of the ranks (``layouts.candidates``) at the user's micro-batch and twice
        it, each with the first of no recompute / the layer's / full that fits, ranked by step
        time from their first and last stages; the best ``top`` planned in full and ranked
        again. Returns (ranked (label, flags, Estimate), configurations planned, dropped)."""
        from megatron_musa_patch.lib.plan import flags, layouts, levers

        found, dropped = [], []
        considered = 0
        for layout in layouts.candidates(args, self.world, self.nproc):
            laid = layouts.apply(args, layout)
            mbs = int(flags.value(laid, "--micro-batch-size", "1"))
            gbs = int(flags.value(laid, "--global-batch-size", "1"))
            sizes = [mbs] + ([mbs * 2] if gbs % (mbs * 2 * layout["dp"]) == 0 else [])
            for size in sizes:
                sized = flags.edited(laid, {"--micro-batch-size": str(size)})
                label = f"{layouts.name(layout)} mbs{size}"
                for mode in ("none", "ours", "full"):
                    trial = levers.with_recompute(sized, mode)
                    considered += 1
                    est = self.estimate(trial, label=f"{label} (recompute {mode})", ends=True)
                    if isinstance(est, str):
                        dropped.append((f"{label}, recompute {mode}", _first_sentence(est)))
                        break
                    if est.fits:
                        found.append((f"{label}, recompute {mode}", trial, est))
                        break
        found.sort(key=lambda item: item[2].step_time_s)
        best = []
        for label, trial, est in found[:top]:
            full = self.estimate(trial, label=f"{label} (every stage)")
            best.append((label, trial, est if isinstance(full, str) else full))
        best.sort(key=lambda item: item[2].step_time_s)
        ranked = [(label, flags.difference(args, trial), est)
                  for label, trial, est in best + found[top:]]
        return ranked, considered, dropped

    def _say(self, text: str) -> None:
        if not self.quiet or sys.stderr.isatty():
            print(f"mmp plan: {text}", file=sys.stderr, flush=True)


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    return text[:300] + ("..." if len(text) > 300 else "")
