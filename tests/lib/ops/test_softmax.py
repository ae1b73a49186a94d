"""ops.softmax: scaled masked / causal / unmasked softmax against upstream's torch fallback
(``FusedScaleMaskSoftmax.forward_torch_softmax`` semantics: fp32 softmax of scale*x, masked
positions at -10000), forward and backward, bf16/fp16 (the dtypes upstream fuses) and fp32,
odd sequence lengths, batch 1; and the kernel-module stand-in calling convention.
Tolerances: ops_cases.TOL; the eager forward is bit-identical to the fallback."""

from functools import partial

import pytest
import torch

from megatron_musa_patch.lib.ops import softmax

from tests.lib.ops.cases import DEVICES, DTYPES, assert_close, grads, wave

SHAPES = [(2, 3, 20, 20), (1, 1, 7, 7), (2, 4, 5, 33)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["causal", "masked", "none"])
@pytest.mark.parametrize("impl", ["eager", "compile"])
def test_softmax(device, dtype, shape, kind, impl):
    if impl == "compile" and device == "cpu" and (
            dtype != torch.bfloat16 or shape != SHAPES[0] or kind == "none"):
        pytest.skip("compiled path: bf16 causal and masked on one shape (compiles cost seconds)")
    if kind == "causal" and shape[-1] != shape[-2]:
        pytest.skip("causal softmax is for self-attention (sq == sk)")
    g = torch.Generator().manual_seed(shape[-1])
    x = (3 * torch.randn(shape, generator=g)).to(device, dtype)
    mask = (torch.rand(shape[0], 1, shape[2], shape[3], generator=g) < 0.3).to(device)
    scale = 0.37
    up = partial(wave, fn=torch.cos)
    if kind == "causal":
        ours = lambda a: softmax.scaled_upper_triang_masked_softmax(a, scale, impl)  # noqa: E731
        ref = lambda a: softmax.softmax_reference(a, None, scale, causal=True)  # noqa: E731
    else:
        m = mask if kind == "masked" else None
        ours = lambda a: softmax.scaled_masked_softmax(a, m, scale, impl)  # noqa: E731
        ref = lambda a: softmax.softmax_reference(a, m, scale)  # noqa: E731
    out, (dx,) = grads(ours, (x,), up)
    want, (rdx,) = grads(ref, (x,), up)
    assert out.dtype == dtype
    if impl == "eager":
        assert torch.equal(out, want)
    assert_close(out, want, dtype)
    # backward from the probabilities kept in the input dtype, like the CUDA kernels
    assert_close(dx, rdx, dtype, scale=2)
    if kind == "causal":
        assert torch.all(out.float().triu(1) == 0)


def test_stand_in_module_convention():
    from types import ModuleType

    from megatron_musa_patch.features.fused_ops.softmax import filler as _softmax_filler
    from megatron_musa_patch.lib.ops import policy

    with policy.overridden(forced="eager"):  # the convention, not the compiler
        causal, masked = ModuleType("c"), ModuleType("m")
        _softmax_filler("scaled_upper_triang_masked_softmax_cuda")(causal)
        _softmax_filler("scaled_masked_softmax_cuda")(masked)
        x = torch.randn(6, 9, 9, dtype=torch.bfloat16)
        scale_t = torch.tensor([0.5])
        y = causal.forward(x, scale_t[0])
        torch.testing.assert_close(y, softmax.softmax_reference(x, None, 0.5, causal=True))
        dy = torch.randn_like(y)
        dx = causal.backward(dy, y, scale_t[0])
        want = 0.5 * y.float() * (dy.float() - (dy.float() * y.float()).sum(-1, keepdim=True))
        torch.testing.assert_close(dx, want.bfloat16())
        mask = torch.zeros(1, 1, 9, 9, dtype=torch.bool)
        mask[..., 4:] = True
        y = masked.forward(x.view(2, 3, 9, 9), mask, scale_t[0])
        assert torch.all(y[..., 4:] == 0) and masked.get_batch_per_block(9, 9, 2, 3) == 1
