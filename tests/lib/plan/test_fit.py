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
