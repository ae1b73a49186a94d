"""RMSNorm and LayerNorm over the last dimension, forward and backward.

Implementations:

* ``kernel`` -- ``rms_norm_fwd/bwd``, ``layer_norm_fwd/bwd`` from ``ops.kernels`` (csrc/) on a
  GPU that reports them available.
* ``compile`` -- the eager formulas below, each ``torch.compile``d (one fused loop forward, one
  backward), inside one autograd function.
* ``eager`` -- the same formulas op by op.
* ``native`` -- ``F.rms_norm`` / ``F.layer_norm`` (what ``torch.nn.RMSNorm`` / ``LayerNorm`` run,
  i.e. upstream's ``--no-persist-layer-norm`` path).

Measured choice (``benchmarks/bench_ops.py``; the figures are in docs/benchmarks.md, fused ops):

* RMSNorm: the CPU uses ``compile`` (torch's CPU ``rms_norm`` is a composite: several kernels
  forward, autograd through each of them backward).
* LayerNorm: the CPU uses ``native``, one ATen kernel each way (also bit-identical to upstream's
  torch norm).

Statistics are computed in fp32 for every input dtype; outputs have the input's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import choose, compiled, kernel

#: per device type -> implementation when no kernel applies (``MEGATRON_MUSA_PATCH_OPS`` forces
#: ``eager`` / ``compile`` / ``native`` everywhere)
RMS_CHOICE = {"cpu": "compile"}
LAYER_NORM_CHOICE = {"cpu": "native"}
DEFAULT_CHOICE = "native"  # GPUs without our kernels: torch's own fused CUDA/MUSA kernels


# --------------------------------------------------------------------------- references


def rms_norm_reference(x, weight, eps):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def layer_norm_reference(x, weight, bias, eps):
    x32 = x.float()
    mean = x32.mean(-1, keepdim=True)
    var = (x32 - mean).pow(2).mean(-1, keepdim=True)
    y = (x32 - mean) * torch.rsqrt(var + eps) * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


# --------------------------------------------------------------------------- formulas


def _rms_fwd(x, weight, eps: float):
    x32 = x.float()
    rstd = torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
    return (x32 * rstd * weight.float()).to(x.dtype), rstd


def _rms_bwd(dy, x, weight, rstd):
    x32 = x.float()
    xhat = x32 * rstd
    dy32 = dy.float()
    g = dy32 * weight.float()
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    dweight = (dy32 * xhat).flatten(0, -2).sum(0)
    return dx.to(x.dtype), dweight.to(weight.dtype)


_RMS_IMPLS = {"eager": (_rms_fwd, _rms_bwd), "compile": (compiled(_rms_fwd), compiled(_rms_bwd))}


# Outputs are never views of an intermediate: Megatron's pipeline schedule frees stage outputs
# and refuses views (upstream's FusedLayerNorm makes its output viewless for that reason).


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, impl):
        y, rstd = impl[0](x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.impl = impl
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dweight = ctx.impl[1](dy.contiguous(), x, weight, rstd)
        return dx, dweight, None, None


class _LayerNormKernel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, fwd, bwd):
        x = x.contiguous()
        y, mean, rstd = fwd(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.bwd, ctx.has_bias = bwd, bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dweight, dbias = ctx.bwd(dy.contiguous(), x, weight, mean, rstd)
        return dx, dweight, dbias if ctx.has_bias else None, None, None, None


def rms_norm_impl(device_type: str, numel: int = None) -> str:
    """The implementation for ``device_type`` (and a tensor of ``numel`` elements, if given:
    small ones run ``native`` on the CPU, see ``dispatch.CPU_MIN_NUMEL``)."""
    return choose("rms_norm", device_type, numel, measured=RMS_CHOICE, default=DEFAULT_CHOICE,
                  unfused="native", kernels=("rms_norm_fwd", "rms_norm_bwd"))


def layer_norm_impl(device_type: str) -> str:
    return choose("layer_norm", device_type, None, measured=LAYER_NORM_CHOICE,
                  default=DEFAULT_CHOICE, unfused="native",
                  kernels=("layer_norm_fwd", "layer_norm_bwd"),
                  forced_as=lambda choice: "native" if choice == "eager" else choice)


def rms_norm(x, weight, eps: float, impl: str = None):
    """``y = x / sqrt(mean(x^2) + eps) * weight`` over the last dimension."""
    impl = impl or rms_norm_impl(x.device.type, x.numel())
    if impl == "native":
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    if impl == "kernel":
        kernels = (kernel("rms_norm_fwd", x.device.type), kernel("rms_norm_bwd", x.device.type))
        return _RMSNorm.apply(x.contiguous(), weight, eps, kernels)
    return _RMSNorm.apply(x, weight, eps, _RMS_IMPLS[impl])


def layer_norm(x, weight, bias, eps: float, impl: str = None):
    """``F.layer_norm`` over the last dimension (weight and bias optional)."""
    impl = impl or layer_norm_impl(x.device.type)
    if impl == "kernel":
        fwd, bwd = kernel("layer_norm_fwd", x.device.type), kernel("layer_norm_bwd", x.device.type)
        return _LayerNormKernel.apply(x, weight, bias, eps, fwd, bwd)
    if impl == "compile":
        return _compiled_layer_norm(x, (x.shape[-1],), weight, bias, eps)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


_compiled_layer_norm = compiled(F.layer_norm)


# --------------------------------------------------------------------------- modules


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` (same parameters and state dict) running :func:`rms_norm`.

    ``sequence_parallel=True`` marks the weight like Megatron's own norms, so
    ``finalize_model_grads`` all-reduces its gradient across the tensor-parallel group (each
    rank saw only its slice of the sequence)."""

    def __init__(self, hidden_size, eps=1e-5, sequence_parallel=False):
        super().__init__(hidden_size, eps=eps)
        self.sequence_parallel = sequence_parallel
        setattr(self.weight, "sequence_parallel", sequence_parallel)

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class LayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` (same parameters and state dict) running :func:`layer_norm`;
    ``sequence_parallel`` as for :class:`RMSNorm`."""

    def __init__(self, hidden_size, eps=1e-5, sequence_parallel=False):
        super().__init__(hidden_size, eps=eps)
        self.sequence_parallel = sequence_parallel
        for param in (self.weight, self.bias):
            setattr(param, "sequence_parallel", sequence_parallel)

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)
