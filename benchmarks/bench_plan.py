"""``mmp plan`` against real runs on CPU ranks: memory within 3% of the measured peak, step time
within 15% of the measured median step, Megatron's own estimate beside each; ``--search``'s
first layout against the fastest layout it considered, all measured.

    python benchmarks/bench_plan.py --lm-path MEGATRON_LM (--profile PROFILE.json | --calibrate)
        [--only NAME,...] [--search] [--out benchmarks/results/plan_cpu_<date>.json]

``--calibrate`` first measures this machine: ``mmp plan --calibrate --device cpu
--nproc-per-node 2 pretrain_gpt.py CALIBRATION`` (a model none of the configurations below has:
2 layers, hidden 384, sequence 192), written beside the results as
``plan_cpu_profile_<date>.json``, and plans with it.

Each configuration of the stock ``pretrain_gpt.py`` on 2 CPU ranks (gloo):

* planned: ``mmp plan --device PROFILE --nproc-per-node 2 --json`` (the command as users run it);
* memory measured: the same run under ``mmp run`` through ``plan_measure_rank.py``, 5
  iterations, two ways (the CPU allocator's own events; the real run's live storages): the
  steady peak (from the second iteration on) against the plan's second step, rank by rank for
  each stage's busiest rank;
* time measured: the same run without the profiler, 8 iterations; Megatron's own "elapsed time
  per iteration", median of iterations 3 to 8 (the first two build caches and optimizer state).

Run it from a directory other than the repository's (so the installed package is the one timed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

BASE = [
    "--transformer-impl", "local", "--num-layers", "4", "--hidden-size", "256",
    "--ffn-hidden-size", "1024", "--num-attention-heads", "8", "--seq-length", "256",
    "--max-position-embeddings", "1024", "--micro-batch-size", "2", "--global-batch-size", "16",
    "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style", "cosine", "--lr-warmup-iters", "0",
    "--weight-decay", "0.01", "--clip-grad", "1.0", "--tokenizer-type", "NullTokenizer",
    "--vocab-size", "4000", "--eval-iters", "0", "--eval-interval", "100000",
    "--seed", "1234", "--bf16", "--position-embedding-type", "rope", "--normalization",
    "RMSNorm", "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--mock-data", "--log-interval", "1",
]
DISTOPT = ["--use-distributed-optimizer"]
#: the calibration's model: BASE with another shape, so no configuration below is calibrated on
CALIBRATION = [*[t for name, values in (("--num-layers", "2"), ("--hidden-size", "384"),
                                        ("--ffn-hidden-size", "1536"),
                                        ("--num-attention-heads", "6"), ("--seq-length", "192"))
                 for t in (name, values)]]
MLA = ["--multi-latent-attention", "--q-lora-rank", "64", "--kv-lora-rank", "32",
       "--qk-head-dim", "32", "--qk-pos-emb-head-dim", "16", "--v-head-dim", "32"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "512",
       "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"]

#: name -> the flags beside BASE (2 ranks)
CONFIGS = {
    "dp2": DISTOPT,
    "dp2-seq512": [*DISTOPT, "--seq-length", "512"],
    "dp2-no-distopt": [],
    "tp2-sp": ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
    "tp2": ["--tensor-model-parallel-size", "2"],
    "tp2-seq512": ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                   "--seq-length", "512"],
    "pp2": ["--pipeline-model-parallel-size", "2"],
    "pp2-vpp2": ["--pipeline-model-parallel-size", "2",
                 "--num-layers-per-virtual-pipeline-stage", "1"],
    "dp2-selective": [*DISTOPT, "--recompute-activations"],
    "dp2-full": [*DISTOPT, "--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"],
    "dp2-ours": [*DISTOPT, "--attn-recompute", "--mlp-recompute", "--recompute-variance"],
    "pp2-full": ["--pipeline-model-parallel-size", "2", "--recompute-granularity", "full",
                 "--recompute-method", "uniform", "--recompute-num-layers", "1"],
    "dp2-offload": [*DISTOPT, "--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0",
                    "--use-precision-aware-optimizer"],
    "moe-ep2": [*DISTOPT, *MOE, "--expert-model-parallel-size", "2"],
    # the routing the planner assumes (balanced), forced in the real run too
    "moe-ep2-balanced": [*DISTOPT, *MOE, "--expert-model-parallel-size", "2",
                         "--moe-router-force-load-balancing"],
    "mla-dp2": [*DISTOPT, *MLA],
    "mtp-dp2": [*DISTOPT, "--mtp-num-layers", "1"],
}


def calibration_args() -> list:
    """BASE with the calibration's shape, data-parallel with the distributed optimizer."""
    from megatron_musa_patch.lib.plan import flags as edit

    changed = dict(zip(CALIBRATION[::2], CALIBRATION[1::2]))
    return edit.edited([*BASE, *DISTOPT], changed)


def lm_script(lm_path: str) -> str:
    return os.path.join(lm_path, "pretrain_gpt.py")


def mmp(*args, env=None, timeout=1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megatron_musa_patch.cli.main", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                          timeout=timeout)


def planned(lm_path: str, profile: str, args, extra=(), compiled_as_eager=False) -> dict:
    done = mmp("plan", "--device", profile, "--nproc-per-node", "2", "--json", "--no-levers",
               *extra, lm_script(lm_path), *args,
               env=dict(os.environ, MEGATRON_LM_PATH=lm_path,
                        MMP_PLAN_COMPILED_AS_EAGER="1" if compiled_as_eager else "0"))
    text = done.stdout.decode(errors="replace")
    start = text.find("{\n")
    if done.returncode != 0 or start < 0:
        raise RuntimeError(f"mmp plan failed ({done.returncode}):\n{text[-3000:]}")
    return json.loads(text[start:])


def measured_memory(lm_path: str, args, storages: bool = False, nproc: int = 2) -> dict:
    with tempfile.TemporaryDirectory(prefix="mmp-measure-") as out:
        env = dict(os.environ, MEGATRON_LM_PATH=lm_path, MMP_PLAN_MEASURE_DIR=out,
                   MMP_PLAN_MEASURE_STORAGES="1" if storages else "0")
        done = mmp("run", "--standalone", "--nproc-per-node", str(nproc),
                   os.path.join(HERE, "plan_measure_rank.py"),
                   lm_script(lm_path), *args, "--train-iters", "5", env=env)
        if done.returncode != 0:
            raise RuntimeError(f"the measured run failed:\n{done.stdout.decode()[-3000:]}")
        peaks = {}
        for name in os.listdir(out):
            with open(os.path.join(out, name)) as f:
                row = json.load(f)
            peaks[row["rank"]] = row
        return peaks


STEP = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)")


def measured_step(lm_path: str, args, iters: int = 8) -> dict:
    env = dict(os.environ, MEGATRON_LM_PATH=lm_path)
    done = mmp("run", "--standalone", "--nproc-per-node", "2", lm_script(lm_path), *args,
               "--train-iters", str(iters), env=env)
    text = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        raise RuntimeError(f"the timed run failed:\n{text[-3000:]}")
    steps = {int(i): float(ms) / 1000 for i, ms in STEP.findall(text)}
    kept = [s for i, s in sorted(steps.items()) if i >= 3]
    return {"median_s": statistics.median(kept), "steps_s": kept}


def compare(name, lm_path, profile, flags) -> dict:
    args = [*BASE, *flags]
    begin = time.monotonic()
    plan = planned(lm_path, profile, args)
    plan_s = time.monotonic() - begin
    peaks = measured_memory(lm_path, args)
    drifts = {rank: bool(row["allocator_per_step"]) and
              row["allocator_per_step"][-1] > 1.01 * row["allocator_per_step"][0]
              for rank, row in peaks.items()}
    cross, eager = {}, {}
    if any(drifts.values()):
        # the cross-check: the real run's storages, its compiled regions eager under the
        # counting mode, against a plan that counts them eager too
        cross = measured_memory(lm_path, args, storages=True)
        eager = {r["rank"]: r["memory_bytes"]["steady_peak"]
                 for r in planned(lm_path, profile, args, compiled_as_eager=True)["ranks"]}
    step = measured_step(lm_path, args)
    ranks = []
    for r in plan["ranks"]:
        mem, seen = r["memory_bytes"], peaks[r["rank"]]
        predicted = mem["steady_peak"]
        # the first steady step: a count that drifts (frees in other threads unseen) has
        # gathered the least there
        allocator = (seen["allocator_per_step"] or [seen["allocator_steady_peak"]])[0]
        storages = cross.get(r["rank"], {}).get("storages_steady_peak") or None
        steps = seen["allocator_per_step"]
        theory = (r.get("megatron_theoretical") or {}).get("total")
        ranks.append({"rank": r["rank"], "stage": r["stage"], "predicted": predicted,
                      "allocator": allocator, "error": predicted / allocator - 1,
                      # the allocator's count rises step to step when frees in other threads
                      # go unseen (see plan_measure_rank.py): then the real run's storages,
                      # counted with its compiled regions eager, are the cross-check
                      "allocator_drifts": drifts[r["rank"]], "allocator_per_step": steps,
                      "storages": storages,
                      "predicted_eager": eager.get(r["rank"]),
                      "error_storages": eager[r["rank"]] / storages - 1 if storages else None,
                      "measured_where": seen["allocator_peak_inside"],
                      "predicted_whole_run": mem["peak"], "megatron": theory,
                      "megatron_error": (theory / allocator - 1) if theory and r["stage"] == 0
                      else None})
    return {"name": name, "flags": flags, "ranks": ranks,
            "step_predicted_s": plan["step_time_s"], "step_measured_s": step["median_s"],
            "step_error": plan["step_time_s"] / step["median_s"] - 1,
            "steps_measured_s": step["steps_s"], "plan_seconds": round(plan_s, 1),
            "bubble": plan["bubble"], "step_parts_s": plan["step_parts_s"]}


def search(lm_path, profile) -> dict:
    """--search on 2 CPU ranks, then every layout it considered that fits, measured."""
    args = [*BASE, *DISTOPT]
    plan = planned(lm_path, profile, args, extra=("--search",))
    ranked = plan["search"]["ranked"]
    measured = []
    for entry in ranked:
        from megatron_musa_patch.lib.plan import flags as edit

        layout_args = list(args)
        change = [t for t in entry["flags"] if not t.startswith("(without")]
        removed = [t[len("(without "):-1] for t in entry["flags"] if t.startswith("(without")]
        for name, values in edit.split(change):
            layout_args = edit.edited(layout_args, {name: values[0] if values else None})
        layout_args = edit.edited(layout_args, remove=removed)
        step = measured_step(lm_path, layout_args)
        measured.append({"layout": entry["layout"], "flags": entry["flags"],
                         "predicted_s": entry["plan"]["step_time_s"],
                         "measured_s": step["median_s"]})
    fastest = min(m["measured_s"] for m in measured)
    first = measured[0]
    return {"considered": plan["search"]["considered"], "layouts": measured,
            "first": first["layout"], "first_vs_fastest": first["measured_s"] / fastest - 1}


def markdown(result: dict) -> str:
    """The results as the tables of docs/benchmarks.md."""
    lines = ["| configuration | rank | predicted | measured (allocator) | error | Megatron's "
             "estimate | its error | step predicted | measured (median) | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["configs"]:
        if "failed" in row:
            lines.append(f"| {row['name']} | failed: {row['failed'][-120:]!r} |")
            continue
        for i, r in enumerate(row["ranks"]):
            first = (r.get("allocator_per_step") or [r["allocator"]])[0]
            r = dict(r, allocator=first, error=r["predicted"] / first - 1)
            error = f"{r['error']:+.1%}"
            if r["allocator_drifts"] and r.get("error_storages") is not None:
                error += f" (count drifts; storages {r['error_storages']:+.1%})"
            elif r["allocator_drifts"]:
                error += " (count drifts)"
            theory = (f"{r['megatron'] / 2**20:.1f} MiB | {r['megatron_error']:+.0%}"
                      if r["megatron_error"] is not None else " | ")
            step = (f"{row['step_predicted_s'] * 1000:.0f} ms | "
                    f"{row['step_measured_s'] * 1000:.0f} ms | {row['step_error']:+.1%}"
                    if i == 0 else " | | ")
            lines.append(f"| {row['name'] if i == 0 else ''} | {r['rank']} (stage {r['stage']}) "
                         f"| {r['predicted'] / 2**20:.1f} MiB | {r['allocator'] / 2**20:.1f} MiB "
                         f"| {error} | {theory} | {step} |")
    search = result.get("search")
    if search:
        lines += ["", "| layout (search's order) | predicted step | measured step |",
                  "|---|---|---|"]
        for entry in search["layouts"]:
            lines.append(f"| {entry['layout']} | {entry['predicted_s'] * 1000:.0f} ms | "
                         f"{entry['measured_s'] * 1000:.0f} ms |")
        lines.append(f"\nFirst-ranked layout against the fastest measured: "
                     f"{search['first_vs_fastest']:+.1%}.")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", metavar="RESULTS_JSON",
                   help="print an earlier run's results as markdown tables and exit")
    p.add_argument("--lm-path")
    p.add_argument("--profile", help="a profile from mmp plan --calibrate")
    p.add_argument("--calibrate", action="store_true",
                   help="calibrate this machine first (see above) and plan with that profile")
    p.add_argument("--only", default="")
    p.add_argument("--search", action="store_true")
    p.add_argument("--out", default="")
    o = p.parse_args()
    if o.table:
        with open(o.table) as f:
            print(markdown(json.load(f)))
        return 0
    if not o.lm_path or not (o.profile or o.calibrate):
        p.error("--lm-path and --profile (or --calibrate) are needed to measure")
    if o.calibrate:
        o.profile = os.path.join(HERE, "results",
                                 f"plan_cpu_profile_{datetime.date.today().isoformat()}.json")
        done = mmp("plan", "--calibrate", "--device", "cpu", "--nproc-per-node", "2",
                   "--output", o.profile, lm_script(o.lm_path), *calibration_args(),
                   env=dict(os.environ, MEGATRON_LM_PATH=o.lm_path))
        print(done.stdout.decode(errors="replace")[-600:], flush=True)
        if done.returncode != 0:
            return 1
    names = [n for n in (o.only.split(",") if o.only else CONFIGS)]
    out = o.out or os.path.join(HERE, "results",
                                f"plan_cpu_{datetime.date.today().isoformat()}.json")
    rows = []
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "python": platform.python_version(), "lm_path": o.lm_path,
              "profile": o.profile, "configs": rows,
              # read from the installed distributions: importing Megatron here would make the
              # layer refuse to activate later in this process (the search imports it)
              **{key: _version(dist) for key, dist in (("torch", "torch"),
                                                       ("megatron_core", "megatron-core"))}}
    for name in names:
        try:
            row = compare(name, o.lm_path, o.profile, CONFIGS[name])
        except Exception as exc:  # noqa: BLE001 - reported in the table, the rest go on
            row = {"name": name, "flags": CONFIGS[name], "failed": str(exc)[-2000:]}
        rows.append(row)
        print(line(row), flush=True)
        _write(out, result)  # what ran so far survives a later failure
    if o.search:
        result["search"] = search(o.lm_path, o.profile)
        print(json.dumps(result["search"], indent=1))
        _write(out, result)
    print(f"wrote {out}")
    return 0


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _write(path: str, result: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


def line(row) -> str:
    if "failed" in row:
        return f"{row['name']:16s} FAILED: {row['failed'][-400:]}"
    mem = " ".join(f"r{r['rank']} {r['predicted'] / 2**20:.1f}/{r['allocator'] / 2**20:.1f} MiB "
                   f"{r['error']:+.1%}"
                   + (f" (drifts; storages {r['error_storages']:+.1%})"
                      if r["allocator_drifts"] else "")
                   + (f" (Megatron {r['megatron_error']:+.0%})"
                      if r["megatron_error"] is not None else "")
                   for r in row["ranks"])
    return (f"{row['name']:16s} {mem} | step {row['step_predicted_s'] * 1000:.0f}/"
            f"{row['step_measured_s'] * 1000:.0f} ms {row['step_error']:+.1%}")


if __name__ == "__main__":
    sys.exit(main())
