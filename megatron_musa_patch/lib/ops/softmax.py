"""Scaled masked softmax over the last dimension, as megatron-core's ``FusedScaleMaskSoftmax``
asks of its CUDA extensions (``scaled_masked_softmax_cuda``, ``scaled_upper_triang_masked_
softmax_cuda``, ``scaled_softmax_cuda``): fp16/bf16 scores in, softmax computed in fp32 of
``scores * scale`` with masked positions (``mask == True``) set to -10000 (the causal variant
zeroes the upper triangle), probabilities out in the input dtype. Like those kernels, the output
(input dtype) is what backward keeps: ``dx = scale * y * (dy - sum(dy * y))`` in fp32.

Implementations: ``compile`` (formulas ``torch.compile``d), ``eager``. No csrc kernel.

Measured choice (``benchmarks/bench_ops.py``; the figures are in docs/benchmarks.md, fused ops):
the compiled formulas beat upstream's torch fallback (they keep bf16 probabilities for
backward, the fallback fp32 ones) -> the CPU uses ``compile``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .dispatch import choose, compile_or_eager, compiled

CHOICE = {"cpu": "compile"}
DEFAULT_CHOICE = "eager"
MASKED_VALUE = -10000.0


def softmax_reference(x, mask, scale, causal=False):
    """Upstream's torch fallback (``forward_torch_softmax`` with softmax in fp32)."""
    x32 = x.float() * scale
    if causal:
        sq, sk = x.shape[-2:]
        mask = torch.triu(torch.ones(sq, sk, dtype=torch.bool, device=x.device), diagonal=1)
    if mask is not None:
        x32 = x32.masked_fill(mask, MASKED_VALUE)
    return torch.softmax(x32, dim=-1).to(x.dtype)


def _fwd(x, mask, scale: float):
    x32 = x.float() * scale
    if mask is not None:
        x32 = x32.masked_fill(mask, MASKED_VALUE)
    return torch.softmax(x32, dim=-1).to(x.dtype)


def _causal(x, scale: float, fwd):
    # the mask is built outside the compiled formula: the device layer wraps torch's factory
    # functions, which dynamo cannot trace (it would run the whole formula eagerly)
    sq, sk = x.shape[-2:]
    upper = torch.ones((sq, sk), dtype=torch.bool, device=x.device).triu(1)
    return fwd(x, upper, scale)


def _bwd(dy, y, scale: float):
    y32, dy32 = y.float(), dy.float()
    return (scale * y32 * (dy32 - (dy32 * y32).sum(-1, keepdim=True))).to(y.dtype)


class Raw(NamedTuple):
    """Forward/backward without autograd, the calling convention of Megatron's kernels."""

    masked: Callable  # (x, mask or None, scale) -> y
    causal: Callable  # (x, scale) -> y
    backward: Callable  # (dy, y, scale) -> dx


def _raw(fwd, bwd):
    return Raw(fwd, lambda x, scale: _causal(x, scale, fwd), bwd)


_IMPLS = {"eager": _raw(_fwd, _bwd), "compile": _raw(compiled(_fwd), compiled(_bwd))}


def raw(impl: str) -> Raw:
    return _IMPLS[impl]


class _ScaledMaskedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, scale, causal, impl):
        y = impl[1](x, scale) if causal else impl[0](x, mask, scale)
        ctx.save_for_backward(y)
        ctx.scale, ctx.impl = scale, impl
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return ctx.impl[2](dy, y, ctx.scale), None, None, None, None


def softmax_impl(device_type: str, numel: int = None) -> str:
    """``compile`` | ``eager`` (also for small score tensors on the CPU, see
    ``dispatch.CPU_MIN_NUMEL``)."""
    return choose("softmax", device_type, numel, measured=CHOICE, default=DEFAULT_CHOICE,
                  unfused="eager", forced_as=compile_or_eager)


def scaled_masked_softmax(x, mask, scale: float = 1.0, impl: str = None):
    """``softmax(x * scale, masked -10000)``; ``mask`` bool, broadcastable, or None."""
    impl = impl or softmax_impl(x.device.type, x.numel())
    return _ScaledMaskedSoftmax.apply(x, mask, float(scale), False, _IMPLS[impl])


def scaled_upper_triang_masked_softmax(x, scale: float = 1.0, impl: str = None):
    """Causal: position ``j > i`` of row ``i`` gets probability 0 (``x [..., sq, sk]``)."""
    impl = impl or softmax_impl(x.device.type, x.numel())
    return _ScaledMaskedSoftmax.apply(x, None, float(scale), True, _IMPLS[impl])
