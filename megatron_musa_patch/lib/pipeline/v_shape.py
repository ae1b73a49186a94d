"""The V-shaped pipelines (ZB-V, DualPipeV): where each stage lives and the order each rank runs.

With ``p`` ranks and two model chunks per rank, the ``2p`` stages go down the ranks and back up:
rank ``r`` holds stage ``r`` (chunk 0) and stage ``2p-1-r`` (chunk 1). Rank 0 holds the first
stage (the embedding) and the last (the loss), rank ``p-1`` hands chunk 0's output to its own
chunk 1 without a transfer, and every rank starts and ends its work at about the same time,
which is what lets the weight gradients (``W``) fill the bubbles.

The orders are torch's own (``torch.distributed.pipelining``'s ``ScheduleZBVZeroBubble``, the
paper's ZB-V, and ``ScheduleDualPipeV``, DeepSeek's DualPipe on the V), read from their
per-rank planners: the same schedules torch's pipelining runtime executes, run here on
megatron-core's model chunks, forward and backward steps. Operations: ``F`` (forward), ``B`` (a
full backward pass), ``I`` (a backward pass without its weight gradients) and ``W`` (the weight
gradients an ``I`` left).

``messages`` lists what each rank sends each neighbour, in order: a receiver posts its receives
in the sender's order, so each pair's transfers match on any backend, tags or not.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Dict, List, Tuple

SCHEDULES = {"zb-v": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
#: the kinds torch's planners use, by the value of their ``_ComputationType``
KINDS = {"F": "F", "B": "B", "I": "I", "W": "W"}


@dataclasses.dataclass(frozen=True)
class Op:
    kind: str  # "F" | "B" | "I" | "W"
    stage: int  # 0 .. 2p-1
    microbatch: int


def stages_of(rank: int, ranks: int) -> Tuple[int, int]:
    """The stages of ``rank``'s chunk 0 and chunk 1."""
    return rank, 2 * ranks - 1 - rank


def rank_of(stage: int, ranks: int) -> int:
    return stage if stage < ranks else 2 * ranks - 1 - stage


def chunk_of(stage: int, ranks: int) -> int:
    return 0 if stage < ranks else 1


def minimum_microbatches(schedule: str, ranks: int) -> int:
    """DualPipeV needs a micro-batch for each stage; ZB-V fills in for fewer."""
    return 2 * ranks if schedule == "dualpipev" else 1


def order(schedule: str, rank: int, ranks: int, microbatches: int) -> List[Op]:
    """One rank's operations in the order ``schedule`` runs them."""
    if schedule == "forward-only":
        return [Op("F", stage, mb) for stage in stages_of(rank, ranks)
                for mb in range(microbatches)]
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown V schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
    from torch.distributed.pipelining import schedules

    planner = getattr(schedules, SCHEDULES[schedule])
    # the planners read the pipeline's size and the micro-batches, nothing of the stages
    state = types.SimpleNamespace(pp_group_size=ranks, num_stages=2 * ranks,
                                  _num_stages=2 * ranks, _n_microbatches=microbatches)
    ops: List[Op] = []
    for action in planner._calculate_single_rank_operations(state, rank):
        if action is None:
            continue
        for step in action.sub_actions or (action,):
            kind = KINDS[step.computation_type.value]
            ops.append(Op(kind, step.stage_index, step.microbatch_index))
    return ops


def orders(schedule: str, ranks: int, microbatches: int) -> Dict[int, List[Op]]:
    return {rank: order(schedule, rank, ranks, microbatches) for rank in range(ranks)}


@dataclasses.dataclass(frozen=True)
class Message:
    what: str  # "activation" (an F's output) | "gradient" (a backward pass's input gradient)
    stage: int  # the stage that receives it
    microbatch: int


def sent(op: Op, ranks: int):
    """(destination rank, message) of what ``op`` sends to another rank, or None."""
    last = 2 * ranks - 1
    if op.kind == "F" and op.stage < last:
        to = op.stage + 1
        message = Message("activation", to, op.microbatch)
    elif op.kind in ("B", "I") and op.stage > 0:
        to = op.stage - 1
        message = Message("gradient", to, op.microbatch)
    else:
        return None
    if rank_of(to, ranks) == rank_of(op.stage, ranks):
        return None  # rank p-1 hands it from one chunk to the other
    return rank_of(to, ranks), message


def messages(ops: List[Op], ranks: int) -> Dict[int, List[Message]]:
    """What a rank running ``ops`` sends each other rank, in the order it sends them."""
    out: Dict[int, List[Message]] = {}
    for op in ops:
        hop = sent(op, ranks)
        if hop is not None:
            out.setdefault(hop[0], []).append(hop[1])
    return out


def check(plan: Dict[int, List[Op]], ranks: int, microbatches: int) -> None:
    """Every stage runs each micro-batch's F once, and B once or I then W; each rank's
    operations after their inputs (raises ValueError otherwise)."""
    for rank, ops in plan.items():
        for stage in stages_of(rank, ranks):
            for mb in range(microbatches):
                kinds = [op.kind for op in ops if op.stage == stage and op.microbatch == mb]
                if kinds not in (["F", "B"], ["F", "I", "W"]):
                    raise ValueError(f"rank {rank}, stage {stage}, micro-batch {mb}: {kinds}")
    finished = set()
    position = {rank: 0 for rank in plan}
    while any(position[r] < len(plan[r]) for r in plan):
        progressed = False
        for rank, ops in plan.items():
            while position[rank] < len(ops) and _ready(ops[position[rank]], finished, ranks):
                op = ops[position[rank]]
                finished.add((op.kind, op.stage, op.microbatch))
                position[rank] += 1
                progressed = True
        if not progressed:
            stuck = {r: plan[r][position[r]] for r in plan if position[r] < len(plan[r])}
            raise ValueError(f"the order deadlocks: {stuck}")


def needs(op: Op, ranks: int):
    """The operation whose result ``op`` starts from, or None."""
    last = 2 * ranks - 1
    if op.kind == "F":
        return ("F", op.stage - 1, op.microbatch) if op.stage > 0 else None
    if op.kind == "W":
        return ("I", op.stage, op.microbatch)
    if op.stage == last:
        return ("F", op.stage, op.microbatch)
    return ("B|I", op.stage + 1, op.microbatch)


def _ready(op: Op, finished, ranks: int) -> bool:
    need = needs(op, ranks)
    if need is None:
        return True
    kind, stage, mb = need
    return any((k, stage, mb) in finished for k in kind.split("|"))
