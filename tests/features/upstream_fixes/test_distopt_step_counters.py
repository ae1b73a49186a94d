"""upstream_fixes.distopt_step_counters: without Apex/TE, the distributed optimizer's state dict
reads a per-parameter ``step`` that torch's Adam creates only at its first step. Moments filled
before any step (upstream's ``init_state_fn``, and its checkpointing tests, set only
``exp_avg``/``exp_avg_sq``) are at step 0; the live state is left as it was."""

import pytest

from tests.conftest import run_probe_on_one_cpu_rank
from tests.features.upstream_fixes.one_rank_probes import apex_or_te_installed

PROBE = "tests.features.upstream_fixes.probes.distopt_step_counters"


pytestmark = pytest.mark.skipif(apex_or_te_installed(),
                                reason="Apex or TE is installed: the step is the param group's")


def test_moments_filled_before_any_step_are_at_step_0(tmp_path):
    proc = run_probe_on_one_cpu_rank(PROBE, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.split(" ")[0] in
             ("empty", "moments", "stepped")]
    assert lines == [
        "empty [0.0, 0.0] []",
        # the live state keeps only what the test put there: torch's Adam sees it as it was
        "moments [0.0, 0.0] [['exp_avg', 'exp_avg_sq']]",
        # after a step, a state without one takes the step the others share (step 0 would make
        # two steps, which upstream refuses)
        "stepped [1.0, 1.0] [['exp_avg', 'exp_avg_sq', 'step'], ['exp_avg', 'exp_avg_sq', 'step'],"
        " ['exp_avg', 'exp_avg_sq', 'step'], ['exp_avg']]",
    ], proc.stdout


def test_without_the_fix_a_state_dict_before_any_step_fails_bare(tmp_path):
    proc = run_probe_on_one_cpu_rank(
        PROBE, tmp_path, MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.distopt_step_counters")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.split(" ")[0] in
             ("empty", "moments", "stepped")]
    assert lines == ["empty refused AssertionError ", "moments refused KeyError 'step'",
                     "stepped refused KeyError 'step'"], proc.stdout
