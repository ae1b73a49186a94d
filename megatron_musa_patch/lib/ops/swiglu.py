"""Bias + SwiGLU: ``silu(x1 + b1) * (x2 + b2)`` where ``[x1 | x2]`` are the halves of the last
dimension (megatron-core's ``bias_swiglu_impl``), forward and backward.

Implementations: ``kernel`` (``swiglu_fwd/bwd`` from ``ops.kernels`` on a GPU), ``compile``
(the formulas below, ``torch.compile``d: one loop each way, fp32 inside), ``eager`` (the same
formulas op by op, in the input dtype like upstream's ``BiasSwiGLUFunction``).

Measured choice (``benchmarks/bench_ops.py``; the figures are in docs/benchmarks.md, fused ops):
the compiled formula beats upstream's unfused ``silu(x1) * x2`` with autograd (as
``torch.compile`` of the unfused formula does) -> the CPU uses ``compile``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import choose, compile_or_eager, compiled, kernel

CHOICE = {"cpu": "compile"}
DEFAULT_CHOICE = "eager"


def swiglu_reference(x, bias=None):
    x32 = x.float() + (bias.float() if bias is not None else 0.0)
    a, b = torch.chunk(x32, 2, -1)
    return (F.silu(a) * b).to(x.dtype)


def _fwd(x, bias):
    y = x if bias is None else x + bias
    a, b = torch.chunk(y, 2, -1)
    return F.silu(a) * b


def _bwd(g, x, bias):
    y = x if bias is None else x + bias
    a, b = torch.chunk(y, 2, -1)
    s = torch.sigmoid(a)
    return torch.cat((g * s * (1 + a * (1 - s)) * b, g * F.silu(a)), -1)


def _fwd32(x, bias):
    return _fwd(x.float(), None if bias is None else bias.float()).to(x.dtype)


def _bwd32(g, x, bias):
    y = x.float() if bias is None else x.float() + bias.float()
    a, b = torch.chunk(y, 2, -1)
    g = g.float()
    s = torch.sigmoid(a)
    # each half cast before the concatenation: inductor then writes x's dtype directly
    return torch.cat(((g * s * (1 + a * (1 - s)) * b).to(x.dtype), (g * a * s).to(x.dtype)), -1)


_IMPLS = {"eager": (_fwd, _bwd), "compile": (compiled(_fwd32), compiled(_bwd32))}


def _kernel_impls(device_type):
    fwd, bwd = kernel("swiglu_fwd", device_type), kernel("swiglu_bwd", device_type)

    def kfwd(x, bias):
        return fwd((x if bias is None else x + bias).contiguous())

    def kbwd(g, x, bias):
        return bwd(g.contiguous(), (x if bias is None else x + bias).contiguous())

    return kfwd, kbwd


class _BiasSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, impl):
        ctx.save_for_backward(x, bias)
        ctx.impl, ctx.has_bias = impl, bias is not None
        return impl[0](x, bias)

    @staticmethod
    def backward(ctx, g):
        x, bias = ctx.saved_tensors
        dx = ctx.impl[1](g, x, bias)
        dbias = dx.reshape(-1, dx.shape[-1]).sum(0).to(bias.dtype) if ctx.has_bias else None
        return dx, dbias, None


def swiglu_impl(device_type: str, numel: int = None) -> str:
    """``kernel`` | ``compile`` | ``eager`` | ``unfused`` (the formula under torch's autograd,
    upstream's --no-bias-swiglu-fusion path: small inputs on the CPU, see
    ``dispatch.CPU_MIN_NUMEL``)."""
    return choose("swiglu", device_type, numel, measured=CHOICE, default=DEFAULT_CHOICE,
                  unfused="unfused", kernels=("swiglu_fwd", "swiglu_bwd"),
                  forced_as=compile_or_eager)


def bias_swiglu(x, bias=None, impl: str = None):
    """SwiGLU of ``x + bias`` over the last dimension (bias optional), any leading shape."""
    impl = impl or swiglu_impl(x.device.type, x.numel())
    if impl == "unfused":  # autograd's backward of the two ops is cheaper than ours when small
        return _fwd(x, bias)
    impls = _kernel_impls(x.device.type) if impl == "kernel" else _IMPLS[impl]
    return _BiasSwiGLU.apply(x, bias, impls)
