"""Apex installed without its CUDA extensions (tests/fixtures/fake_apex): megatron-core picks its
FusedLayerNorm for LayerNorm models, which upstream cannot run (the kernel module is missing).
Through the layer (feature fused_ops) it computes with ops.norm: same parameters, torch's
LayerNorm numbers forward and backward, a viewless output; with the feature off upstream's error
comes back."""

import json

import pytest

from tests.conftest import REPO, run_python, subprocess_env

pytestmark = pytest.mark.ranks

FAKE_APEX = REPO / "tests" / "fixtures" / "fake_apex"

CODE = r"""
import json, sys
if sys.argv[1] == "layer":
    import megatron_musa_patch  # noqa: F401 - activates
import torch
from megatron.core.fusions import fused_layer_norm
from megatron.core.transformer.transformer_config import TransformerConfig

result = {"have_fused": fused_layer_norm.HAVE_FUSED_LAYER_NORM,
          "have_persist": fused_layer_norm.HAVE_PERSIST_LAYER_NORM}
torch.manual_seed(0)
for gamma in (False, True):
    cfg = TransformerConfig(num_layers=1, hidden_size=48, num_attention_heads=4,
                            normalization="LayerNorm", layernorm_zero_centered_gamma=gamma)
    ln = fused_layer_norm.FusedLayerNorm(cfg, 48, eps=1e-5)
    with torch.no_grad():
        ln.weight.uniform_(-0.5, 0.5); ln.bias.uniform_(-0.5, 0.5)
    x = torch.randn(5, 3, 48, requires_grad=True)
    up = torch.randn(5, 3, 48)
    try:
        out = ln(x)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        break
    out.backward(up)
    ours = (out.detach(), x.grad, ln.weight.grad, ln.bias.grad)
    x2 = x.detach().clone().requires_grad_(True)
    w2 = ln.weight.detach().clone().requires_grad_(True)
    b2 = ln.bias.detach().clone().requires_grad_(True)
    ref = torch.nn.functional.layer_norm(x2, (48,), w2 + 1 if gamma else w2, b2, 1e-5)
    ref.backward(up)
    result[f"gamma={gamma}"] = {
        "worst": max((a - b).abs().max().item() for a, b in zip(ours, (ref, x2.grad, w2.grad, b2.grad))),
        "viewless": out._base is None, "shape": list(out.shape)}
print("RESULT " + json.dumps(result))
"""


def _run(route, **env):
    pythonpath = f"{FAKE_APEX}:{REPO}"
    proc = run_python(CODE, args=(route,), cwd=str(REPO), timeout=300,
                      env=subprocess_env(PYTHONPATH=pythonpath, MEGATRON_MUSA_PATCH_DEVICE="cpu",
                                         **env))
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
