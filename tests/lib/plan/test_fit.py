"""The calibration's fit: a factor on the ops' priced time and a cost per op, from real runs."""

import pytest

from megatron_musa_patch.lib.plan.fit import factor_and_per_op


def test_two_or_three_runs_give_back_the_factor_and_the_cost_per_op():
    def real(priced, ops):
        return 1.4 * priced + 5e-5 * ops

    runs = [(0.05, 190), (0.09, 190), (0.08, 330)]
    points = [(real(p, n), p, n) for p, n in runs]
    for given in (points[:2], points):
        factor, per_op = factor_and_per_op(given)
        assert factor == pytest.approx(1.4) and per_op == pytest.approx(5e-5)


def test_runs_that_cannot_separate_the_terms_give_the_ratio_alone():
    # the same op count and the same ratio: no per-op cost can be told apart
    assert factor_and_per_op([(2.0, 1.0, 100), (4.0, 2.0, 100)]) == (pytest.approx(2.0), 0.0)
    # a negative cost per op is not physical: the overall ratio instead
    factor, per_op = factor_and_per_op([(1.0, 1.0, 100), (1.0, 2.0, 100)])
    assert per_op == 0.0 and factor == pytest.approx(2.0 / 3.0)


def test_collectives_in_a_step_separate_their_own_cost_from_the_wait_for_the_peer():
    from megatron_musa_patch.lib.plan.fit import per_collective_and_wait_share

    def extra(collectives, compute):
        return 3e-4 * collectives + 0.12 * compute

    runs = [(22, 0.05), (22, 0.11)]  # tensor parallelism 2, then twice the sequence
    got = per_collective_and_wait_share([(extra(n, c), n, c) for n, c in runs])
    assert got == (pytest.approx(3e-4), pytest.approx(0.12))
    # the extra shrinking with the compute is not a wait: a cost per collective alone
    per_collective, share = per_collective_and_wait_share([(0.01, 20, 0.05), (0.008, 20, 0.1)])
    assert share == 0.0 and per_collective == pytest.approx((0.01 + 0.008) / 2 / 20)
    # one run cannot tell the two apart: a cost per collective, as before
    assert per_collective_and_wait_share([(0.0066, 22, 0.05)]) == (pytest.approx(3e-4), 0.0)
