"""The size cut-off: below ``dispatch.CPU_MIN_NUMEL`` the CPU runs each op unfused (a compiled
call's fixed cost is larger than the op), above it the measured choice; a forced
MEGATRON_MUSA_PATCH_OPS and other devices ignore it. The small path is checked against the
references through the ops' public entry points (impl chosen by size)."""

import pytest
import torch

from megatron_musa_patch.lib.ops import dispatch, norm, rope, softmax, swiglu

CHOOSERS = {  # op name in CPU_MIN_NUMEL -> (impl chooser, small choice, large choice)
    "rms_norm": (norm.rms_norm_impl, "native", "compile"),
    "swiglu": (swiglu.swiglu_impl, "unfused", "compile"),
    "rope": (rope.rope_impl, "eager", "compile"),
    "softmax": (softmax.softmax_impl, "eager", "compile"),
}


@pytest.mark.parametrize("op", sorted(CHOOSERS))
def test_choice_switches_at_the_cutoff(op):
    choose, small, large = CHOOSERS[op]
    limit = dispatch.CPU_MIN_NUMEL[op]
    assert choose("cpu", limit - 1) == small
    assert choose("cpu", limit) == large
    assert choose("cpu") == large  # size unknown: the measured choice
    # other devices: no cut-off (their choice does not depend on the size)
    assert choose("musa", 1) == choose("musa", limit * 4)


@pytest.mark.parametrize("op", sorted(CHOOSERS))
def test_forced_implementation_ignores_the_cutoff(op):
    from megatron_musa_patch.lib.ops import policy

    with policy.overridden(forced="compile"):
        assert CHOOSERS[op][0]("cpu", 1) == "compile"


def _grads(fn, inputs):
    out = fn(*inputs)
    up = torch.randn_like(out)
    return out, torch.autograd.grad(out, inputs, up)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_inputs_match_the_references(dtype):
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.manual_seed(0)
    x = torch.randn(8, 3, 40, dtype=dtype, requires_grad=True)
    w = torch.rand(40, dtype=dtype, requires_grad=True)
    for ours, ref in ((lambda a, b: norm.rms_norm(a, b, 1e-5),
                       lambda a, b: norm.rms_norm_reference(a, b, 1e-5)),
                      (lambda a, b: swiglu.bias_swiglu(a, b[:a.shape[-1] // 2].repeat(2)),
                       lambda a, b: swiglu.swiglu_reference(a, b[:a.shape[-1] // 2].repeat(2)))):
        torch.manual_seed(1)
        got = _grads(ours, (x, w))
        torch.manual_seed(1)
        want = _grads(ref, (x, w))
        for g, e in zip((got[0], *got[1]), (want[0], *want[1])):
            torch.testing.assert_close(g, e, **tol)

    t = torch.randn(6, 2, 3, 16, dtype=dtype, requires_grad=True)
    freqs = torch.randn(6, 1, 1, 8)
    got = _grads(lambda a: rope.apply_rope_bshd(a, freqs), (t,))
    torch.manual_seed(2)
    up = torch.randn_like(got[0])
    out = rope.rope_reference(t, freqs)
    assert torch.equal(got[0], out)  # the eager formula is bit-identical to upstream's
    torch.testing.assert_close(torch.autograd.grad(out, t, up)[0],
                               torch.autograd.grad(rope.apply_rope_bshd(t, freqs), t, up)[0],
                               **tol)

    if dtype == torch.bfloat16:
        s = torch.randn(2, 3, 16, 16, dtype=dtype, requires_grad=True)
        torch.manual_seed(3)
        up = torch.randn(2, 3, 16, 16, dtype=dtype)
        y = softmax.scaled_upper_triang_masked_softmax(s, 0.5)
        ref = softmax.softmax_reference(s, None, 0.5, causal=True)
        torch.testing.assert_close(y, ref, **tol)
        torch.testing.assert_close(torch.autograd.grad(y, s, up)[0],
                                   torch.autograd.grad(ref, s, up)[0], **tol)


def test_small_rms_norm_is_torchs_own_and_not_a_view():
    x, w = torch.randn(4, 64), torch.rand(64)
    out = norm.rms_norm(x, w, 1e-6)
    assert torch.equal(out, torch.nn.functional.rms_norm(x, (64,), w, 1e-6))
    assert out._base is None


def test_the_bias_swiglu_fusion_point_applies_the_cutoff():
    """megatron-core's bias_swiglu_impl (patched by fused_ops) is the path training takes."""
    from megatron_musa_patch.features.fused_ops.swiglu import bias_swiglu as _bias_swiglu

    def upstream():
        raise AssertionError("the CPU never calls upstream's function here")

    def bias_swiglu_impl(input, bias, fp8_input_store=False, cpu_offload_input=False):
        return upstream()

    small = torch.randn(4, 3, 32, requires_grad=True)
    out = _bias_swiglu(bias_swiglu_impl, None, (small, None), {})
    assert type(out.grad_fn).__name__ == "MulBackward0"  # unfused: the formula under autograd
    torch.testing.assert_close(out, swiglu.swiglu_reference(small))
