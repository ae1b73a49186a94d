"""ops.norm: RMSNorm and LayerNorm forward and backward against the fp32 references, every
implementation, fp32/bf16/fp16, odd hidden sizes and batch 1; the modules keep torch's
parameters and mark them for sequence parallelism. Tolerances: ops_cases.TOL (bf16 2e-2,
fp16 2e-3, fp32 2e-5), gradients x4 (reductions over rows)."""

import pytest
import torch

from megatron_musa_patch.lib.ops import norm

from tests.lib.ops.cases import DEVICES, DTYPES, assert_close, grads, wave

SHAPES = [(3, 5, 37), (1, 1, 64), (2, 96)]


def _case(shape, dtype, device, bias=True):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g).to(device, dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(device, dtype)
    b = (0.1 * torch.randn(shape[-1], generator=g)).to(device, dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("impl", ["eager", "compile", "native", None])
def test_rms_norm(device, dtype, shape, impl):
    if impl in ("compile", None) and (dtype == torch.float16 or shape != SHAPES[0]) \
            and device == "cpu":
        pytest.skip("compiled path: one shape, fp32/bf16 (each compile costs seconds in CI)")
    x, w, _ = _case(shape, dtype, device, bias=False)
    up = wave
    out, (dx, dw) = grads(lambda a, b: norm.rms_norm(a, b, 1e-5, impl), (x, w), up)
    ref, (rdx, rdw) = grads(lambda a, b: norm.rms_norm_reference(a, b, 1e-5), (x, w), up)
    assert out.dtype == dtype and dx.dtype == dtype and dw.dtype == dtype
    assert_close(out, ref, dtype)
    assert_close(dx, rdx, dtype, scale=4)
    assert_close(dw, rdw, dtype, scale=4 * max(1, x.numel() // shape[-1]) ** 0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(device, dtype, shape, bias):
    x, w, b = _case(shape, dtype, device, bias)
    up = wave
    inputs = (x, w, b)
    out, gs = grads(lambda a, c, d: norm.layer_norm(a, c, d, 1e-5), inputs, up)
    ref, rgs = grads(lambda a, c, d: norm.layer_norm_reference(a, c, d, 1e-5), inputs, up)
    assert_close(out, ref, dtype)
    for got, want in zip(gs, rgs):
        assert_close(got, want, dtype, scale=4 * max(1, x.numel() // shape[-1]) ** 0.5)


def test_modules_keep_torch_parameters_and_mark_sequence_parallel():
    rms, ln = norm.RMSNorm(40, eps=1e-6, sequence_parallel=True), norm.LayerNorm(40)
    assert isinstance(rms, torch.nn.RMSNorm) and isinstance(ln, torch.nn.LayerNorm)
    assert set(rms.state_dict()) == {"weight"} and set(ln.state_dict()) == {"weight", "bias"}
    assert rms.weight.sequence_parallel is True and ln.bias.sequence_parallel is False
    x = torch.randn(3, 4, 40)
    out = rms(x)
    assert out._base is None  # Megatron's pipeline schedule frees stage outputs: no views
    torch.testing.assert_close(out, torch.nn.RMSNorm(40, eps=1e-6)(x), atol=2e-6, rtol=2e-6)
    assert torch.equal(ln(x), torch.nn.LayerNorm(40)(x))  # CPU LayerNorm is torch's own kernel


def test_cpu_choice_is_the_measured_one():
    assert norm.rms_norm_impl("cpu") == "compile"
    assert norm.layer_norm_impl("cpu") == "native"
