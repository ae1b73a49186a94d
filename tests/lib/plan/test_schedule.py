"""The pipeline schedules the planner times: Megatron's orders, and the bubble they leave."""

import pytest

from megatron_musa_patch.lib.plan import schedule


@pytest.mark.parametrize("stages,microbatches,chunks", [(2, 4, 1), (4, 8, 1), (4, 16, 1),
                                                       (2, 4, 2), (4, 8, 2), (4, 12, 3)])
def test_equal_stages_leave_the_theoretical_bubble(stages, microbatches, chunks):
    # one micro-batch through a chunk: forward 1, backward 2 (each divided by the chunks)
    t = schedule.simulate([1.0 / chunks] * stages, [2.0 / chunks] * stages, microbatches, chunks)
    expected = schedule.equal_stages_bubble(stages, microbatches, chunks)
    for s in range(stages):
        assert t.bubble(s) == pytest.approx(expected, abs=1e-9)
    assert t.makespan == pytest.approx(3.0 * microbatches + 3.0 * (stages - 1) / chunks)


@pytest.mark.parametrize("stages,microbatches,chunks", [(4, 8, 1), (4, 8, 2), (2, 6, 3)])
def test_every_operation_once_and_backward_after_its_forward(stages, microbatches, chunks):
    t = schedule.simulate([1.0] * stages, [2.0] * stages, microbatches, chunks)
    for s in range(stages):
        ops = [(kind, mb, c) for kind, mb, c, _, _ in t.events[s]]
        assert sorted(ops) == sorted({(k, m, c) for k in "FB" for m in range(microbatches)
                                      for c in range(chunks)})
        end = {(kind, mb, c): stop for kind, mb, c, _, stop in t.events[s]}
        start = {(kind, mb, c): begin for kind, mb, c, begin, _ in t.events[s]}
        for mb in range(microbatches):
            for c in range(chunks):
                assert start[("B", mb, c)] >= end[("F", mb, c)]


def test_one_f_one_b_holds_at_most_the_warmup_in_flight():
    # 1F1B: stage s never has more than (stages - s) forwards without their backward
    stages = 4
    for s in range(stages):
        in_flight = worst = 0
        for kind, _, _ in schedule.order(s, stages, 8):
            in_flight += 1 if kind == "F" else -1
            worst = max(worst, in_flight)
        assert worst == stages - s


def test_a_slow_stage_sets_the_pace():
    t = schedule.simulate([1.0, 2.0], [2.0, 4.0], 8)
    # the slow stage is busy for 8 x 6 and idles only while the first micro-batch arrives
    assert t.makespan == pytest.approx(8 * 6.0 + 1.0 + 2.0)
    assert t.bubble(1) < t.bubble(0)


@pytest.mark.parametrize("stages,microbatches", [(4, 8), (8, 16), (4, 2)])
def test_zb_h1_as_it_runs_shortens_the_step_within_the_papers_bound(stages, microbatches):
    from megatron_musa_patch.lib.pipeline.zero_bubble import theoretical_bubble

    ones = [1.0] * stages
    plain = schedule.simulate(ones, ones, microbatches, weight_s=ones)
    zb = schedule.simulate(ones, ones, microbatches, weight_s=ones, zero_bubble=True)
    assert plain.makespan == 3 * microbatches + 3 * (stages - 1)  # B and W together: 1F1B
    # the gradients travel at B's pace: (p-1) of 1F1B's 3(p-1) idle units go; the paper's
    # handcrafted ZB-H1 leaves only (p-1)
    assert zb.makespan == 3 * microbatches + 2 * (stages - 1)
    for s in range(stages):
        ops = [(kind, mb) for kind, mb, _, _, _ in zb.events[s]]
        assert sorted(ops) == sorted((k, m) for k in "FBW" for m in range(microbatches))
        end = {(kind, mb): stop for kind, mb, _, _, stop in zb.events[s]}
        start = {(kind, mb): begin for kind, mb, _, begin, _ in zb.events[s]}
        assert all(start[("W", m)] >= end[("B", m)] for m in range(microbatches))
        assert zb.bubble(s) >= theoretical_bubble(stages, microbatches, schedule="zb-h1") - 1e-9


@pytest.mark.parametrize("name", ["zb-v", "dualpipev"])
@pytest.mark.parametrize("stages,microbatches", [(4, 8), (8, 16), (8, 32)])
def test_the_v_schedules_leave_a_fraction_of_zb_h1s_bubble(name, stages, microbatches):
    """The same model as the 1F1B case above (F = B = W = 1 per stage), split in two chunks per
    rank: each chunk's passes take half."""
    ones, halves = [1.0] * stages, [0.5] * stages
    zb_h1 = schedule.simulate(ones, ones, microbatches, weight_s=ones, zero_bubble=True)
    v = schedule.simulate_v(name, halves, halves, halves, microbatches)
    work = 3 * microbatches
    assert all(busy == pytest.approx(work) for busy in v.busy)
    # the warm-up of the first forward passes down the V, half a pass per stage: (p-1)/2 idle
    assert v.makespan == pytest.approx(work + (stages - 1) / 2)
    assert v.makespan < zb_h1.makespan
    for rank in range(stages):
        begun = {(k, mb, c): start for k, mb, c, start, _ in v.events[rank]}
        ended = {(k, mb, c): end for k, mb, c, _, end in v.events[rank]}
        for (kind, mb, chunk), start in begun.items():
            if kind == "W":
                assert start >= ended[("I", mb, chunk)]
