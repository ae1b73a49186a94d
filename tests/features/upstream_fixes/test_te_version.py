"""upstream_fixes.te_version: every reader of the TE version answers "no TE" without TE."""

import pytest

from megatron_musa_patch.upstream.conditions import te_installed

from tests.conftest import run_python, subprocess_env

#: the readers upstream's code and its unit tests use: the helper itself, is_te_min_version (the
#: unit tests' conftest asks it before every test), a module holding a `from megatron.core.utils
#: import get_te_version` copy, and OptimizerConfig's precision-aware check
PROBE = """
import megatron_musa_patch
from packaging.version import Version
from megatron.core.utils import get_te_version, is_te_min_version
import megatron.core.transformer.transformer_config as tc
from megatron.core.optimizer.optimizer_config import OptimizerConfig
print(is_te_min_version("1.3"), is_te_min_version("0.1", check_equality=False),
      get_te_version() < Version("1.3.0"), tc.get_te_version() == Version("0.0.0"))
OptimizerConfig(use_precision_aware_optimizer=True, use_distributed_optimizer=True)
"""


@pytest.mark.skipif(te_installed(), reason="TransformerEngine is installed: nothing to fix")
def test_every_reader_answers_no_te():
    proc = run_python(PROBE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-4:] == ["False", "False", "True", "True"]


@pytest.mark.skipif(te_installed(), reason="TransformerEngine is installed: nothing to fix")
def test_without_the_fix_upstream_0_16_raises():
    """The probe is what the fix makes pass: switched off on a release before upstream's own fix,
    the helper compares None with a version."""
    from megatron_musa_patch.upstream import facts, installed

    proc = run_python(PROBE, env=subprocess_env(MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.te_version"))
    if facts.holds("te_version_without_te", installed.megatron_core_version()):
        assert proc.returncode == 0, proc.stderr[-3000:]  # upstream answers 0.0.0 itself
    else:
        assert proc.returncode != 0 and "TypeError" in proc.stderr, proc.stderr[-3000:]
