"""MoE experts with biases (upstream.expert_bias_out_of_place, feature upstream_fixes).

megatron-core's ``MLP.forward`` adds the probability-scaled fc2 bias of an expert in place to the
tensor the tensor-parallel reduction returned, which autograd forbids, so a MoE model with biases
(no --disable-bias-linear) on the local spec fails at its first step, on every device. Through the
layer the bias is added out of place: checked here against the expert's formula written out
(forward and every gradient), on one CPU rank; with the feature off upstream's error comes back.
The stock run is in tests/features/mt_megatron/test_moe_mla_mtp.py."""

import json

import pytest

from tests.conftest import REPO, run_python, subprocess_env

pytestmark = pytest.mark.ranks

CODE = r"""
import json, sys
import megatron_musa_patch  # noqa: F401 - activates
sys.path.insert(0, "tests/features/recompute")
import torch
import torch.nn.functional as F
from recompute_layer import init_single_rank
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.transformer_config import TransformerConfig

init_single_rank()
torch.manual_seed(0)
cfg = TransformerConfig(num_layers=1, hidden_size=16, ffn_hidden_size=24, num_attention_heads=2,
                        add_bias_linear=True, gated_linear_unit=True, activation_func=F.silu,
                        bias_activation_fusion=False, use_cpu_initialization=True,
                        gradient_accumulation_fusion=False, num_moe_experts=2)
mlp = MLP(cfg, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
          is_expert=True, ffn_hidden_size=24)
with torch.no_grad():
    for p in mlp.parameters():
        p.uniform_(-0.3, 0.3)
x = torch.randn(7, 16, requires_grad=True)
scale = torch.rand(7, requires_grad=True)
up = torch.randn(7, 16)
result = {}
try:
    out, bias = mlp(x, per_token_scale=scale)
except RuntimeError as exc:
    print("RESULT " + json.dumps({"error": str(exc)[:300]}))
    raise SystemExit(0)
(out if bias is None else out + bias).backward(up)
ours = [out.detach(), x.grad, scale.grad] + [p.grad for p in mlp.parameters()]
result["bias_returned"] = bias is not None

params = [p.detach().clone().requires_grad_(True) for p in mlp.parameters()]
names = [n for n, _ in mlp.named_parameters()]
w = dict(zip(names, params))
x2, s2 = x.detach().clone().requires_grad_(True), scale.detach().clone().requires_grad_(True)
h = x2 @ w["linear_fc1.weight"].t() + w["linear_fc1.bias"]
a, b = torch.chunk(h, 2, -1)
h = (F.silu(a) * b) * s2.unsqueeze(-1)
ref = h @ w["linear_fc2.weight"].t() + w["linear_fc2.bias"] * s2.unsqueeze(-1)
ref.backward(up)
want = [ref.detach(), x2.grad, s2.grad] + [p.grad for p in params]
result["names"] = names
result["worst"] = max((a - b).abs().max().item() for a, b in zip(ours, want))
print("RESULT " + json.dumps(result))
"""


def _run(**env):
    proc = run_python(CODE, cwd=str(REPO), timeout=300,
                      env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu", **env))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_expert_bias_matches_the_formula():
    result = _run()
    assert "error" not in result, result
    assert result["bias_returned"] is False  # added inside, as upstream means to
    assert "linear_fc2.bias" in result["names"]
    assert result["worst"] < 1e-6, result


def test_upstream_fails_without_the_fix():
    result = _run(MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes")
    assert "is a view and is being modified inplace" in result.get("error", ""), result
