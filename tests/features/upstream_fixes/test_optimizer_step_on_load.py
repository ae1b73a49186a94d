"""upstream_fixes.optimizer_step_on_load: without Apex/TE, megatron-core's non-distributed
optimizers (FP32Optimizer, Float16OptimizerWithFloat16Params) load moments saved before any step
into torch's Adam, at step 0, and a step then runs from there."""

import pytest

from tests.conftest import printed_lines, run_probe_on_one_cpu_rank
from tests.features.upstream_fixes.one_rank_probes import apex_or_te_installed

PROBE = "tests.features.upstream_fixes.probes.optimizer_step_on_load"


pytestmark = pytest.mark.skipif(apex_or_te_installed(),
                                reason="Apex or TE is installed: megatron-core uses FusedAdam")


def _results(proc):
    return printed_lines(proc, ("FP32Optimizer", "Float16OptimizerWithFloat16Params"))


def test_moments_saved_before_any_step_load_at_step_0_and_step_on(tmp_path):
    # two parameters (weight, bias) each; exp_avg after one step: 0.9 * 0.5 + 0.1 * 1.0
    assert _results(run_probe_on_one_cpu_rank(PROBE, tmp_path)) == [
        "FP32Optimizer loaded [0.0, 0.0] stepped [1.0, 1.0] [0.55]",
        "Float16OptimizerWithFloat16Params loaded [0.0, 0.0] stepped [1.0, 1.0] [0.55]",
    ]


def test_without_the_fix_torch_adam_refuses_them(tmp_path):
    proc = run_probe_on_one_cpu_rank(
        PROBE, tmp_path, MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.optimizer_step_on_load")
    assert _results(proc) == ["FP32Optimizer refused KeyError 'step'",
                              "Float16OptimizerWithFloat16Params refused KeyError 'step'"]
