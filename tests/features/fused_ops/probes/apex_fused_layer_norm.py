"""megatron-core's FusedLayerNorm with Apex installed without its CUDA extensions
(tests/fixtures/fake_apex on PYTHONPATH), through the layer (``sys.argv[1] == "layer"``) or
upstream alone: forward and backward against torch's LayerNorm, or the error it raised. Prints
one ``RESULT {json}`` line.

Run by tests/features/fused_ops/test_apex_without_kernels.py."""

import json
import sys


def compare(gamma, result):
    """One FusedLayerNorm against torch's layer_norm; False once it raised (``result["error"]``).
    Imports here, as in main(): megatron only after the route decided on the layer."""
    import torch
    from megatron.core.fusions import fused_layer_norm
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=1, hidden_size=48, num_attention_heads=4,
                            normalization="LayerNorm", layernorm_zero_centered_gamma=gamma)
    ln = fused_layer_norm.FusedLayerNorm(cfg, 48, eps=1e-5)
    with torch.no_grad():
        ln.weight.uniform_(-0.5, 0.5)
        ln.bias.uniform_(-0.5, 0.5)
    x = torch.randn(5, 3, 48, requires_grad=True)
    up = torch.randn(5, 3, 48)
    try:
        out = ln(x)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        return False
    out.backward(up)
    ours = (out.detach(), x.grad, ln.weight.grad, ln.bias.grad)
    x2 = x.detach().clone().requires_grad_(True)
    w2 = ln.weight.detach().clone().requires_grad_(True)
    b2 = ln.bias.detach().clone().requires_grad_(True)
    ref = torch.nn.functional.layer_norm(x2, (48,), w2 + 1 if gamma else w2, b2, 1e-5)
    ref.backward(up)
    theirs = (ref, x2.grad, w2.grad, b2.grad)
    result[f"gamma={gamma}"] = {
        "worst": max((a - b).abs().max().item() for a, b in zip(ours, theirs)),
        "viewless": out._base is None, "shape": list(out.shape)}
    return True


def main(route):
    if route == "layer":
        import megatron_musa_patch  # activates the layer: before megatron is imported

        assert megatron_musa_patch.is_active(), "the import activates the layer"
    import torch
    from megatron.core.fusions import fused_layer_norm

    result = {"have_fused": fused_layer_norm.HAVE_FUSED_LAYER_NORM,
              "have_persist": fused_layer_norm.HAVE_PERSIST_LAYER_NORM}
    torch.manual_seed(0)
    for gamma in (False, True):
        if not compare(gamma, result):
            break
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
