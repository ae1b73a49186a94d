"""Apex installed without its CUDA extensions (tests/fixtures/fake_apex): megatron-core picks its
FusedLayerNorm for LayerNorm models, which upstream cannot run (the kernel module is missing).
Through the layer (feature fused_ops) it computes with ops.norm: same parameters, torch's
LayerNorm numbers forward and backward, a viewless output; with the feature off upstream's error
comes back."""

import json

import pytest

from tests.conftest import REPO, run_probe, subprocess_env

pytestmark = pytest.mark.ranks

FAKE_APEX = REPO / "tests" / "fixtures" / "fake_apex"


def _run(route, **env):
    proc = run_probe("tests.features.fused_ops.probes.apex_fused_layer_norm", route,
                     timeout=300, env=subprocess_env(PYTHONPATH=FAKE_APEX,
                                                     MEGATRON_MUSA_PATCH_DEVICE="cpu", **env))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_upstream_fails_without_apex_kernels():
    result = _run("upstream")
    assert result["have_fused"] is True and result["have_persist"] is False
    assert "fused_layer_norm_cuda" in result["error"]


def test_layer_computes_fused_layer_norm_with_ops_norm():
    result = _run("layer")
    assert "error" not in result, result
    for gamma in ("gamma=False", "gamma=True"):
        assert result[gamma]["worst"] < 1e-5, result
        assert result[gamma]["viewless"] and result[gamma]["shape"] == [5, 3, 48]


def test_feature_off_gives_upstreams_error_back():
    result = _run("layer", MEGATRON_MUSA_PATCH_DISABLE="fused_ops")
    assert "fused_layer_norm_cuda" in result.get("error", ""), result
