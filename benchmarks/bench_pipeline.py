"""ZB-H1 against megatron-core's 1F1B on the stock pretrain_gpt.py, side by side: each stage's
idle share measured from ``--pipeline-timeline``, against the planner's simulation of the
schedule on the stages' own measured F, B and W and against the paper's formula, and the step
time. Runs alternate between the schedules so machine drift hits both.

On CPU ranks that share a machine's cores, a rank that idles lends its core to another, so the
idle shares and the step times say how the schedule orders its work, not what it gains on a
cluster: wall-clock gains need one device per rank.

Usage: MEGATRON_LM_PATH=... python benchmarks/bench_pipeline.py [--pp 4] [--microbatches 8]
       [--runs 2] [--iters 6] [--out benchmarks/results/pipeline_cpu_<date>.json]
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.machine import describe  # noqa: E402
from tests.harness import stock  # noqa: E402

#: the weight-gradient GEMMs held back add into main_grad: --gradient-accumulation-fusion
TINY = [a for a in stock.TINY if a != "--no-gradient-accumulation-fusion"]
MODEL = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "8",
         "--seq-length", "256", "--max-position-embeddings", "256", "--micro-batch-size", "1",
         "--use-distributed-optimizer"]
SCHEDULES = {"1f1b": [], "zb-h1": ["--enable-zero-bubble"]}


def one_run(lm, pp, microbatches, iters, schedule):
    with tempfile.TemporaryDirectory(prefix="mmp-timeline-") as folder:
        args = [*MODEL, "--pipeline-model-parallel-size", str(pp), "--global-batch-size",
                str(microbatches), "--pipeline-timeline", folder, *SCHEDULES[schedule]]
        saved, stock.TINY = stock.TINY, TINY
        try:
            _, times, _ = stock.run_stock(lm, args, nproc=pp, iters=iters)
        finally:
            stock.TINY = saved
        steps = {}
        for path in Path(folder).glob("rank*.jsonl"):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                steps.setdefault(record["iteration"], {})[record["stage"]] = record
    warm = [i for i in sorted(steps) if i >= 2]  # the first steps build caches
    by_stage = {}
    for stage in range(pp):
        idle = [steps[i][stage]["idle_fraction"] for i in warm]
        theory = [steps[i][stage]["theoretical_bubble"] for i in warm]
        spans = {kind: [op["end_s"] - op["start_s"] for i in warm
                        for op in steps[i][stage]["ops"] if op["kind"] == kind]
                 for kind in "FBW"}
        by_stage[stage] = {"idle": statistics.median(idle), "theory": statistics.median(theory),
                           **{kind: statistics.median(v) if v else 0.0
                              for kind, v in spans.items()}}
    # the planner's simulation of the schedule (lib/plan/schedule.py) on the stages' own
    # measured passes
    from megatron_musa_patch.lib.plan import schedule as planned

    timeline = planned.simulate([by_stage[s]["F"] for s in range(pp)],
                                [by_stage[s]["B"] for s in range(pp)], microbatches,
                                weight_s=[by_stage[s]["W"] for s in range(pp)],
                                zero_bubble=schedule == "zb-h1")
    for s in range(pp):
        by_stage[s]["simulated"] = timeline.bubble(s)
    step_ms = statistics.median(times[i] for i in sorted(times)[2:])
    return {"step_ms": step_ms, "stages": by_stage}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    lm = os.environ.get("MEGATRON_LM_PATH")
    if not lm:
        sys.exit("set MEGATRON_LM_PATH to a Megatron-LM checkout")
    print(describe(), flush=True)
    results = {s: [] for s in SCHEDULES}
    for run in range(opts.runs):
        for schedule in SCHEDULES:
            print(f"run {run + 1}/{opts.runs}: {schedule}, PP {opts.pp}, "
                  f"{opts.microbatches} micro-batches ...", flush=True)
            results[schedule].append(one_run(lm, opts.pp, opts.microbatches, opts.iters,
                                             schedule))
    summary = {}
    for schedule, runs in results.items():
        summary[schedule] = {
            "step_ms": statistics.median(r["step_ms"] for r in runs),
            "idle_by_stage": [statistics.median(r["stages"][s]["idle"] for r in runs)
                              for s in range(opts.pp)],
            "theory_by_stage": [statistics.median(r["stages"][s]["theory"] for r in runs)
                                for s in range(opts.pp)],
            "simulated_by_stage": [statistics.median(r["stages"][s]["simulated"] for r in runs)
                                   for s in range(opts.pp)]}
    print("| schedule | step (median) | idle share by stage, measured | planner's simulation | "
          "paper's formula |")
    print("|---|---|---|---|---|")
    for schedule, row in summary.items():
        print(f"| {schedule} | {row['step_ms']:.0f} ms | "
              f"{' '.join(f'{x:.3f}' for x in row['idle_by_stage'])} | "
              f"{' '.join(f'{x:.3f}' for x in row['simulated_by_stage'])} | "
              f"{' '.join(f'{x:.3f}' for x in row['theory_by_stage'])} |")
    ratio = summary["zb-h1"]["step_ms"] / summary["1f1b"]["step_ms"]
    print(f"ZB-H1 step / 1F1B step: {ratio:.3f}")
    out = opts.out or str(ROOT / "benchmarks" / "results" /
                          f"pipeline_cpu_{datetime.date.today().isoformat()}.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"machine": describe(), "pp": opts.pp, "microbatches": opts.microbatches,
                   "iters": opts.iters, "runs": results, "summary": summary,
                   "zb_over_1f1b_step": ratio, "lm_path": lm}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
