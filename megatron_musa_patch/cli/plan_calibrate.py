"""``mmp plan --calibrate``: this machine's device measured into a profile file.

The ranks of one node (``--nproc-per-node``) run ``plan_calibrate_rank`` under ``mmp run`` at
once; their figures replace the base profile's speeds (``--device``: the profile whose memory and
links describe this machine; ``cpu`` when no accelerator is present), and the file records the
machine, the date and the command, so a plan made with it says what it was measured on.

With a training script and its arguments (a data-parallel layout), the whole step is measured too:
the script runs for real as given, at twice its sequence length and at twice its layers of half the
width, and each run is planned with the figures just measured. What the real micro-batches add to
their ops priced one by one (a factor and a cost per op) and what the real update adds to its own
(a factor) then replace the single layer's figures: the embedding, the loss, the data loader and
the framework between layers are in them. On two ranks or more two runs with tensor and sequence
parallelism 2 (as given, at twice the sequence) then measure what the collectives inside a
micro-batch add to their table: a cost each, and the ranks' wait for each other, a share of the
compute between.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

from megatron_musa_patch.base.errors import ArgumentError, MegatronMusaPatchError

#: a measured run's steps: the first ones build caches and the optimizer's state
STEPS, WARMUP = 14, 2


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = ""
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0) + ", "
    except Exception:  # noqa: BLE001 - the machine is described without it
        gpu = ""
    return f"{gpu}{cpu}, {os.cpu_count()} cores, {platform.node()}"


def calibrate(options, planner_class) -> int:
    """``planner_class``: ``mmp plan``'s ``Planner``, which plans the step calibration's runs
    (handed down, so that this module does not import the command that calls it)."""
    from megatron_musa_patch.lib.plan import profile as profiles

    base_name = options.device
    base = profiles.load(base_name)
    out_path = options.output or f"mmp-profile-{base.name}.json"
    nproc = options.nproc_per_node
    command = ["mmp", "plan", "--calibrate", "--device", base_name, "--nproc-per-node",
               str(nproc), "--output", out_path]
    if options.script:
        refuse_step_arguments(options.script, list(options.script_args))
    print(f"mmp plan: measuring {nproc} rank{'s' if nproc > 1 else ''} of this machine "
          f"(GEMM, memory bandwidth, op cost, collectives; about a minute) ...",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="mmp-calibrate-") as tmp:
        result = os.path.join(tmp, "measured.json")
        done = _on_node_ranks(nproc, "plan_calibrate_rank.py", [],
                              MMP_PLAN_CALIBRATE_OUT=result)
        if done.returncode != 0 or not os.path.exists(result):
            raise MegatronMusaPatchError(
                "mmp plan --calibrate: the measuring ranks failed:\n"
                + done.stdout.decode(errors="replace")[-3000:])
        with open(result, encoding="utf-8") as f:
            measured = json.load(f)
    with open(base.path, encoding="utf-8") as f:
        data = json.load(f)
    import torch

    if options.script:
        command += [options.script, *options.script_args]
    measured.update({"machine": machine(), "date": datetime.date.today().isoformat(),
                     "command": " ".join(command), "torch": torch.__version__,
                     "ranks_per_node": nproc})
    data["measured"] = measured
    if options.script:
        measured.update(step_calibration(data, options.script, list(options.script_args),
                                         nproc, planner_class))
    data["sources"] = dict(data["sources"], measured=f"mmp plan --calibrate on {machine()}, "
                                                     f"{measured['date']}")
    tmp_path = out_path + ".tmp"
    with open(tmp_path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp_path, out_path)
    g16 = max(v for _, v in measured["gemm"]["16"])
    g32 = max(v for _, v in measured["gemm"]["32"])
    print(f"mmp plan: wrote {out_path}: GEMM up to {g16 / 1e12:.3f} TFLOP/s (16-bit), "
          f"{g32 / 1e12:.3f} (32-bit); add "
          f"{measured['elementwise_bytes_per_s']['16'] / 1e9:.1f} GB/s (16-bit); "
          f"{measured['op_overhead_s'] * 1e6:.1f} us per op. Use it: mmp plan --device "
          f"{out_path} ...")
    return 0


#: the flags of a layout other than data parallelism, which the step calibration refuses
NOT_DATA_PARALLEL = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                     "--context-parallel-size", "--expert-model-parallel-size")


def refuse_step_arguments(script: str, args: list) -> None:
    """Before anything is measured: the script is there, the arguments give the shape the runs
    vary, and the layout is data-parallel."""
    from megatron_musa_patch.lib.plan import flags

    if not os.path.isfile(script):
        raise ArgumentError(f"mmp plan --calibrate {script}: no such training script.")
    missing = [f for f in ("--seq-length", "--num-layers", "--hidden-size")
               if not flags.value(args, f)]
    if missing:
        raise ArgumentError(f"mmp plan --calibrate SCRIPT ARGS: the arguments need "
                            f"{', '.join(missing)} (the step is measured as given, at twice the "
                            f"sequence, and at twice the layers of half the width).")
    parallel = [f"{f} {flags.value(args, f)}" for f in NOT_DATA_PARALLEL
                if flags.value(args, f) not in (None, "1")]
    if parallel:
        raise ArgumentError(f"mmp plan --calibrate SCRIPT ARGS: {', '.join(parallel)}: the step "
                            f"is calibrated on a data-parallel layout; drop the tensor, "
                            f"pipeline, context and expert parallel flags (their collectives "
                            f"are measured apart).")


def step_calibration(data: dict, script: str, args: list, nproc: int, planner_class) -> dict:
    """The script's step, real against priced: as given, at twice the sequence and at twice the
    layers of half the width, the micro-batches' factor and cost per op (``fit``) and the update's
    factor; then, on two ranks or more, the same run with tensor and sequence parallelism 2, as
    given and at twice the sequence: what each collective costs inside the step beyond its
    table (its backend waking after compute) and what the ranks wait for each other (a share
    of the compute between their meetings)."""
    from megatron_musa_patch.lib.plan import fit, flags
    from megatron_musa_patch.lib.plan import profile as profiles

    unscaled = dict(data["measured"], step_efficiency=1.0, framework_op_overhead_s=0.0,
                    update_efficiency=1.0, collective_in_step_s=0.0)
    raw = profiles.from_dict(dict(data, measured=unscaled), "<calibration>")
    planner = planner_class(script, 1, nproc, raw, jobs=1, quiet=True)
    sequence = int(flags.value(args, "--seq-length"))
    layers = int(flags.value(args, "--num-layers"))
    hidden = int(flags.value(args, "--hidden-size"))
    ffn = flags.value(args, "--ffn-hidden-size")
    heads = int(flags.value(args, "--num-attention-heads") or 1)
    runs = []
    # three runs that separate the ops' own time from the cost per op: twice the sequence (twice
    # the work, the same ops), then twice the layers at half the width (twice the ops, less work)
    narrow = {"--hidden-size": hidden // 2, "--num-layers": 2 * layers}
    if ffn:
        narrow["--ffn-hidden-size"] = int(ffn) // 2
    if (hidden // 2) % heads:  # the heads do not split half the width: twice the layers alone
        narrow = {"--num-layers": 2 * layers}
    for label, changed in ((f"sequence {sequence}", {}),
                           (f"sequence {2 * sequence}", {"--seq-length": 2 * sequence}),
                           (", ".join(f"{k[2:]} {v}" for k, v in narrow.items()), narrow)):
        seq = changed.get("--seq-length", sequence)
        longest = max(seq, int(flags.value(args, "--max-position-embeddings") or 0))
        run_args = flags.edited(args, {**changed, "--max-position-embeddings": longest})
        runs.append(_measured(planner, raw, script, run_args, nproc, label,
                              data_parallel=True))
    factor, per_op = fit.factor_and_per_op(
        [(r["real_microbatch_s"], r["priced_microbatch_s"], r["ops"]) for r in runs])
    update = [(r["real_update_s"] - r["priced_update_comm_s"] - per_op * r["update_ops"])
              / r["priced_update_compute_s"] for r in runs if r["priced_update_compute_s"]]
    figures = {"step_efficiency": factor, "framework_op_overhead_s": per_op,
               "update_efficiency": max(statistics.mean(update), 0.05) if update else 1.0,
               "calibrated_on": "step", "step_runs": runs}
    if nproc >= 2:
        fitted = profiles.from_dict(dict(data, measured=dict(unscaled, **figures)),
                                    "<calibration>")
        planner.device = fitted
        tp_runs = []
        # tensor parallelism 2 as given and at twice the sequence: the same collectives, twice
        # the compute between them, which separates their own cost from the wait for the peer;
        # with sequence parallelism, as Megatron advises with tensor parallelism: its
        # all-gathers and reduce-scatters are what large runs exchange
        for label, changed in (("tensor and sequence parallelism 2", {}),
                               (f"tensor and sequence parallelism 2, sequence {2 * sequence}",
                                {"--seq-length": 2 * sequence,
                                 "--max-position-embeddings": max(
                                     2 * sequence,
                                     int(flags.value(args, "--max-position-embeddings") or 0))})):
            tp_args = flags.edited(args, {"--tensor-model-parallel-size": 2,
                                          "--sequence-parallel": None, **changed})
            try:
                tp_runs.append(_measured(planner, fitted, script, tp_args, nproc, label,
                                         data_parallel=False))
            except ArgumentError as refused:  # the model does not split in two (its heads)
                print(f"mmp plan: the collectives inside a step keep the figure measured after "
                      f"compute: Megatron refuses this model at tensor parallelism 2 "
                      f"({' '.join(str(refused).split())[:200]})", file=sys.stderr, flush=True)
                return figures
        points = [(r["real_microbatch_s"] - r["priced_microbatch_s"],
                   r["collectives_per_microbatch"], r["priced_microbatch_compute_s"])
                  for r in tp_runs if r["collectives_per_microbatch"]]
        if points:
            figures["collective_in_step_s"], figures["collective_wait_share"] = \
                fit.per_collective_and_wait_share(points)
        figures["step_runs"].extend(tp_runs)
    return figures


def _measured(planner, profile, script: str, args: list, nproc: int, label: str,
              data_parallel: bool) -> dict:
    """One run of the script, planned and then timed for real: per micro-batch and for the
    update, real against priced."""
    from megatron_musa_patch.lib.plan import cost, flags

    args = flags.edited(args, {"--train-iters": STEPS})
    results = planner.results(args, f"the calibration's run at {label}", False)
    if isinstance(results, str):  # Megatron's own refusal
        raise ArgumentError(results)
    result = results[0]
    layout = {k: result.get(k, 1) for k in ("tp", "pp", "cp", "ep")}
    if data_parallel and any(v > 1 for v in layout.values()):  # a layout set another way
        raise ArgumentError(
            f"mmp plan --calibrate SCRIPT ARGS: these arguments give "
            f"{' '.join(f'{k}{v}' for k, v in layout.items() if v > 1)}: the step is "
            f"calibrated on a data-parallel layout; drop the tensor, pipeline, context and "
            f"expert parallel flags (their collectives are measured apart).")
    print(f"mmp plan: timing {os.path.basename(script)} at {label} on {nproc} rank"
          f"{'s' if nproc > 1 else ''} ({STEPS} steps) ...", file=sys.stderr, flush=True)
    real = _real_step(script, args, nproc)
    priced = cost.price(result, profile)
    calls = max(result.get("forward_calls") or 1, 1)
    # the schedule's own work and the gradients' reduction run inside Megatron's
    # forward_backward_func, priced as they are; the update is what follows it
    around = priced.grad_sync_s + priced.compute_by_phase.get("schedule", 0.0) + \
        priced.comm_by_phase.get("schedule", 0.0)
    update = ("optimizer", "other")
    return {
        "run": label,
        "real_microbatch_s": (real["passes_s"] - around) / result["microbatches"],
        "priced_microbatch_s": priced.forward_s + priced.backward_s,
        "priced_microbatch_compute_s": sum(priced.compute_by_phase.get(p, 0.0)
                                           for p in cost.MICROBATCH) / calls,
        "ops": sum(row[-1] for p in cost.MICROBATCH for row in result["work"].get(p, []))
        / calls,
        "collectives_per_microbatch": sum(
            row[-1] for row in result["comms"]
            if row[4] in cost.MICROBATCH and row[2] > 1 and row[0] not in cost.P2P) / calls,
        "real_update_s": real["steps_s"] - real["passes_s"],
        "priced_update_compute_s": sum(priced.compute_by_phase.get(p, 0.0) for p in update),
        "priced_update_comm_s": sum(priced.comm_by_phase.get(p, 0.0) for p in update),
        "update_ops": sum(row[-1] for p in update for row in result["work"].get(p, [])),
    }


def _on_node_ranks(nproc: int, rank_script: str, args: list, **env: str):
    """``mmp run`` of one of this package's rank scripts on the node's ranks at once; its
    output captured."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), rank_script)
    return subprocess.run([sys.executable, "-m", "megatron_musa_patch.cli.main", "run",
                           "--standalone", "--nproc-per-node", str(nproc), path, *args],
                          env=dict(os.environ, **env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)


def _real_step(script: str, args: list, nproc: int) -> dict:
    """The median step and forward-backward seconds of rank 0, past the first steps."""
    with tempfile.TemporaryDirectory(prefix="mmp-calibrate-step-") as out:
        done = _on_node_ranks(nproc, "plan_calibrate_step.py", [script, *args],
                              MMP_PLAN_CALIBRATE_STEP_OUT=out)
        path = os.path.join(out, "rank0.json")
        if done.returncode != 0 or not os.path.exists(path):
            raise MegatronMusaPatchError(
                f"mmp plan --calibrate: the timed run of {script} failed:\n"
                + done.stdout.decode(errors="replace")[-3000:])
        with open(path, encoding="utf-8") as f:
            row = json.load(f)
    if len(row["steps_s"]) <= WARMUP:
        raise MegatronMusaPatchError(
            f"mmp plan --calibrate: the timed run of {script} made {len(row['steps_s'])} "
            f"steps; --train-iters {STEPS} was asked for.")
    return {"steps_s": statistics.median(row["steps_s"][WARMUP:]),
            "passes_s": statistics.median(row["passes_s"][WARMUP:])}
