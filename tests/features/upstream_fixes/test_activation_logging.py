"""upstream_fixes.activation_logging_without_te: without TE, megatron.training's activation
logger hooks megatron-core's layers and records their outputs (0.18+)."""

import pytest
from packaging.version import Version

from megatron_musa_patch.upstream.conditions import te_installed

from tests.conftest import run_probe_on_one_cpu_rank

PROBE = "tests.features.upstream_fixes.probes.activation_logging"


def _before_0_18():
    from megatron_musa_patch.upstream import installed

    return installed.megatron_core_version() < Version("0.18")


pytestmark = [
    pytest.mark.skipif(te_installed(), reason="TE is installed: its layer classes are real"),
    pytest.mark.skipif(_before_0_18(),
                       reason="megatron.training.activation_logging arrives in megatron-core 0.18"),
]


def test_activation_hooks_register_on_the_linear_layers_without_te(tmp_path):
    proc = run_probe_on_one_cpu_rank(PROBE, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-2:] == ["hooks 2", "removed 0"], proc.stdout[-2000:]


def test_without_the_fix_upstream_cannot_register_them(tmp_path):
    proc = run_probe_on_one_cpu_rank(
        PROBE, tmp_path, MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.activation_logging_without_te")
    assert proc.returncode != 0
    assert "isinstance() arg 2 must be a type" in proc.stderr, proc.stderr[-3000:]
