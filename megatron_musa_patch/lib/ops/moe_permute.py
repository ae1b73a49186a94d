"""MoE token permute / unpermute for ``--moe-permute-fusion`` without TransformerEngine.

Results equal megatron-core's non-fused ``moe_utils.permute`` / ``unpermute`` /
``sort_chunks_by_idxs`` (same rows in the same order, probabilities applied in the same dtype,
tokens summed in the promoted dtype); the TE-style entry points at the bottom take the arguments
of TE's ``fused_*`` functions, so megatron-core's fused call sites use them unchanged.

The permutation map handed from ``permute`` to ``unpermute`` (upstream's ``sorted_indices``, TE's
``row_id_map``) is here one int64 vector of *flat* indices into the expert-major grid
``[num_experts, num_tokens]``: ``flat // num_tokens`` is a row's expert, ``flat % num_tokens``
its token. One vector thus carries both the gather order and where each row's routing
probability sits in ``probs.T``, which TE-style ``fused_unpermute(merging_probs=probs)`` needs
without the routing map.

On GPUs the row gather and the probability-weighted row reduction use the compiled kernels when
``ops.kernels`` reports them (``dispatch.kernel``), with this calling convention:

* ``permute(tokens [N, H], token_indices int64 [P]) -> tokens[token_indices]``
* ``unpermute(permuted [P, H], token_indices int64 [P], row_probs fp32 [P] or None, num_tokens)
  -> [N, H]``: ``out[t] = sum over rows p of token t of permuted[p] * row_probs[p]``, summed in
  fp32, returned in ``permuted``'s dtype.

Elsewhere (CPU) the torch ops below run: the same math as upstream's, with the index
bookkeeping done once (``nonzero`` on the transposed map) and backward as one ``index_add_``.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from .dispatch import kernel


# ---------------------------------------------------------------------------------- index maps

def flat_indices(routing_map: torch.Tensor, num_out_tokens=None,
                 drop_and_pad: bool = False) -> torch.Tensor:
    """Expert-major flat indices of the routed (token, expert) pairs, in upstream's order.

    ``drop_and_pad``: every expert keeps exactly ``num_out_tokens // num_experts`` rows (its
    first routed tokens, then unrouted ones), like upstream's capacity path; no host sync.
    """
    num_tokens, num_experts = routing_map.shape
    if drop_and_pad and num_out_tokens is not None:
        capacity = int(num_out_tokens) // num_experts
        order = routing_map.to(torch.int8).T.argsort(dim=-1, descending=True, stable=True)
        token = order[:, :capacity]
        expert = torch.arange(num_experts, device=routing_map.device).unsqueeze(-1)
        return (expert * num_tokens + token).reshape(-1)
    return routing_map.bool().T.reshape(-1).nonzero().squeeze(1)


def _gather_rows(tokens: torch.Tensor, token_indices: torch.Tensor) -> torch.Tensor:
    fast = kernel("permute", tokens.device.type)
    if fast is not None and tokens.is_contiguous():
        return fast(tokens, token_indices)
    return tokens.index_select(0, token_indices)


def _sum_rows(permuted: torch.Tensor, token_indices: torch.Tensor, row_probs, num_tokens: int,
              dtype) -> torch.Tensor:
    """out[t] = sum of permuted[p] (* row_probs[p]) over rows p of token t, in ``dtype``."""
    fast = kernel("unpermute", permuted.device.type)
    if fast is not None and permuted.is_contiguous() and dtype == permuted.dtype and (
            row_probs is None or row_probs.dtype == torch.float32):
        return fast(permuted, token_indices, row_probs, num_tokens)
    rows = permuted if row_probs is None else permuted * row_probs.unsqueeze(-1)
    out = torch.zeros(num_tokens, permuted.shape[-1], dtype=rows.dtype, device=rows.device)
    return out.index_add_(0, token_indices, rows).to(dtype)


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens, token_indices):
        ctx.save_for_backward(token_indices)
        ctx.num_tokens = tokens.shape[0]
        return _gather_rows(tokens, token_indices)

    @staticmethod
    def backward(ctx, grad):
        (token_indices,) = ctx.saved_tensors
        return _sum_rows(grad.contiguous(), token_indices, None, ctx.num_tokens, grad.dtype), None


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, permuted, token_indices, row_probs, num_tokens, out_dtype):
        ctx.save_for_backward(permuted if row_probs is not None else None, token_indices,
                              row_probs)
        # upstream multiplies in the promoted dtype (fp32 probs promote bf16 tokens)
        ctx.work_dtype = permuted.dtype if row_probs is None else torch.promote_types(
            permuted.dtype, row_probs.dtype)
        ctx.permuted_dtype = permuted.dtype
        return _sum_rows(permuted, token_indices, row_probs, num_tokens, out_dtype)

    @staticmethod
    def backward(ctx, grad):
        permuted, token_indices, row_probs = ctx.saved_tensors
        grad_rows = grad.to(ctx.work_dtype).index_select(0, token_indices)
        grad_probs = None
        if row_probs is not None:
            if ctx.needs_input_grad[2]:
                grad_probs = (grad_rows * permuted.to(ctx.work_dtype)).sum(-1).to(row_probs.dtype)
            grad_rows = grad_rows * row_probs.unsqueeze(-1)
        return grad_rows.to(ctx.permuted_dtype), None, grad_probs, None, None


# ---------------------------------------------------------------------------------- the ops

def permute(tokens: torch.Tensor, routing_map: torch.Tensor, probs: Optional[torch.Tensor] = None,
            num_out_tokens=None, drop_and_pad: bool = False
            ) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """(permuted tokens, permuted probs or None, flat index map) -- see the module doc."""
    flat = flat_indices(routing_map, num_out_tokens, drop_and_pad)
    token_indices = flat % tokens.shape[0]
    permuted = _Permute.apply(tokens, token_indices)
    permuted_probs = None
    if probs is not None:
        permuted_probs = probs.T.contiguous().reshape(-1).index_select(0, flat)
    return permuted, permuted_probs, flat


def unpermute(permuted_tokens: torch.Tensor, flat: torch.Tensor, restore_shape: Sequence[int],
              probs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Sum the rows back onto their tokens, each weighted by its routing probability."""
    num_tokens = restore_shape[0]
    token_indices = flat % num_tokens
    row_probs = None
    if probs is not None:
        row_probs = probs.T.contiguous().reshape(-1).index_select(0, flat)
    return _Unpermute.apply(permuted_tokens, token_indices, row_probs, num_tokens,
                            permuted_tokens.dtype)


def sort_chunks_by_index(inp: torch.Tensor, split_sizes: torch.Tensor, sorted_idxs: torch.Tensor,
                         probs: Optional[torch.Tensor] = None):
    """Reorder contiguous chunks of rows: chunk ``sorted_idxs[i]`` goes ``i``-th."""
    sizes = [int(s) for s in split_sizes.tolist()]
    order = [int(i) for i in sorted_idxs.tolist()]
    starts = [0]
    for size in sizes[:-1]:
        starts.append(starts[-1] + size)
    rows = [torch.arange(starts[i], starts[i] + sizes[i]) for i in order]
    index = (torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)).to(inp.device)
    out = _Permute.apply(inp, index)
    return out, (probs.index_select(0, index) if probs is not None else None)


# ---------------------------------------------------------------------------------- TE-style

def fused_permute(inp, routing_map, num_out_tokens=-1, **_):
    permuted, _, flat = permute(inp, routing_map, num_out_tokens=_out(num_out_tokens))
    return permuted, flat


def fused_permute_with_probs(inp, probs, routing_map, num_out_tokens=-1, **_):
    return permute(inp, routing_map, probs=probs, num_out_tokens=_out(num_out_tokens))


def fused_unpermute(inp, row_id_map, merging_probs=None, restore_shape=None, **_):
    return unpermute(inp, row_id_map, restore_shape, probs=merging_probs)


def fused_sort_chunks_by_index(inp, split_sizes, sorted_idxs):
    return sort_chunks_by_index(inp, split_sizes, sorted_idxs)[0]


def fused_sort_chunks_by_index_with_probs(inp, probs, split_sizes, sorted_idxs):
    return sort_chunks_by_index(inp, split_sizes, sorted_idxs, probs)


def _out(num_out_tokens):
    return None if num_out_tokens is None or int(num_out_tokens) < 0 else num_out_tokens
