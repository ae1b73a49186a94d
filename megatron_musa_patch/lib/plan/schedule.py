"""Pipeline schedules as Megatron orders them, timed: when each stage runs each forward and
backward, given how long they take, and what that leaves idle.

``order`` lists a stage's operations in the order Megatron's schedule runs them (1F1B; the
interleaved schedule with micro-batches grouped by the pipeline size; ZB-H1, whose held-back
weight gradients ``W`` are placed by the schedule's own decision code,
``lib/pipeline/zero_bubble.py``); ``simulate`` starts each operation as soon as its stage is free
and its input has arrived (the previous virtual stage's forward, the next one's backward, plus
the transfer; a ``W`` needs only its own backward) and returns each stage's finish and busy time.
The bubble of a stage is its idle share of the longest stage's time.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

Op = Tuple[str, int, int]  # ("F" | "B" | "W", micro-batch, model chunk)


def order(stage: int, stages: int, microbatches: int, chunks: int = 1,
          zero_bubble: bool = False) -> List[Op]:
    if zero_bubble:
        return zero_bubble_order(stage, stages, microbatches)
    if chunks == 1:
        warmup = min(stages - stage - 1, microbatches)
        forwards = [("F", k, 0) for k in range(microbatches)]
        backwards = [("B", k, 0) for k in range(microbatches)]
    else:
        total = microbatches * chunks
        warmup = min(total, (stages - stage - 1) * 2 + (chunks - 1) * stages)
        forwards = [("F", _microbatch(k, stages, chunks), (k // stages) % chunks)
                    for k in range(total)]
        backwards = [("B", _microbatch(k, stages, chunks), chunks - 1 - (k // stages) % chunks)
                     for k in range(total)]
    ops: List[Op] = forwards[:warmup]
    rest_f, rest_b = forwards[warmup:], backwards
    for i, f in enumerate(rest_f):
        ops.append(f)
        ops.append(rest_b[i])
    ops.extend(rest_b[len(rest_f):])
    return ops


def zero_bubble_order(stage: int, stages: int, microbatches: int) -> List[Op]:
    """ZB-H1's order for one stage: 1F1B's calls told to the schedule's own ``ZeroBubbleH1``,
    each ``W`` where it runs it (after its ``B`` when not held back)."""
    from megatron_musa_patch.lib.pipeline.weight_gradients import WeightGradients
    from megatron_musa_patch.lib.pipeline.zero_bubble import ZeroBubbleH1

    store = WeightGradients()
    decisions = ZeroBubbleH1(store, microbatches, reduce_in_last_backward=False)
    ops: List[Op] = []
    backwards = iter(range(microbatches))

    def backward():
        mb = next(backwards)
        ops.append(("B", mb, 0))
        if store.collecting:
            store.defer(lambda mb=mb: ops.append(("W", mb, 0)))
        else:
            ops.append(("W", mb, 0))

    for kind, mb, _ in order(stage, stages, microbatches):
        if kind == "F":
            ops.append(("F", mb, 0))
            continue
        decisions.backward(backward)
        decisions.after_gradient_sent()  # B's gradient leaves when B ends (simulate's rule)
    decisions.finish()
    return ops


def _microbatch(k: int, stages: int, chunks: int) -> int:
    group = stages * chunks
    return (k // group) * stages + k % stages


@dataclasses.dataclass
class Timeline:
    makespan: float
    finish: List[float]
    busy: List[float]
    events: Dict[int, List[Tuple[str, int, int, float, float]]]

    def bubble(self, stage: int) -> float:
        return 1.0 - self.busy[stage] / self.makespan if self.makespan else 0.0


def simulate(forward_s: Sequence[float], backward_s: Sequence[float], microbatches: int,
             chunks: int = 1, transfer_s: float = 0.0,
             weight_s: Optional[Sequence[float]] = None, zero_bubble: bool = False) -> Timeline:
    """``forward_s[s]`` / ``backward_s[s]``: one micro-batch through one model chunk of stage s;
    ``weight_s[s]``: its weight gradients, inside the backward pass unless ``zero_bubble``
    (ZB-H1) holds them back."""
    stages = len(forward_s)
    weight_s = list(weight_s) if weight_s is not None else [0.0] * stages
    if not zero_bubble:
        backward_s = [b + w for b, w in zip(backward_s, weight_s)]
    plans = [order(s, stages, microbatches, chunks, zero_bubble) for s in range(stages)]
    done: Dict[Tuple[str, int, int, int], float] = {}  # (kind, micro-batch, virtual stage)
    free = [0.0] * stages
    busy = [0.0] * stages
    nxt = [0] * stages
    events: Dict[int, List[Tuple[str, int, int, float, float]]] = {s: [] for s in range(stages)}
    last = stages * chunks - 1
    remaining = sum(len(p) for p in plans)
    while remaining:
        progressed = False
        for s in range(stages):
            while nxt[s] < len(plans[s]):
                kind, mb, chunk = plans[s][nxt[s]]
                virtual = chunk * stages + s
                if kind == "F":
                    dep = ("F", mb, virtual - 1) if virtual > 0 else None
                elif kind == "W":
                    dep = ("B", mb, virtual)
                else:
                    dep = ("B", mb, virtual + 1) if virtual < last else ("F", mb, virtual)
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + (
                    transfer_s if dep[2] != virtual else 0.0)
                start = max(free[s], ready)
                length = {"F": forward_s, "B": backward_s, "W": weight_s}[kind][s]
                free[s] = start + length
                busy[s] += length
                done[(kind, mb, virtual)] = free[s]
                events[s].append((kind, mb, chunk, start, free[s]))
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule's order deadlocks (a bug in schedule.order)")
    return Timeline(makespan=max(free) if free else 0.0, finish=free, busy=busy, events=events)


def equal_stages_bubble(stages: int, microbatches: int, chunks: int = 1) -> float:
    """(p-1) / (v*m + p-1): 1F1B's idle share with equal stages and free transfers."""
    if stages <= 1:
        return 0.0
    return (stages - 1) / (chunks * microbatches + stages - 1)


def simulate_v(schedule: str, forward_s: Sequence[float], backward_s: Sequence[float],
               weight_s: Sequence[float], microbatches: int,
               transfer_s: float = 0.0) -> Timeline:
    """A V schedule (``lib/pipeline/v_shape.py``: ``zb-v``, ``dualpipev``) run by ``len(forward_s)``
    ranks: ``forward_s[r]`` / ``backward_s[r]`` / ``weight_s[r]``: one micro-batch through one
    model chunk of rank r, its input gradient and its weight gradient. Events are
    ``(kind, micro-batch, chunk, start, end)``."""
    from megatron_musa_patch.lib.pipeline import v_shape

    ranks = len(forward_s)
    plan = v_shape.orders(schedule, ranks, microbatches)
    length = {"F": forward_s, "I": backward_s, "W": weight_s,
              "B": [b + w for b, w in zip(backward_s, weight_s)]}
    done: Dict[Tuple[str, int, int], float] = {}  # (kind, stage, micro-batch) -> end
    free, busy, nxt = [0.0] * ranks, [0.0] * ranks, [0] * ranks
    events: Dict[int, List[Tuple[str, int, int, float, float]]] = {r: [] for r in range(ranks)}
    remaining = sum(len(ops) for ops in plan.values())
    while remaining:
        progressed = False
        for r in range(ranks):
            while nxt[r] < len(plan[r]):
                op = plan[r][nxt[r]]
                need = v_shape.needs(op, ranks)
                ready = 0.0
                if need is not None:
                    kinds, stage, mb = need
                    ends = [done[(k, stage, mb)] for k in kinds.split("|")
                            if (k, stage, mb) in done]
                    if not ends:
                        break
                    hop = v_shape.rank_of(stage, ranks) != r
                    ready = ends[0] + (transfer_s if hop else 0.0)
                start = max(free[r], ready)
                free[r] = start + length[op.kind][r]
                busy[r] += length[op.kind][r]
                done[(op.kind, op.stage, op.microbatch)] = free[r]
                events[r].append((op.kind, op.microbatch, v_shape.chunk_of(op.stage, ranks),
                                  start, free[r]))
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"the {schedule} order deadlocks (a bug in v_shape.order)")
    return Timeline(makespan=max(free), finish=free, busy=busy, events=events)

