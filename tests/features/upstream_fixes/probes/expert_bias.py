"""A MoE expert MLP with biases (local spec, one CPU rank) against its formula written out:
forward and every gradient. Prints ``RESULT <json>``: ``bias_returned``, the parameter
``names`` and the ``worst`` difference, or ``error`` (upstream's RuntimeError) where the
forward fails.

Run by tests/features/upstream_fixes/test_expert_bias.py."""

import json

import megatron_musa_patch  # activates the layer: before megatron is imported
import torch
import torch.nn.functional as F

from tests.features.recompute import recompute_layer
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.transformer_config import TransformerConfig


def expert():
    cfg = TransformerConfig(num_layers=1, hidden_size=16, ffn_hidden_size=24,
                            num_attention_heads=2, add_bias_linear=True, gated_linear_unit=True,
                            activation_func=F.silu, bias_activation_fusion=False,
                            use_cpu_initialization=True, gradient_accumulation_fusion=False,
                            num_moe_experts=2)
    mlp = MLP(cfg, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
              is_expert=True, ffn_hidden_size=24)
    with torch.no_grad():
        for p in mlp.parameters():
            p.uniform_(-0.3, 0.3)
    return mlp


def formula(mlp, x, scale, up):
    """The expert written out on copies of its parameters: its output and every gradient."""
    params = [p.detach().clone().requires_grad_(True) for p in mlp.parameters()]
    w = dict(zip([n for n, _ in mlp.named_parameters()], params))
    x2, s2 = x.detach().clone().requires_grad_(True), scale.detach().clone().requires_grad_(True)
    h = x2 @ w["linear_fc1.weight"].t() + w["linear_fc1.bias"]
    a, b = torch.chunk(h, 2, -1)
    h = (F.silu(a) * b) * s2.unsqueeze(-1)
    ref = h @ w["linear_fc2.weight"].t() + w["linear_fc2.bias"] * s2.unsqueeze(-1)
    ref.backward(up)
    return [ref.detach(), x2.grad, s2.grad] + [p.grad for p in params]


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    recompute_layer.init_single_rank()
    torch.manual_seed(0)
    mlp = expert()
    x = torch.randn(7, 16, requires_grad=True)
    scale = torch.rand(7, requires_grad=True)
    up = torch.randn(7, 16)
    result = {}
    try:
        out, bias = mlp(x, per_token_scale=scale)
    except RuntimeError as exc:
        print("RESULT " + json.dumps({"error": str(exc)[:300]}))
        return
    (out if bias is None else out + bias).backward(up)
    ours = [out.detach(), x.grad, scale.grad] + [p.grad for p in mlp.parameters()]
    result["bias_returned"] = bias is not None
    want = formula(mlp, x, scale, up)
    result["names"] = [n for n, _ in mlp.named_parameters()]
    result["worst"] = max((a - b).abs().max().item() for a, b in zip(ours, want))
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
