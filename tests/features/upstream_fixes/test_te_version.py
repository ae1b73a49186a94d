"""upstream_fixes.te_version: every reader of the TE version answers "no TE" without TE."""

import pytest

from megatron_musa_patch.upstream.conditions import te_installed

from tests.conftest import run_probe, subprocess_env

PROBE = "tests.features.upstream_fixes.probes.te_version"


@pytest.mark.skipif(te_installed(), reason="TransformerEngine is installed: nothing to fix")
def test_every_reader_answers_no_te():
    proc = run_probe(PROBE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-4:] == ["False", "False", "True", "True"]


@pytest.mark.skipif(te_installed(), reason="TransformerEngine is installed: nothing to fix")
def test_without_the_fix_upstream_0_16_raises():
    """The probe is what the fix makes pass: switched off on a release before upstream's own fix,
    the helper compares None with a version."""
    from megatron_musa_patch.upstream import facts, installed

    proc = run_probe(PROBE,
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.te_version"))
    if facts.holds("te_version_without_te", installed.megatron_core_version()):
        assert proc.returncode == 0, proc.stderr[-3000:]  # upstream answers 0.0.0 itself
    else:
        assert proc.returncode != 0 and "TypeError" in proc.stderr, proc.stderr[-3000:]
