"""Rotary position embedding with megatron-core's ``apply_rotary_pos_emb`` semantics: ``bshd``
(``[s, b, h, d]`` with ``freqs [s, 1, 1, r]``) and packed ``thd`` (``[t, h, d]`` with
``cu_seqlens``, context-parallel slices, and the exact-offset mode where ``freqs`` has one row
per packed token), rotate-half or interleaved, multi-latent-attention channel order, ``mscale``.
Only the first ``r`` channels rotate; the rest pass through.

``y = t * cos + rotate(t) * sin`` in ``t``'s dtype with ``cos``/``sin`` cast to it, as upstream's
unfused path computes it, so the eager implementation is bit-identical to it; the backward is
``g * cos + rotate^T(g * sin)`` without saving ``t``.

Implementations: ``kernel`` (``rope_fwd/bwd`` from ``ops.kernels`` on a GPU), ``compile``
(formulas ``torch.compile``d), ``eager``.

Measured choice (``benchmarks/bench_ops.py``; the figures are in docs/benchmarks.md, fused ops):
the compiled formulas beat upstream's unfused formula with autograd -> the CPU uses
``compile``.
"""

from __future__ import annotations

import torch

from .dispatch import choose, compile_or_eager, compiled, kernel

CHOICE = {"cpu": "compile"}
DEFAULT_CHOICE = "eager"


# --------------------------------------------------------------------------- formulas


def _rotate(x, interleaved: bool):
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _rotate_transposed(x, interleaved: bool):
    """The adjoint of :func:`_rotate` (its inverse: rotating by -90 degrees)."""
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((x2, -x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x2, -x1), dim=-1).flatten(-2)


def _fwd(t, cos, sin, interleaved: bool):
    return (t * cos) + (_rotate(t, interleaved) * sin)


def _bwd(g, cos, sin, interleaved: bool):
    return (g * cos) + _rotate_transposed(g * sin, interleaved)


_IMPLS = {"eager": (_fwd, _bwd), "compile": (compiled(_fwd), compiled(_bwd))}


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, cos, sin, interleaved, impl):
        ctx.save_for_backward(cos, sin)
        ctx.interleaved, ctx.impl = interleaved, impl
        return impl[0](t, cos, sin, interleaved)

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return ctx.impl[1](g, cos, sin, ctx.interleaved), None, None, None, None


def rope_impl(device_type: str, numel: int = None) -> str:
    """``kernel`` | ``compile`` | ``eager`` (also for small tensors on the CPU, see
    ``dispatch.CPU_MIN_NUMEL``)."""
    return choose("rope", device_type, numel, measured=CHOICE, default=DEFAULT_CHOICE,
                  unfused="eager", kernels=("rope_fwd", "rope_bwd"), forced_as=compile_or_eager)


def _impls(impl, device_type):
    if impl != "kernel":
        return _IMPLS[impl]
    fwd, bwd = kernel("rope_fwd", device_type), kernel("rope_bwd", device_type)
    return (lambda t, c, s, i: fwd(t.contiguous(), c, s, i),
            lambda g, c, s, i: bwd(g.contiguous(), c, s, i))


# --------------------------------------------------------------------------- entry points


def apply_rope_bshd(t, freqs, interleaved=False, multi_latent_attention=False, mscale=1.0,
                    impl: str = None):
    """RoPE on ``t [s, ..., d]`` with ``freqs [s, ..., r]`` (r <= d)."""
    rot_dim = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    if multi_latent_attention:  # MLA stores the rotary channels interleaved: even | odd
        t_rot = torch.cat((t_rot[..., 0::2], t_rot[..., 1::2]), dim=-1)
    cos = (torch.cos(freqs) * mscale).to(t.dtype)
    sin = (torch.sin(freqs) * mscale).to(t.dtype)
    impl = impl or rope_impl(t.device.type, t_rot.numel())
    out = _Rope.apply(t_rot, cos, sin, interleaved, _impls(impl, t.device.type))
    return out if t_pass.shape[-1] == 0 else torch.cat((out, t_pass), dim=-1)


def thd_positions(cu_seqlens, freqs_rows: int, cp_size: int = 1, cp_rank: int = 0):
    """Row of ``freqs`` for every packed token on this context-parallel rank.

    Each sequence holds ``len / cp_size`` tokens here: with CP its two chunks (``cp_rank`` and
    ``2*cp_size-1-cp_rank`` of ``2*cp_size``). Positions restart at 0 per sequence, unless
    ``freqs`` has one row per packed token (``freqs_rows == cu_seqlens[-1]``): then each sequence
    reads from its own offset (megatron-core's exact-offset mode for non-1D RoPE)."""
    bounds = cu_seqlens.tolist()
    exact = freqs_rows == bounds[-1]
    pieces = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        local = (end - start) // cp_size
        offset = start if exact else 0
        if cp_size > 1:
            half, full = local // 2, cp_size * local
            pieces += [torch.arange(half) + offset + cp_rank * half,
                       torch.arange(half) + offset + full - (cp_rank + 1) * half]
        else:
            pieces.append(torch.arange(local) + offset)
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)


def apply_rope_thd(t, cu_seqlens, freqs, interleaved=False, multi_latent_attention=False,
                   mscale=1.0, cp_size=1, cp_rank=0, impl: str = None):
    """RoPE on packed ``t [t, h, d]`` with ``freqs [max_s or t, 1, 1, r]``."""
    rows = thd_positions(cu_seqlens, freqs.shape[0], cp_size, cp_rank).to(freqs.device)
    return apply_rope_bshd(t.unsqueeze(1), freqs[rows], interleaved, multi_latent_attention,
                           mscale, impl).squeeze(1)


def rope_reference(t, freqs, interleaved=False, multi_latent_attention=False, mscale=1.0):
    """The formulas with autograd through plain torch ops (no custom backward)."""
    rot_dim = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    if multi_latent_attention:
        t_rot = torch.cat((t_rot[..., 0::2], t_rot[..., 1::2]), dim=-1)
    cos = (torch.cos(freqs) * mscale).to(t.dtype)
    sin = (torch.sin(freqs) * mscale).to(t.dtype)
    return torch.cat((_fwd(t_rot, cos, sin, interleaved), t_pass), dim=-1)


# TE-compatible signatures for megatron-core's ``fused_apply_rotary_pos_emb[_thd]`` slots


def fused_apply_rotary_pos_emb(t, freqs, transpose_output_memory=False, interleaved=False):
    return apply_rope_bshd(t, freqs, interleaved=interleaved)


def fused_apply_rotary_pos_emb_thd(t, cu_seqlens, freqs, cp_size=1, cp_rank=0, interleaved=False):
    return apply_rope_thd(t, cu_seqlens, freqs, interleaved=interleaved, cp_size=cp_size,
                          cp_rank=cp_rank)
