"""The V schedules (lib/pipeline/v_shape.py, v_executor.py): the placement, torch's orders read
per rank, and one executor per rank (threads, a queue per pair of ranks that checks each
transfer arrives as the message the receiver posted for) training a toy 2p-stage pipeline to the
gradients of the same model run in one piece."""

import queue
import threading

import pytest
import torch

from megatron_musa_patch.lib.pipeline import v_shape
from megatron_musa_patch.lib.pipeline.v_executor import VPipeline

SCHEDULES = ("zb-v", "dualpipev")


def test_the_v_places_rank_r_at_stages_r_and_2p_minus_1_minus_r():
    assert [v_shape.stages_of(r, 4) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert [v_shape.rank_of(s, 4) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [v_shape.chunk_of(s, 4) for s in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("ranks,microbatches", [(2, 4), (2, 8), (4, 8), (4, 16), (8, 16)])
def test_torchs_orders_run_every_pass_once_and_never_deadlock(schedule, ranks, microbatches):
    plan = v_shape.orders(schedule, ranks, microbatches)
    v_shape.check(plan, ranks, microbatches)  # raises on a missing pass or a deadlock
    kinds = {op.kind for ops in plan.values() for op in ops}
    assert {"F", "I", "W"} <= kinds  # weight gradients are split off and placed


def test_the_check_catches_a_lost_w_and_an_order_that_deadlocks():
    plan = v_shape.orders("zb-v", 2, 4)
    lost = {r: [op for op in ops if not (op.kind == "W" and op.microbatch == 3)]
            for r, ops in plan.items()}
    with pytest.raises(ValueError, match=r"micro-batch 3: \['F', 'I'\]"):
        v_shape.check(lost, 2, 4)
    # rank 0 starts with its chunk 1 (the last stage), whose input comes from the others
    last_first = {**plan, 0: sorted(plan[0], key=lambda op: op.stage != 3)}
    with pytest.raises(ValueError, match="the order deadlocks"):
        v_shape.check(last_first, 2, 4)


def test_messages_list_what_each_neighbour_receives_in_the_senders_order():
    ops = v_shape.order("zb-v", 1, 2, 4)  # rank 1 of 2: stages 1 and 2, hands 1 -> 2 itself
    sent = v_shape.messages(ops, 2)
    assert list(sent) == [0]  # rank 1 talks to rank 0 only
    # stage 2's outputs go to stage 3 (rank 0), stage 1's input gradients to stage 0 (rank 0)
    assert {(m.what, m.stage) for m in sent[0]} == {("activation", 3), ("gradient", 0)}
    order_of_sends = [(m.what, m.microbatch) for m in sent[0]]
    assert [mb for what, mb in order_of_sends if what == "activation"] == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- the executor


class Toy:
    """2p stages of Linear+tanh; the last one's output is the loss input."""

    def __init__(self, ranks, width=8, seed=0):
        torch.manual_seed(seed)
        self.layers = [torch.nn.Linear(width, width).double() for _ in range(2 * ranks)]
        self.batches = [torch.randn(3, width, dtype=torch.float64) for _ in range(16)]

    def forward(self, stage, x):
        return torch.tanh(self.layers[stage](x))


class ToySteps:
    def __init__(self, toy, rank, ranks, log):
        self.toy, self.rank, self.ranks, self.log = toy, rank, ranks, log
        self.held = {}
        self.losses = {}

    def forward(self, chunk, microbatch, input_tensor, is_last):
        stage = v_shape.stages_of(self.rank, self.ranks)[chunk]
        x = self.toy.batches[microbatch] if input_tensor is None else input_tensor
        out = self.toy.forward(stage, x)
        if is_last:
            out = (out ** 2).sum()
            self.losses[microbatch] = out.item()
        self.log.append(("F", stage, microbatch))
        return out

    def sent(self, output_tensor):
        pass

    def backward(self, chunk, stage, microbatch, input_tensor, output_tensor, output_grad,
                 weights_later):
        layer = self.toy.layers[stage]
        inputs = [p for p in (input_tensor,) if p is not None] + [layer.weight, layer.bias]
        grads = torch.autograd.grad(output_tensor, inputs, grad_outputs=output_grad)
        weight_grads = grads[-2:]
        if weights_later:
            self.held[(stage, microbatch)] = (layer, weight_grads)
        else:
            self._add(layer, weight_grads)
        self.log.append(("I" if weights_later else "B", stage, microbatch))
        return grads[0] if input_tensor is not None else None

    def weight(self, stage, microbatch):
        layer, weight_grads = self.held.pop((stage, microbatch))
        self._add(layer, weight_grads)
        self.log.append(("W", stage, microbatch))

    @staticmethod
    def _add(layer, weight_grads):
        for param, grad in zip((layer.weight, layer.bias), weight_grads):
            param.grad = grad.clone() if param.grad is None else param.grad + grad


class Queues:
    """One queue per ordered pair of ranks: a receive gets the next item its sender queued, and
    it must be the message the receiver posted for."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queues = {}

    def of(self, src, dst):
        with self.lock:
            return self.queues.setdefault((src, dst), queue.Queue())


class Posted:
    def __init__(self, peer, message):
        self.peer, self.message, self.tensor = peer, message, None


class QueueTransport:
    """Receives complete in the order they were posted, each with the next item its sender
    queued, as a backend matches point-to-point transfers."""

    def __init__(self, queues, rank):
        self.queues, self.rank = queues, rank
        self.posted = {}

    def post_receive(self, peer, message):
        handle = Posted(peer, message)
        self.posted.setdefault(peer, []).append(handle)
        return handle

    def wait(self, handle):
        pending = self.posted[handle.peer]
        while handle.tensor is None:
            first = pending.pop(0)
            arrived, first.tensor = self.queues.of(handle.peer, self.rank).get(timeout=30)
            assert arrived == first.message, \
                f"rank {self.rank} posted for {first.message}, got {arrived}"
        return handle.tensor

    def send(self, tensor, peer, message):
        self.queues.of(self.rank, peer).put((message, tensor.detach().clone()))

    def finish(self):
        pass


def _run_pipeline(schedule, ranks, microbatches):
    toy = Toy(ranks)
    plan = v_shape.orders(schedule, ranks, microbatches)
    queues, logs, errors = Queues(), {r: [] for r in range(ranks)}, []
    steps = {r: ToySteps(toy, r, ranks, logs[r]) for r in range(ranks)}

    def rank_main(rank):
        try:
            VPipeline(rank, ranks, plan, steps[rank], QueueTransport(queues, rank)).run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append((rank, exc))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return toy, steps, logs


def _reference(ranks, microbatches):
    toy = Toy(ranks)
    losses = []
    for mb in range(microbatches):
        x = toy.batches[mb]
        for stage in range(2 * ranks):
            x = toy.forward(stage, x)
        loss = (x ** 2).sum()
        loss.backward()
        losses.append(loss.item())
    return toy, losses


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("ranks,microbatches", [(2, 4), (3, 6), (4, 8)])
def test_each_rank_running_its_order_gives_the_whole_models_gradients(schedule, ranks,
                                                                      microbatches):
    toy, steps, logs = _run_pipeline(schedule, ranks, microbatches)
    reference, losses = _reference(ranks, microbatches)
    assert [steps[0].losses[mb] for mb in range(microbatches)] == pytest.approx(losses, rel=1e-12)
    for layer, expected in zip(toy.layers, reference.layers):
        torch.testing.assert_close(layer.weight.grad, expected.weight.grad, rtol=1e-10, atol=0)
        torch.testing.assert_close(layer.bias.grad, expected.bias.grad, rtol=1e-10, atol=0)
    for rank, log in logs.items():
        assert log == [(op.kind, op.stage, op.microbatch) for op in v_shape.order(
            schedule, rank, ranks, microbatches)]
        assert not steps[rank].held  # every W ran
