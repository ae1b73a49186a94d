"""ops.grad_accum: ``main_grad += dY^T X`` in place (Apex's wgrad_gemm_accum_fp32/fp16
convention), same-dtype and mixed (bf16/fp16 activations into an fp32 main_grad: fp32 token
chunks, or output-row blocks in the activation dtype), odd sizes, one token, accumulation over
several calls, and no weight-sized temporary.
Tolerances: 1e-5 relative to the fp32 reference for fp32 sums; 3e-2 where a gradient is
rounded to bf16/fp16 first; the rows strategy is bitwise the unfused gradient."""

import pytest
import torch

from megatron_musa_patch.lib.ops import grad_accum

from tests.lib.ops.cases import DEVICES

CASES = [  # (activation dtype, main_grad dtype)
    (torch.float32, torch.float32), (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtypes", CASES, ids=lambda d: f"{d[0]}->{d[1]}".replace("torch.", ""))
@pytest.mark.parametrize("tokens,fan_in,fan_out", [(37, 13, 7), (1, 64, 24), (300, 33, 5)])
@pytest.mark.parametrize("mixed", ["fp32", "rows"])
def test_accumulates_in_place(device, dtypes, tokens, fan_in, fan_out, mixed, monkeypatch):
    act, main = dtypes
    monkeypatch.setitem(grad_accum.MIXED_CHOICE, torch.device(device).type, mixed)
    monkeypatch.setattr(grad_accum, "CHUNK_ELEMENTS", 1024)  # several chunks on small cases
    g = torch.Generator().manual_seed(tokens)
    main_grad = torch.randn(fan_out, fan_in, generator=g).to(device, main)
    expected = main_grad.clone()
    storage = main_grad.data_ptr()
    for _ in range(3):  # micro-batches
        x = torch.randn(tokens, fan_in, generator=g).to(device, act)
        dy = torch.randn(tokens, fan_out, generator=g).to(device, act)
        fn = grad_accum.wgrad_gemm_accum_fp32 if main == torch.float32 else \
            grad_accum.wgrad_gemm_accum_fp16
        fn(x, dy, main_grad)
        grad_accum.wgrad_accum_reference(x, dy, expected)
    assert main_grad.data_ptr() == storage and main_grad.dtype == main
    # fp32 sums, or each call's gradient rounded to the activation dtype first ("rows")
    narrow = main != torch.float32 or (act != main and mixed == "rows")
    tol = 3e-2 if narrow else 1e-5
    torch.testing.assert_close(main_grad, expected, atol=tol * (tokens ** 0.5), rtol=tol)


def test_rows_strategy_equals_the_unfused_gradient_bitwise():
    x, dy = torch.randn(300, 40, dtype=torch.bfloat16), torch.randn(300, 48, dtype=torch.bfloat16)
    fused, unfused = torch.ones(48, 40), torch.ones(48, 40)
    grad_accum.wgrad_accum(x, dy, fused, "rows")
    unfused.add_(dy.t().matmul(x))  # the unfused backward, then DDP's main_grad.add_(grad)
    assert torch.equal(fused, unfused)


def test_mixed_dtype_temporaries_are_chunk_sized(monkeypatch):
    """The bf16 -> fp32 "fp32" path never allocates a weight-sized (out x in) tensor."""
    monkeypatch.setattr(grad_accum, "CHUNK_ELEMENTS", 64 * (48 + 40))
    seen = []
    real_to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        out = real_to(self, *args, **kwargs)
        seen.append(tuple(out.shape))
        return out

    monkeypatch.setattr(torch.Tensor, "to", spy)
    main_grad = torch.zeros(48, 40)
    grad_accum.wgrad_accum(torch.randn(1000, 40, dtype=torch.bfloat16),
                           torch.randn(1000, 48, dtype=torch.bfloat16), main_grad, "fp32")
    assert seen and max(shape[0] for shape in seen) == 64
