"""The pipeline schedules side by side on the stock pretrain_gpt.py: megatron-core's 1F1B, ZB-H1
(``--enable-zero-bubble``) and the V schedules (``--pipeline-v-schedule zb-v|dualpipev``), one
model for all. For each: every stage's idle share measured from ``--pipeline-timeline``, against
the planner's simulation of the schedule on the stages' own measured F, B and W (and the paper's
formula where it has one), the step time, and with ``--memory`` each rank's peak of allocated
memory (``plan_measure_rank.py``'s allocator count). Runs alternate between the schedules so
machine drift hits all.

On CPU ranks that share a machine's cores, a rank that idles lends its core to another, so the
idle shares and the step times say how the schedule orders its work, not what it gains on a
cluster: wall-clock gains need one device per rank.

Usage: MEGATRON_LM_PATH=... python benchmarks/bench_pipeline.py [--pp 4] [--microbatches 8]
       [--runs 2] [--iters 6] [--memory] [--out benchmarks/results/pipeline_cpu_<date>.json]
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
#: untied: the V schedules hold the embedding and the output layer on two chunks of rank 0
MODEL = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "8",
         "--seq-length", "256", "--max-position-embeddings", "256", "--micro-batch-size", "1",
         "--use-distributed-optimizer", "--untie-embeddings-and-output-weights"]
V = ["--num-virtual-stages-per-pipeline-rank", "2", "--pipeline-v-schedule"]
SCHEDULES = {"1f1b": [], "zb-h1": ["--enable-zero-bubble"], "zb-v": [*V, "zb-v"],
             "dualpipev": [*V, "dualpipev"]}


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

    passes = [[by_stage[s][kind] for s in range(pp)] for kind in "FBW"]
    if schedule in ("zb-v", "dualpipev"):  # per model chunk: half the stage's layers
        timeline = planned.simulate_v(schedule, *passes, microbatches)
    else:
        timeline = planned.simulate(passes[0], passes[1], microbatches, weight_s=passes[2],
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
    parser.add_argument("--memory", action="store_true",
                        help="also measure each rank's peak of allocated memory, once each")
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
    memory = {}
    if opts.memory:
        from benchmarks.bench_plan import measured_memory

        for schedule, flags in SCHEDULES.items():
            print(f"memory: {schedule} ...", flush=True)
            args = [*TINY, "--mock-data", *MODEL, "--pipeline-model-parallel-size", str(opts.pp),
                    "--global-batch-size", str(opts.microbatches), *flags]
            peaks = measured_memory(lm, args, nproc=opts.pp)
            # the first steady step, as bench_plan.py reads it: a count that drifts (frees in
            # gloo's threads go unseen) has gathered the least there
            memory[schedule] = {rank: {"peak": (peaks[rank]["allocator_per_step"]
                                                or [peaks[rank]["allocator_steady_peak"]])[0],
                                       "per_step": peaks[rank]["allocator_per_step"]}
                                for rank in sorted(peaks)}
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
          "timeline's theory | peak allocated by rank |")
    print("|---|---|---|---|---|---|")
    for schedule, row in summary.items():
        peaks = memory.get(schedule)
        said = (" ".join(f"{p['peak'] / 2**20:.0f}" for p in peaks.values()) + " MiB"
                if peaks else "-")
        print(f"| {schedule} | {row['step_ms']:.0f} ms | "
              f"{' '.join(f'{x:.3f}' for x in row['idle_by_stage'])} | "
              f"{' '.join(f'{x:.3f}' for x in row['simulated_by_stage'])} | "
              f"{' '.join(f'{x:.3f}' for x in row['theory_by_stage'])} | {said} |")
    ratios = {s: summary[s]["step_ms"] / summary["1f1b"]["step_ms"] for s in summary}
    print("step / 1F1B step: " + ", ".join(f"{s} {r:.3f}" for s, r in ratios.items()))
    out = opts.out or str(ROOT / "benchmarks" / "results" /
                          f"pipeline_cpu_{datetime.date.today().isoformat()}.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"machine": describe(), "pp": opts.pp, "microbatches": opts.microbatches,
                   "iters": opts.iters, "runs": results, "summary": summary,
                   "step_over_1f1b": ratios, "peak_allocated_bytes": memory, "lm_path": lm},
                  f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
