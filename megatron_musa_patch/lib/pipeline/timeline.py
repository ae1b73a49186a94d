"""What one pipeline rank ran in one schedule call: its operations, each with its start and end.

Kinds: ``F`` (a forward pass), ``B`` (a backward pass; its weight gradient too unless held
back), ``W`` (held-back weight gradients), and the schedule's point-to-point calls by
megatron-core's name (``recv_forward``, ``send_backward``, ``send_forward_recv_backward``, ...).
The clock synchronises the device at each edge, so a span is what the device took.

A stage's idle share is the part of the call's wall time that none of ``F``, ``B`` or ``W``
covers: waiting for its neighbours and the transfers themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable, List

COMPUTE = ("F", "B", "W")


@dataclasses.dataclass(frozen=True)
class Span:
    kind: str
    microbatch: int  # -1 where the call is not one micro-batch's
    start: float
    end: float
    chunk: int = 0  # the model chunk (virtual stage) of F, B and W


class Timeline:
    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.spans: List[Span] = []
        self.start = clock()
        self.end = self.start

    @contextlib.contextmanager
    def span(self, kind: str, microbatch: int = -1, chunk: int = 0):
        begin = self.clock()
        try:
            yield
        finally:
            self.end = self.clock()
            self.spans.append(Span(kind, microbatch, begin, self.end, chunk))

    def close(self) -> None:
        self.end = self.clock()

    def busy_s(self) -> float:
        return sum(s.end - s.start for s in self.spans if s.kind in COMPUTE)

    def idle_fraction(self) -> float:
        wall = self.end - self.start
        return max(1.0 - self.busy_s() / wall, 0.0) if wall > 0 else 0.0

    def as_dict(self) -> dict:
        """Times in seconds from the call's start."""
        return {"wall_s": self.end - self.start, "idle_fraction": self.idle_fraction(),
                "ops": [{"kind": s.kind, "microbatch": s.microbatch, "chunk": s.chunk,
                         "start_s": s.start - self.start, "end_s": s.end - self.start}
                        for s in self.spans]}


def misplaced_weight_gradients(ops: List[dict]) -> List[str]:
    """A recorded timeline's ``W`` that ran before its micro-batch's ``B`` (in its model chunk)
    had ended (a lost ``W`` shows in the gradients instead)."""
    problems = []
    backward_end = {}
    for op in ops:
        key = (op.get("chunk", 0), op["microbatch"])
        if op["kind"] == "B":
            backward_end[key] = op["end_s"]
        elif op["kind"] == "W":
            if key not in backward_end or op["start_s"] < backward_end[key]:
                problems.append(f"W of micro-batch {key[1]} (chunk {key[0]}) ran before its B")
    return problems
