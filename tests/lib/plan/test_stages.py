"""Middle pipeline stages derived from two that run the same layers."""

import pytest

from megatron_musa_patch.lib.plan import stages


def result(stage, in_flight, weights=100, work=((1, 2, 16, 0, 0, 3),)):
    return {"stage": stage, "rank": stage * 2, "microbatches": 8,
            "memory": {"weights": weights, "gradients": 200, "optimizer": 300,
                       "setup_peak": 600, "first_step_peak": 1000 + 50 * in_flight,
                       "steady_peak": 900 + 50 * in_flight,
                       "step_peak": 1000 + 50 * in_flight,
                       "step_peak_rounded": 1024 + 50 * in_flight},
            "work": {"forward": [list(w) for w in work]},
            "comms": [["send", 64, 2, 1, "schedule", False, 4]]}


def test_a_middle_stage_lies_on_the_line_of_what_it_holds_in_flight():
    pp = 7
    low, high = result(1, pp - 1), result(pp - 2, 2)
    for s in range(2, pp - 2):
        derived = stages.between(low, high, s, s * 2)
        assert derived["memory"] == result(s, pp - s)["memory"]
        assert derived["stage"] == s and derived["rank"] == 2 * s and derived["interpolated"]


def test_stages_that_differ_in_more_than_in_flight_are_not_derived():
    assert stages.between(result(1, 6), result(5, 2, weights=101), 3, 6) is None
    assert stages.between(result(1, 6), result(5, 2, work=((1, 2, 16, 0, 0, 4),)), 3, 6) is None


@pytest.mark.parametrize("pp, vpp, microbatches, ok", [
    (8, 1, 16, True), (4, 1, 16, False),  # no stage between the two planned ones
    (8, 2, 16, False),  # interleaved: another pattern in flight
    (8, 1, 4, False),  # fewer micro-batches than stages: the first stages hold the same
])
def test_only_plain_1f1b_with_enough_micro_batches_is_derived(pp, vpp, microbatches, ok):
    assert stages.interpolable(pp, vpp, microbatches) is ok
