"""Middle pipeline stages from two of them: where the stages between the first and the last run
the same layers (the same weights, work and collectives), they differ only in how many
micro-batches each holds in flight, which under 1F1B falls by one per stage (p - s, while there
are at least p micro-batches). Their memory is then a straight line between the second stage and
the one before the last, and planning those two gives the rest exactly."""

from __future__ import annotations

from typing import Optional

#: the memory figures that depend on the micro-batches in flight
IN_FLIGHT = ("first_step_peak", "steady_peak", "step_peak", "step_peak_rounded")
#: what must agree for two middle stages to be the same but for what is in flight
SAME = ("weights", "gradients", "optimizer", "setup_peak")


def interpolable(pp: int, vpp: int, microbatches: int) -> bool:
    """Whether a pipeline's middle stages may come from two: at least three between the ends,
    one chunk per rank (interleaving holds another pattern in flight), and every stage's warm-up
    below the micro-batches (else the first stages all hold the same number)."""
    return pp >= 5 and vpp == 1 and microbatches >= pp


def same_but_in_flight(a: dict, b: dict) -> bool:
    def canonical(rows):
        return sorted(tuple(row) for row in rows)

    return (all(a["memory"][k] == b["memory"][k] for k in SAME)
            and a["work"].keys() == b["work"].keys()
            and all(canonical(a["work"][p]) == canonical(b["work"][p]) for p in a["work"])
            and canonical(a["comms"]) == canonical(b["comms"])
            and a["microbatches"] == b["microbatches"])


def between(low: dict, high: dict, stage: int, rank: int) -> Optional[dict]:
    """Stage ``stage``'s result from ``low`` (an earlier middle stage) and ``high`` (a later
    one), or None where they differ in more than what is in flight."""
    if not same_but_in_flight(low, high):
        return None
    t = (stage - low["stage"]) / (high["stage"] - low["stage"])
    memory = dict(low["memory"])
    for key in IN_FLIGHT:
        memory[key] = round(low["memory"][key] + t * (high["memory"][key] - low["memory"][key]))
    return dict(low, stage=stage, rank=rank, memory=memory, interpolated=True)
