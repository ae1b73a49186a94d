"""ops.swiglu: bias + SwiGLU forward and backward (input and bias gradients) against the fp32
reference, every implementation, with and without bias, fp32/bf16/fp16, odd widths, batch 1.
Tolerances: ops_cases.TOL, bias gradients x4 (sums over rows)."""

from functools import partial

import pytest
import torch

from megatron_musa_patch.lib.ops import swiglu

from tests.lib.ops.cases import DEVICES, DTYPES, assert_close, grads, wave

SHAPES = [(3, 5, 2 * 19), (1, 1, 2 * 64), (7, 2 * 48)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("impl", ["eager", "compile", None])
def test_bias_swiglu(device, dtype, shape, bias, impl):
    if impl in ("compile", None) and device == "cpu" and (
            dtype == torch.float16 or shape != SHAPES[0]
            or bias != (dtype == torch.float32)):
        pytest.skip("compiled path: one shape, fp32 with bias, bf16 without (compiles cost "
                    "seconds in CI)")
    g = torch.Generator().manual_seed(shape[-1])
    x = torch.randn(shape, generator=g).to(device, dtype)
    b = (0.5 * torch.randn(shape[-1], generator=g)).to(device, dtype) if bias else None
    up = partial(wave, fn=torch.cos)
    out, gs = grads(lambda a, c: swiglu.bias_swiglu(a, c, impl), (x, b), up)
    ref, rgs = grads(lambda a, c: swiglu.swiglu_reference(a, c), (x, b), up)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    assert_close(out, ref, dtype)
    assert_close(gs[0], rgs[0], dtype)
    if bias:
        assert_close(gs[1], rgs[1], dtype, scale=4 * (x.numel() // shape[-1]) ** 0.5)

