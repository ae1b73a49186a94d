"""One rank's part of a V-shaped pipeline schedule call (``v_shape``): its operations in order,
each with its input received or handed over and its output sent.

The model's passes come from ``steps`` (megatron-core's ``forward_step`` / ``backward_step`` in
``features/pipeline/v_schedule.py``), the transfers from ``transport``. Sends do not wait;
receives are posted in the order the sending rank sends (``v_shape.messages``), as late as the
operation that needs them allows, so every pair of ranks matches its transfers on any backend.
Rank ``p-1`` hands chunk 0's output to its chunk 1, and chunk 1's input gradient back, without a
transfer.
"""

from __future__ import annotations

import collections
from typing import Any, Dict, List, Protocol, Tuple

from .v_shape import Message, Op, chunk_of, messages, rank_of


class Steps(Protocol):
    def forward(self, chunk: int, microbatch: int, input_tensor, is_last: bool) -> Any: ...

    def sent(self, output_tensor) -> None:
        """The output is on its way (or handed over): its memory may go."""

    def backward(self, chunk: int, stage: int, microbatch: int, input_tensor, output_tensor,
                 output_grad, weights_later: bool) -> Any: ...

    def weight(self, stage: int, microbatch: int) -> None: ...


class Transport(Protocol):
    def post_receive(self, peer: int, message: Message) -> Any: ...

    def wait(self, handle) -> Any: ...

    def send(self, tensor, peer: int, message: Message) -> None: ...

    def finish(self) -> None: ...


class VPipeline:
    def __init__(self, rank: int, ranks: int, plan: Dict[int, List[Op]], steps: Steps,
                 transport: Transport, keep_for_backward: bool = True):
        self.rank, self.ranks = rank, ranks
        self.keep_for_backward = keep_for_backward
        self.ops = plan[rank]
        self.steps, self.transport = steps, transport
        self.last = 2 * ranks - 1
        #: per neighbour, what it will send here, in its order; the receives not yet posted
        self.incoming = {peer: collections.deque(messages(ops, ranks).get(rank, []))
                         for peer, ops in plan.items() if peer != rank}
        self.posted: Dict[Message, Any] = {}
        #: what rank p-1 hands from one of its chunks to the other
        self.handed: Dict[Message, Any] = {}
        self.saved: Dict[Tuple[int, int], Tuple[Any, Any]] = {}

    def run(self) -> None:
        for op in self.ops:
            {"F": self._forward, "B": self._backward, "I": self._backward,
             "W": self._weight}[op.kind](op)
        # not on failure: a send whose receiver failed would never complete
        self.transport.finish()

    def _forward(self, op: Op) -> None:
        if op.stage == 0:
            input_tensor = None
        else:
            input_tensor = self._take(Message("activation", op.stage, op.microbatch),
                                      op.stage - 1)
            input_tensor.requires_grad_(self.keep_for_backward)
        output = self.steps.forward(chunk_of(op.stage, self.ranks), op.microbatch, input_tensor,
                                    op.stage == self.last)
        if self.keep_for_backward:
            self.saved[(op.stage, op.microbatch)] = (input_tensor, output)
        if op.stage < self.last:
            self._give(output.detach(), Message("activation", op.stage + 1, op.microbatch))
            self.steps.sent(output)

    def _backward(self, op: Op) -> None:
        output_grad = None
        if op.stage < self.last:
            output_grad = self._take(Message("gradient", op.stage, op.microbatch),
                                     op.stage + 1)
        input_tensor, output = self.saved.pop((op.stage, op.microbatch))
        input_grad = self.steps.backward(chunk_of(op.stage, self.ranks), op.stage,
                                         op.microbatch, input_tensor, output, output_grad,
                                         weights_later=op.kind == "I")
        if op.stage > 0:
            self._give(input_grad, Message("gradient", op.stage - 1, op.microbatch))

    def _weight(self, op: Op) -> None:
        self.steps.weight(op.stage, op.microbatch)

    def _give(self, tensor, message: Message) -> None:
        peer = rank_of(message.stage, self.ranks)
        if peer == self.rank:
            self.handed[message] = tensor.detach() if message.what == "activation" else tensor
        else:
            self.transport.send(tensor, peer, message)

    def _take(self, message: Message, from_stage: int):
        peer = rank_of(from_stage, self.ranks)
        if peer == self.rank:
            return self.handed.pop(message)
        pending = self.incoming[peer]
        while message not in self.posted:
            if not pending:
                raise RuntimeError(f"V schedule: rank {self.rank} waits for {message} from "
                                   f"rank {peer}, which its order never sends")
            expected = pending.popleft()
            self.posted[expected] = self.transport.post_receive(peer, expected)
        return self.transport.wait(self.posted.pop(message))
