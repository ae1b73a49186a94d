"""upstream_fixes.optimizer_lr_unset: without Apex/TE, megatron-core builds its optimizer from an
OptimizerConfig whose lr is unset (None), as it does with TE's FusedAdam, and keeps that None."""

import pytest

from tests.conftest import printed_lines, run_probe_on_one_cpu_rank
from tests.features.upstream_fixes.one_rank_probes import apex_or_te_installed

PROBE = "tests.features.upstream_fixes.probes.optimizer_lr_unset"


pytestmark = pytest.mark.skipif(apex_or_te_installed(),
                                reason="Apex or TE is installed: megatron-core uses FusedAdam")



def test_the_optimizer_builds_with_lr_unset_and_keeps_it_unset(tmp_path):
    proc = run_probe_on_one_cpu_rank(PROBE, tmp_path)
    built = printed_lines(proc, ("built",))
    assert built == ["built adam None [None, None] None", "built sgd None [None, None] None",
                     "built adam 0.25 [0.25, 0.25] 0.25"]
    # as with FusedAdam, a step before the scheduler sets the learning rate fails
    assert proc.stdout.splitlines()[-1] == "step refused"


def test_without_the_fix_the_torch_fallback_refuses_lr_unset(tmp_path):
    proc = run_probe_on_one_cpu_rank(
        PROBE, tmp_path, MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.optimizer_lr_unset")
    assert proc.returncode != 0
    assert "TypeError: '<=' not supported between instances of 'float' and 'NoneType'" \
        in proc.stderr, proc.stderr[-3000:]
