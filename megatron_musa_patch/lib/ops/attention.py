"""Core attention through ``torch.nn.functional.scaled_dot_product_attention`` (SDPA).

Layout and semantics are those of megatron-core's local ``DotProductAttention``: query
``[sq, b, np, hn]``, key ``[sk, b, ng, hn]``, value ``[sk, b, ng, hv]`` (``ng`` query groups, GQA;
``hv`` may differ from ``hn``, as in MLA), output ``[sq, b, np * hv]``; a boolean mask marks
the positions to *drop* (True = masked), broadcastable to ``[b, np, sq, sk]``.

SDPA picks the device's fused kernel (flash attention on CUDA and MUSA, the flash CPU kernel on
CPU). Two details keep its result equal to upstream's unfused math:

* upstream fills masked scores with -10000 rather than -inf, so a query row whose keys are all
  masked attends *uniformly* (its output is the mean of the values); SDPA returns zeros there.
  Such rows are detected once per mask and given the mean of the values.
* a mask that is exactly the causal mask is passed as ``is_causal`` (the fast kernels skip the
  upper triangle instead of reading a mask); the verdict is cached per mask tensor, since every
  layer of a step receives the same one.

``reference_attention`` is upstream's unfused math (scaled QK^T, masked_fill -10000, softmax in
fp32 or the input dtype, dropout, PV), the reference the tests compare against.
"""

from __future__ import annotations

import math
import weakref
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

#: masked scores in upstream's unfused softmax (megatron.core.transformer.utils.attention_mask_func)
UPSTREAM_MASK_VALUE = -10000.0


def causal_mask(sq: int, sk: int, device=None) -> torch.Tensor:
    """Upstream's causal mask (True above the diagonal = masked), for sq == sk."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(diagonal=1)


def sliding_window_mask(sq: int, sk: int, window, device=None) -> torch.Tensor:
    """Masked (True) outside ``window = (before, after)`` around the bottom-right-aligned
    diagonal, the window megatron-core's local attention uses for ``window_size``."""
    before, after = window
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    keep = keep.triu(diagonal=sk - sq - before).tril(diagonal=sk - sq + after)
    return ~keep


#: On CPU, SDPA's flash kernel computes 16-bit inputs through fp32 blocks, while upstream's unfused
#: path runs bf16 GEMMs: for short sequences the unfused path is as fast or faster
#: (benchmarks/bench_attention.py; the figures are in docs/benchmarks.md, fused ops). Below this
#: many query x key positions, 16-bit attention on CPU keeps upstream's path; fp32 always takes
#: SDPA (faster already at seq 256).
CPU_16BIT_MIN_POSITIONS = 640 * 640


def sdpa_preferred(device_type: str, dtype: torch.dtype, sq: int, sk: int) -> bool:
    """Whether SDPA beats upstream's unfused attention here (by measurement, see above)."""
    if device_type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return sq * sk >= CPU_16BIT_MIN_POSITIONS
    return True


# ---------------------------------------------------------------------------------- mask analysis

class _MaskVerdict:
    __slots__ = ("ref", "version", "shape", "is_causal", "dead_rows")

    def __init__(self, mask, is_causal, dead_rows):
        self.ref = weakref.ref(mask)
        self.version = _version(mask)
        self.shape = tuple(mask.shape)
        self.is_causal = is_causal
        self.dead_rows = dead_rows

    def matches(self, mask) -> bool:
        return (self.version is not None and self.ref() is mask
                and self.version == _version(mask) and self.shape == tuple(mask.shape))


def _version(tensor):
    """The in-place version counter, or None (inference tensors have none: never cached)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


_last_verdict: Optional[_MaskVerdict] = None


def analyse_mask(mask: torch.Tensor) -> Tuple[bool, Optional[torch.Tensor]]:
    """(mask is the plain causal mask, rows [.., sq, 1] with every key masked or None)."""
    global _last_verdict
    if _last_verdict is not None and _last_verdict.matches(mask):
        return _last_verdict.is_causal, _last_verdict.dead_rows
    sq, sk = mask.shape[-2], mask.shape[-1]
    is_causal = sq == sk and bool(torch.equal(
        mask, causal_mask(sq, sk, mask.device).expand_as(mask)))
    dead_rows = None
    if not is_causal:
        dead = mask.all(dim=-1, keepdim=True)
        dead_rows = dead if bool(dead.any()) else None
    _last_verdict = _MaskVerdict(mask, is_causal, dead_rows)
    return is_causal, dead_rows


# ---------------------------------------------------------------------------------- the op

def sdpa_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                   mask: Optional[torch.Tensor] = None, causal: bool = False,
                   scale: Optional[float] = None, dropout_p: float = 0.0) -> torch.Tensor:
    """Attention of ``[s, b, heads, dim]`` tensors through SDPA; returns ``[sq, b, np * hv]``.

    ``mask`` (True = masked) takes precedence over ``causal``, as in upstream's softmax; with
    neither, every key is attended. ``scale`` defaults to ``1/sqrt(hn)``. Dropout draws from the
    device's default generator: run it inside the RNG tracker's ``fork()`` like upstream.
    """
    sq, b, heads, _ = query.shape
    sk, groups = key.shape[0], key.shape[2]
    if heads % groups:
        raise ValueError(f"{heads} query heads are not a multiple of {groups} key/value groups")
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
    k = key.permute(1, 2, 0, 3)
    v = value.permute(1, 2, 0, 3)
    attn_mask, is_causal, dead_rows = None, False, None
    if mask is not None:
        is_causal, dead_rows = analyse_mask(mask)
        if not is_causal:
            attn_mask = ~mask
            if dead_rows is not None:  # let SDPA attend there; the rows are replaced below
                attn_mask = attn_mask | dead_rows
    elif causal and sq > 1:
        if sq != sk:
            raise ValueError(f"a causal mask needs sq == sk (got {sq} and {sk})")
        is_causal = True
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=groups != heads)
    if dead_rows is not None:
        mean = v.mean(dim=-2, keepdim=True)
        if groups != heads:
            mean = mean.repeat_interleave(heads // groups, dim=1)
        out = torch.where(dead_rows, mean.to(out.dtype), out)
    return out.permute(2, 0, 1, 3).reshape(sq, b, heads * value.shape[-1])


# ---------------------------------------------------------------------------------- reference

def reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                        mask: Optional[torch.Tensor] = None, causal: bool = False,
                        scale: Optional[float] = None, dropout_p: float = 0.0,
                        softmax_in_fp32: bool = True, generator=None) -> torch.Tensor:
    """Upstream's unfused local attention math, same arguments as :func:`sdpa_attention`."""
    sq, b, heads, _ = query.shape
    sk, groups = key.shape[0], key.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if groups != heads:
        key = key.repeat_interleave(heads // groups, dim=2)
        value = value.repeat_interleave(heads // groups, dim=2)
    q = query.permute(1, 2, 0, 3)
    k = key.permute(1, 2, 0, 3)
    v = value.permute(1, 2, 0, 3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [b, np, sq, sk]
    if mask is None and causal and sq > 1:
        mask = causal_mask(sq, sk, scores.device)
    if softmax_in_fp32:
        scores = scores.float()
    if mask is not None:
        scores = scores.masked_fill(mask, UPSTREAM_MASK_VALUE)
    probs = torch.softmax(scores, dim=-1).to(query.dtype)
    if dropout_p:
        keep = torch.rand(probs.shape, generator=generator, device=probs.device) >= dropout_p
        probs = probs * keep / (1.0 - dropout_p)
    out = torch.matmul(probs, v)  # [b, np, sq, hv]
    return out.permute(2, 0, 1, 3).reshape(sq, b, heads * value.shape[-1])
