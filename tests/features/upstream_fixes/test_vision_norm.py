"""upstream_fixes.vision_norm_without_te: CLIPViTModel builds from the local spec without TE, its
norms follow config.normalization, and a forward pass runs."""

import pytest

from megatron_musa_patch.upstream.conditions import te_installed

from tests.conftest import printed_lines, run_probe_on_one_cpu_rank

PROBE = "tests.features.upstream_fixes.probes.vision_norm"


pytestmark = pytest.mark.skipif(te_installed(), reason="TE is installed: TENorm is the default")



def test_clip_vit_builds_and_runs_without_te(tmp_path):
    built = printed_lines(run_probe_on_one_cpu_rank(PROBE, tmp_path), ("built",))
    # 4 patches of 14x14 plus the class token, batch 2, hidden 64
    assert built == ["built LayerNorm LayerNorm (2, 5, 64)", "built RMSNorm RMSNorm (2, 5, 64)"]


def test_without_the_fix_upstream_cannot_build_its_default_norm(tmp_path):
    proc = run_probe_on_one_cpu_rank(
        PROBE, tmp_path, MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.vision_norm_without_te")
    assert proc.returncode != 0
    assert "unexpected keyword argument 'config'" in proc.stderr, proc.stderr[-3000:]
