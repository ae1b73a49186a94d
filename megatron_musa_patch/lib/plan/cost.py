"""A planned rank's step priced on a device profile: its ops and collectives, as the fake run
recorded them (``cli/plan_worker.py``), each given a time.

An op takes the longer of its floating-point work at the device's GEMM throughput for an op of
that size and its bytes at the memory bandwidth (a compiled region's at its own rate), plus the
cost of issuing one op, then what a real step adds to it (``Profile.op_seconds``: a factor for a
micro-batch's ops and another for the update's, a cost per op); a collective
takes its ring's steps of latency plus its volume over the link it crosses (within a node or
between nodes), plus what a step adds to each (its backend waking after compute), and a
micro-batch whose ranks meet at collectives waits for the slowest of them (a share of its
compute). Collectives asked for asynchronously (gradient buckets reduced during the backward
pass) hide behind the compute of their phase as far as the device lets them (its
``collective_overlap``), and what exceeds it shows.
"""

from __future__ import annotations

import dataclasses
from typing import Dict

from .profile import Profile

P2P = ("isend", "irecv", "send", "recv")
#: the phases of a micro-batch (the rest is the step's update: gradients' reduction, optimizer)
MICROBATCH = ("forward", "backward")


@dataclasses.dataclass(frozen=True)
class StageCost:
    stage: int
    forward_s: float  # one micro-batch through one model chunk, with its collectives
    backward_s: float
    transfer_s: float  # one activation or gradient between neighbouring stages
    grad_sync_s: float  # what the gradients' reduction adds after the last backward
    optimizer_s: float
    other_s: float  # the step's own work outside the micro-batches
    compute_by_phase: Dict[str, float]
    comm_by_phase: Dict[str, float]


def price(result: dict, profile: Profile) -> StageCost:
    compute: Dict[str, float] = {}
    for phase, rows in result["work"].items():
        inside = phase in MICROBATCH
        compute[phase] = sum(n * profile.op_seconds(flops, nbytes, width, elements, inside,
                                                    bool(fused))
                             for flops, nbytes, width, elements, fused, n in rows)
    comm: Dict[str, float] = {}
    hidden: Dict[str, float] = {}
    transfers = []
    in_step, overlap = profile.collective_in_step_s(), profile.collective_overlap()
    synchronised = set()
    for op, nbytes, ranks, nodes, phase, overlapped, n in result["comms"]:
        seconds = profile.collective_seconds(op, nbytes, ranks, nodes)
        seconds = n * (seconds + in_step if seconds else 0.0)
        if op in P2P and phase == "schedule":
            transfers.append((seconds, n))
        elif overlapped:
            hidden[phase] = hidden.get(phase, 0.0) + overlap * seconds
            comm[phase] = comm.get(phase, 0.0) + (1.0 - overlap) * seconds
        else:
            comm[phase] = comm.get(phase, 0.0) + seconds
            if seconds and op not in P2P:
                synchronised.add(phase)
    # ranks meeting inside a micro-batch (tensor, expert parallelism) wait for the slowest
    for phase in synchronised & set(MICROBATCH):
        comm[phase] += profile.collective_wait_share() * compute.get(phase, 0.0)
    calls = max(result.get("forward_calls") or 1, 1)
    forward = (compute.get("forward", 0.0) + comm.get("forward", 0.0)) / calls
    backward = (compute.get("backward", 0.0) + comm.get("backward", 0.0)) / calls
    # a transfer's time: each send or receive pairs with one on the neighbour; per direction
    sent = sum(n for _, n in transfers)
    transfer = (sum(s for s, _ in transfers) / sent) if sent else 0.0
    exposed = sum(max(0.0, hidden.get(p, 0.0) - compute.get(p, 0.0)) for p in hidden)
    grad_sync = compute.get("grad_sync", 0.0) + comm.get("grad_sync", 0.0) + exposed
    optimizer = compute.get("optimizer", 0.0) + comm.get("optimizer", 0.0)
    other = sum(compute.get(p, 0.0) + comm.get(p, 0.0) for p in ("schedule", "other"))
    return StageCost(stage=result["stage"], forward_s=forward, backward_s=backward,
                     transfer_s=transfer, grad_sync_s=grad_sync, optimizer_s=optimizer,
                     other_s=other, compute_by_phase=compute,
                     comm_by_phase={**comm, **{f"{k} (overlapped)": v
                                               for k, v in hidden.items()}})
