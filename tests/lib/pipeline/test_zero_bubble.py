"""ZB-H1's decisions (lib/pipeline): which backward pass holds its weight gradients back, where
they run, and the theoretical bubbles; and one linear layer's held-back weight gradient against
upstream's own backward, bit for bit."""

import pytest
import torch

from megatron_musa_patch.lib.pipeline.timeline import Timeline, misplaced_weight_gradients
from megatron_musa_patch.lib.pipeline.weight_gradients import WeightGradients
from megatron_musa_patch.lib.pipeline.zero_bubble import ZeroBubbleH1, theoretical_bubble


def _one_f_one_b(stage, stages, microbatches, schedule, log):
    """megatron-core's non-interleaved 1F1B call sequence for one stage, told to ``schedule``
    (each backward pass defers one weight gradient, as a linear layer would)."""
    warmup = min(stages - 1 - stage, microbatches)
    store = schedule.store
    backwards = iter(range(microbatches))

    def backward():
        mb = next(backwards)
        log.append(("B", mb))
        if store.collecting:
            store.defer(lambda mb=mb: log.append(("W", mb)))
        else:
            log.append(("W", mb))

    for mb in range(warmup):
        log.append(("F", mb))
    for i in range(microbatches - warmup):
        log.append(("F", warmup + i))
        schedule.backward(backward)
        log.append(("sent", -1))
        schedule.after_gradient_sent()
    for _ in range(warmup):
        log.append(("wait", -1))
        schedule.backward(backward)
        log.append(("sent", -1))
        schedule.after_gradient_sent()
    schedule.finish()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_stage_sends_its_gradient_before_the_held_w_and_loses_none(stage):
    log = []
    schedule = ZeroBubbleH1(WeightGradients(), 8, reduce_in_last_backward=False)
    _one_f_one_b(stage, 4, 8, schedule, log)
    weights = [mb for kind, mb in log if kind == "W"]
    assert weights == list(range(8))  # every W, oldest first (1F1B's order of accumulation)
    for mb in range(8):  # each after its own B, and after that B's gradient was sent
        after = log.index(("B", mb))
        assert log[after + 1] == ("sent", -1) and log.index(("W", mb)) > after + 1
    # no W waits beyond its own pass's send: 1F1B's memory at the next forward pass
    most_behind = max(sum(1 for kind, m in log[:i] if kind == "B")
                      - sum(1 for kind, m in log[:i] if kind == "W") for i in range(len(log)))
    assert most_behind == 1
    # in the cool-down each wait for a gradient comes after the last pass's W ran
    waits = [i for i, (kind, _) in enumerate(log) if kind == "wait"]
    assert len(waits) == 3 - stage and all(log[i - 1][0] == "W" for i in waits)


def test_with_buckets_reduced_in_the_last_backward_every_w_runs_before_it():
    log = []
    schedule = ZeroBubbleH1(WeightGradients(), 8, reduce_in_last_backward=True)
    _one_f_one_b(0, 4, 8, schedule, log)
    last_b = log.index(("B", 7))
    assert all(log.index(("W", mb)) < last_b for mb in range(7))
    assert log[last_b + 1] == ("W", 7)  # not held: computed inside its backward pass


def test_theoretical_bubbles_are_the_papers():
    # 1F1B at PP 8 with 16 micro-batches idles (p-1)/(m+p-1) of each stage
    assert theoretical_bubble(8, 16) == pytest.approx(7 / 23)
    # ZB-H1 with F = B = W: (p-1)(F+B-W), a third of 1F1B's idle time
    assert theoretical_bubble(8, 16, schedule="zb-h1") == pytest.approx(7 / (48 + 7))
    # F = 2, B = 2, W = 1: 7 * 3 out of 16 * 5 + 21
    assert theoretical_bubble(8, 16, 2, 2, 1, "zb-h1") == pytest.approx(21 / 101)
    with pytest.raises(ValueError, match="1f1b or zb-h1"):
        theoretical_bubble(8, 16, schedule="dualpipe")


def test_a_timeline_says_idle_share_and_a_w_before_its_b():
    ticks = iter(range(100))
    timeline = Timeline(clock=lambda: float(next(ticks)))  # start 0
    with timeline.span("F", 0):  # 1..2
        pass
    with timeline.span("recv_backward"):  # 3..4
        pass
    with timeline.span("B", 0):  # 5..6
        pass
    timeline.close()  # 7
    assert timeline.busy_s() == 2 and timeline.idle_fraction() == pytest.approx(5 / 7)
    ops = timeline.as_dict()["ops"]
    assert misplaced_weight_gradients(ops) == []
    ops.append({"kind": "W", "microbatch": 1, "start_s": 8.0, "end_s": 9.0})
    assert misplaced_weight_gradients(ops) == ["W of micro-batch 1 (chunk 0) ran before its B"]
    # a V schedule's chunks: micro-batch 0's B of chunk 0 does not count for chunk 1's W
    ops.append({"kind": "W", "microbatch": 0, "chunk": 1, "start_s": 9.0, "end_s": 9.5})
    assert misplaced_weight_gradients(ops)[1:] == ["W of micro-batch 0 (chunk 1) ran before its B"]


def test_a_held_back_weight_gradient_is_upstreams_bit_for_bit(monkeypatch):
    import inspect

    from megatron.core.tensor_parallel import layers

    from megatron_musa_patch.lib.ops import grad_accum
    from megatron_musa_patch.lib.pipeline.weight_gradients import linear_backward

    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", grad_accum, raising=False)
    function = layers.LinearWithGradAccumulationAndAsyncCommunication
    original = function.backward
    parameters = list(inspect.signature(function.forward).parameters)[1:]
    torch.manual_seed(0)
    x = torch.randn(2, 16, 32, dtype=torch.bfloat16, requires_grad=True)
    weight0 = torch.randn(24, 32, dtype=torch.bfloat16)
    grads = [torch.randn(2, 16, 24, dtype=torch.bfloat16) for _ in range(3)]

    def run(hold):
        store = WeightGradients()
        weight = torch.nn.Parameter(weight0.clone())
        weight.main_grad = torch.zeros(24, 32)
        values = dict(input=x, weight=weight, bias=None, gradient_accumulation_fusion=True,
                      allreduce_dgrad=False, sequence_parallel=False, grad_output_buffer=None,
                      wgrad_deferral_limit=None, tp_group=None, gtp_remat_size=1)
        monkeypatch.setattr(function, "backward", staticmethod(
            lambda ctx, g: linear_backward(store, original, ctx, g)))
        input_grads = []
        for g in grads:  # three micro-batches
            x.grad = None
            out = function.apply(*[values[name] for name in parameters])
            if hold:
                with store.deferring():
                    out.backward(g)
            else:
                out.backward(g)
            input_grads.append(x.grad.clone())
        if hold:
            assert len(store.pending) == 3 and not weight.main_grad.any()
            store.flush()
        assert not store.pending
        return weight.main_grad, input_grads

    inline_grad, inline_inputs = run(hold=False)
    held_grad, held_inputs = run(hold=True)
    assert torch.equal(inline_grad, held_grad) and inline_grad.abs().sum() > 0
    assert all(torch.equal(a, b) for a, b in zip(inline_inputs, held_inputs))
