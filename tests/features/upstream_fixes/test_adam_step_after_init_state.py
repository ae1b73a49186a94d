"""upstream_fixes.adam_step_after_init_state: without Apex/TE, megatron-core's optimizers step
torch's Adam over moments that their own ``init_state_fn`` filled before any step, as a fresh
state (step 0), instead of stopping at a missing ``step``."""

import pytest

from tests.conftest import printed_lines, run_probe_on_one_cpu_rank
from tests.features.upstream_fixes.one_rank_probes import apex_or_te_installed

PROBE = "tests.features.upstream_fixes.probes.adam_step_after_init_state"

pytestmark = pytest.mark.skipif(apex_or_te_installed(),
                                reason="Apex or TE is installed: megatron-core uses FusedAdam")

OPTIMIZERS = ("FP32Optimizer", "Float16OptimizerWithFloat16Params", "DistributedOptimizer")


def _results(proc):
    return printed_lines(proc, OPTIMIZERS)


def test_moments_laid_out_by_init_state_fn_step_as_a_fresh_state(tmp_path):
    # exp_avg after one step from zeros with gradient 1.0: 0.9 * 0 + 0.1 * 1.0
    assert _results(run_probe_on_one_cpu_rank(PROBE, tmp_path)) == [
        "FP32Optimizer stepped [1.0] [0.1]",
        "Float16OptimizerWithFloat16Params stepped [1.0] [0.1]",
        "DistributedOptimizer stepped [1.0] [0.1]",
    ]


def test_without_the_fix_torch_adam_refuses_to_step_them(tmp_path):
    proc = run_probe_on_one_cpu_rank(
        PROBE, tmp_path, MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.adam_step_after_init_state")
    assert _results(proc) == [f"{name} refused KeyError 'step'" for name in OPTIMIZERS]
