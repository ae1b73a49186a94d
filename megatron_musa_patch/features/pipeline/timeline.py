"""``--pipeline-timeline DIR``: what each pipeline rank ran in each training step, and the idle
share of every stage against the schedule's theoretical bubble.

Each rank appends one JSON line per step to ``DIR/rank<R>.jsonl``: the schedule (``1f1b``,
``zb-h1``, ``interleaved``, ``zb-v``, ``dualpipev``), its stage, the micro-batches, and its
operations in order (``F``, ``B``, ``W``, the point-to-point calls) with their model chunk,
start and end (``lib/pipeline/timeline.py``).
Rank 0 prints one line per step: each stage's measured idle share and the bubble the schedule's
formula (1F1B, ZB-H1) or the planner's simulation of its order (the V schedules) gives for that
stage's own measured ``F``, ``B`` and ``W``. The clock synchronises the
device at each edge, which costs time: ask for it on the steps you study.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.lib.pipeline.run import RUN_KEY, PipelineRun
from megatron_musa_patch.lib.pipeline.timeline import COMPUTE, Timeline
from megatron_musa_patch.lib.pipeline.v_shape import SCHEDULES as V_SCHEDULES
from megatron_musa_patch.lib.pipeline.zero_bubble import theoretical_bubble

# after the zero-bubble schedule: these spans sit inside its wrappers, so the held-back W it
# runs around a backward pass or a wait for a gradient are not timed as B or as the wait
FEATURE = feature(__name__, "--pipeline-timeline DIR: each stage's operations and idle share",
                  after=("pipeline.zero_bubble",))

SCHEDULES = "megatron.core.pipeline_parallel.schedules:"
P2P = "megatron.core.pipeline_parallel.p2p_communication:P2PCommunicator."
#: the point-to-point calls megatron-core's schedules make
P2P_CALLS = ("recv_forward", "recv_backward", "send_forward", "send_backward",
             "send_forward_recv_backward", "send_backward_recv_forward",
             "send_forward_recv_forward", "send_backward_recv_backward",
             "send_forward_backward_recv_forward_backward")


@hookimpl
def mmp_register_patches(session, registry):
    run = session.state_for(RUN_KEY, PipelineRun)

    def add(part, target, impl, why):
        registry.add(FEATURE.patch(part, target, "wrap", functools.partial(impl, run), why=why))

    for name, label in (("forward_backward_pipelining_without_interleaving", "1f1b"),
                        ("forward_backward_pipelining_with_interleaving", "interleaved")):
        add(f"schedule_{label}", SCHEDULES + name, functools.partial(_schedule, label),
            "--pipeline-timeline: the step's operations recorded, the stages' idle shares said")
    add("forward_step", SCHEDULES + "forward_step", functools.partial(_span, "F"),
        "--pipeline-timeline: each forward pass timed")
    add("backward_step", SCHEDULES + "backward_step", functools.partial(_span, "B"),
        "--pipeline-timeline: each backward pass timed")
    for call in P2P_CALLS:
        add(f"p2p_{call}", P2P + call, functools.partial(_span, call),
            "--pipeline-timeline: each point-to-point call timed")


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group(title="pipeline timeline (megatron_musa_patch)")
    group.add_argument("--pipeline-timeline", metavar="DIR", default=None,
                       help="Record each step's pipeline operations (forward, backward, held-back "
                            "weight gradients, sends and receives, with times) to "
                            "DIR/rank<R>.jsonl, and print each stage's idle share against the "
                            "schedule's theoretical bubble. Synchronises the device around each "
                            "operation.")
    return parser


@hookimpl
def mmp_validate_args(args):
    folder = getattr(args, "pipeline_timeline", None)
    if folder and args.pipeline_model_parallel_size < 2:
        raise ArgumentError(
            f"--pipeline-timeline {folder}: records the pipeline schedule's operations, and "
            f"there is no pipeline at --pipeline-model-parallel-size "
            f"{args.pipeline_model_parallel_size}: add --pipeline-model-parallel-size 2 or "
            f"more, or drop the flag.")


@hookimpl
def mmp_transformer_config(args, config):
    config.pipeline_timeline = getattr(args, "pipeline_timeline", None)


def _clock():
    import time

    import torch

    def now():
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    return now


def _schedule(label, run: PipelineRun, wrapped, instance, args, kwargs):
    from megatron.core.utils import get_model_config

    model = kwargs["model"]  # the schedules take keyword arguments only
    config = get_model_config(model[0] if isinstance(model, list) else model)
    folder = getattr(config, "pipeline_timeline", None)
    if not folder or kwargs.get("forward_only") or run.timeline is not None:
        return wrapped(*args, **kwargs)
    run.timeline = Timeline(_clock())
    run.forwards = run.backwards = 0
    run.store.around = lambda kind, microbatch: run.timeline.span(kind, microbatch, run.chunk)
    try:
        result = wrapped(*args, **kwargs)
        run.timeline.close()
        schedule = ("zb-h1" if getattr(config, "enable_zero_bubble", False)
                    else getattr(config, "pipeline_v_schedule", None) or label)
        _report(folder, run, schedule, kwargs["num_microbatches"])
        return result
    finally:
        run.calls += 1
        run.timeline = None
        run.store.around = None


def _span(kind, run: PipelineRun, wrapped, instance, args, kwargs):
    if run.timeline is None:
        return wrapped(*args, **kwargs)
    microbatch = -1
    if kind == "F":
        microbatch, run.forwards = run.forwards, run.forwards + 1
    elif kind == "B":
        microbatch, run.backwards = run.backwards, run.backwards + 1
    with run.timeline.span(kind, microbatch, run.chunk):
        return wrapped(*args, **kwargs)


def _report(folder: str, run: PipelineRun, schedule: str, microbatches: int) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    stage = parallel_state.get_pipeline_model_parallel_rank()
    stages = parallel_state.get_pipeline_model_parallel_world_size()
    record = {"iteration": run.calls, "schedule": schedule, "stage": stage, "stages": stages,
              "microbatches": microbatches, **run.timeline.as_dict()}
    record["theoretical_bubble"] = _theory(record, schedule)
    os.makedirs(folder, exist_ok=True)
    rank = dist.get_rank() if dist.is_initialized() else 0
    with open(os.path.join(folder, f"rank{rank:05d}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    shares = [(record["idle_fraction"], record["theoretical_bubble"])]
    if dist.is_initialized() and stages > 1:
        shares = [None] * stages
        dist.all_gather_object(shares, shares_of(record),
                               group=parallel_state.get_pipeline_model_parallel_group())
    if rank == 0:
        said = "  ".join(f"{i}: {idle:.3f} (theory "
                         f"{'n/a' if theory is None else format(theory, '.3f')})"
                         for i, (idle, theory) in enumerate(shares))
        print(f"pipeline timeline: step {run.calls + 1}, {schedule}, {microbatches} "
              f"micro-batches, idle share by stage  {said}", file=sys.stderr, flush=True)


def shares_of(record: dict):
    return record["idle_fraction"], record["theoretical_bubble"]


def _theory(record: dict, schedule: str):
    """The schedule's bubble for this stage's own median F and B and its mean W per micro-batch
    (none where W runs inside B), every stage taken as this one: the paper's formula for 1F1B
    and ZB-H1, the planner's simulation of the order for the V schedules; None for the
    interleaved schedule."""
    if schedule == "interleaved":
        return None
    durations = {kind: [op["end_s"] - op["start_s"] for op in record["ops"] if op["kind"] == kind]
                 for kind in COMPUTE}
    forward = statistics.median(durations["F"]) if durations["F"] else 0.0
    backward = statistics.median(durations["B"]) if durations["B"] else 0.0
    weight = sum(durations["W"]) / max(len(durations["B"]), 1)
    if schedule in V_SCHEDULES:
        from megatron_musa_patch.lib.plan.schedule import simulate_v

        ranks = record["stages"]
        timeline = simulate_v(schedule, [forward] * ranks, [backward] * ranks, [weight] * ranks,
                              record["microbatches"])
        return timeline.bubble(record["stage"])
    return theoretical_bubble(record["stages"], record["microbatches"], forward, backward,
                              weight, schedule)
