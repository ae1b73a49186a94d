"""The loss line after a resume (feature ``upstream_fixes.log_loss_reset``).

Megatron-LM logs a job's first iteration without resetting its loss accumulator, so with the
first iteration on the log interval the job's next line is the mean of two intervals. Stock
pretrain_gpt.py on 2 CPU ranks, DP2 with the distributed optimizer: the printed curve of a run
stopped at iteration 4 and resumed equals the uninterrupted one line for line, at
``--log-interval 1`` and 2; with the fix switched off, upstream's line is shown to be the mean of
two iterations. Needs MEGATRON_LM_PATH.
"""

import re

import pytest

from tests.harness.stock import run_stock

pytestmark = pytest.mark.stock

ITERS, HALF = 8, 4
DISTOPT = ["--use-distributed-optimizer"]
OFF = {"MEGATRON_MUSA_PATCH_DISABLE": "upstream_fixes.log_loss_reset"}


def uninterrupted(lm_path, interval, env=None):
    losses, _, _ = run_stock(lm_path, [*DISTOPT, "--log-interval", str(interval)], iters=ITERS,
                             env=env)
    return losses


def checkpoint(lm_path, tmp_path, interval):
    """The first job: HALF iterations, saved; returns its printed losses and the directory."""
    ckpt = tmp_path / f"ckpt{interval}"
    losses, _, _ = run_stock(lm_path, [*DISTOPT, "--log-interval", str(interval), "--save",
                                       str(ckpt), "--save-interval", str(HALF),
                                       "--exit-interval", str(HALF)], iters=ITERS)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == str(HALF)
    return losses, ckpt


def resumed(lm_path, ckpt, interval, env=None):
    """A second job from the checkpoint to ITERS (no --save: the checkpoint stays as it is)."""
    losses, _, log = run_stock(lm_path, [*DISTOPT, "--log-interval", str(interval), "--load",
                                         str(ckpt)], iters=ITERS, env=env)
    assert re.search(rf"successfully loaded checkpoint from .* at iteration {HALF}", log)
    return losses


@pytest.mark.parametrize("interval", [1, 2])
def test_resumed_curve_equals_the_uninterrupted_one_line_for_line(lm_path, tmp_path, interval):
    whole = uninterrupted(lm_path, interval)
    first, ckpt = checkpoint(lm_path, tmp_path, interval)
    second = resumed(lm_path, ckpt, interval)
    regular = set(range(interval, ITERS + 1, interval))
    assert set(whole) == regular | {1}, whole  # upstream also logs each job's first iteration
    assert set(first) == {i for i in regular if i <= HALF} | {1}
    assert set(second) == {i for i in regular if i > HALF} | {HALF + 1}
    curve = {**first, **second}
    common = sorted(set(whole) & set(curve))
    assert common == sorted(regular | {1})
    assert [curve[i] for i in common] == [whole[i] for i in common], (whole, curve)


def test_upstreams_line_is_the_mean_of_two_iterations(lm_path, tmp_path):
    ours = uninterrupted(lm_path, 1)
    upstream = uninterrupted(lm_path, 1, env=OFF)
    # the job's second line: upstream prints the mean of iterations 1 and 2, ours iteration 2
    assert upstream[1] == ours[1] and upstream[2] != ours[2]
    assert upstream[2] == pytest.approx((ours[1] + ours[2]) / 2, rel=2e-6)
    assert all(upstream[i] == ours[i] for i in range(3, ITERS + 1))
    # the same line of a resumed job, which made resume look inexact
    _, ckpt = checkpoint(lm_path, tmp_path, 1)
    upstream_resumed = resumed(lm_path, ckpt, 1, env=OFF)
    i = HALF + 2
    assert upstream_resumed[i] != ours[i]
    assert upstream_resumed[i] == pytest.approx((ours[i - 1] + ours[i]) / 2, rel=2e-6)
