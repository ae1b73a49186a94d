"""The calling convention of the compiled kernels: the one description of their ABI.

The torch-side ops (``ops/norm.py``, ``ops/swiglu.py``, ...) call ``kernels.get(name)`` with
these signatures; ``fronts.py`` adapts them to ``csrc/binding.cpp``.

Ops (all tensors on the device and contiguous — the wrappers call ``.contiguous()`` —, the last
dimension is the hidden one, dtypes float32 / float16 / bfloat16, math in fp32):

``rms_norm_fwd(x, weight, eps) -> (y, rstd)``
    ``y = x * rstd * weight``, ``rstd = 1 / sqrt(mean(x**2, -1) + eps)``; ``y`` like ``x``,
    ``rstd`` float32 of shape ``x.shape[:-1]``. ``weight`` is ``[hidden]``, dtype of ``x`` or
    float32.
``rms_norm_bwd(dy, x, weight, rstd) -> (dx, dweight)``
    ``dweight`` in ``weight``'s dtype, summed over all rows in fp32.
``layer_norm_fwd(x, weight, bias, eps) -> (y, mean, rstd)``
    ``y = (x - mean) * rstd * weight + bias`` (``bias`` may be None); ``mean``/``rstd`` float32
    of shape ``x.shape[:-1]`` (biased variance, like ``torch.nn.functional.layer_norm``).
``layer_norm_bwd(dy, x, weight, mean, rstd) -> (dx, dweight, dbias)``
``swiglu_fwd(x) -> y``
    ``x = [..., 2f]``, ``y = silu(x[..., :f]) * x[..., f:]`` — megatron-core's convention
    (``fusions/fused_bias_swiglu.swiglu``: ``torch.chunk(y, 2, -1)``, the first half is gated).
``swiglu_bwd(dy, x) -> dx``
    ``dy = [..., f]``, ``dx = [..., 2f]`` (as ``fused_bias_swiglu.swiglu_back``).
``rope_fwd(t, freqs, interleaved) -> out``
    megatron-core's ``_apply_rotary_pos_emb_bshd`` (``mscale = 1``, no MLA reordering):
    ``t = [s, b, h, d]`` (4-D), ``freqs`` 4-D broadcasting over ``t`` in the first three dims
    (megatron passes ``[s, 1, 1, rot_dim]``); ``rot_dim = freqs.shape[-1]`` (even, ``<= d``)
    channels are rotated, the rest pass through. cos/sin are taken in fp32 from the angles
    (freqs are cast to float32).
``rope_bwd(dout, freqs, interleaved) -> dt``
    the gradient of ``rope_fwd`` with respect to ``t``.
``rope_fwd(t, cos, sin, interleaved)`` / ``rope_bwd(dout, cos, sin, interleaved)``
    the same with precomputed tables instead of angles: ``cos``/``sin`` of one shape
    broadcasting like ``freqs`` (any float dtype, e.g. already cast to ``t``'s dtype and scaled
    by mscale, as upstream does). For both forms a 3-D ``t = [tokens, h, d]`` (thd) is taken as
    ``[tokens, 1, h, d]`` with 2-D/3-D ``freqs``/``cos``/``sin`` as ``[tokens, 1, 1, r]``.
``permute(tokens, routing_map, probs=None, num_out_tokens=None) -> (permuted, permuted_probs, sorted_indices)``
    ``megatron.core.transformer.moe.moe_utils.permute`` without ``drop_and_pad``:
    ``tokens = [num_tokens, hidden]``, ``routing_map = [num_tokens, num_experts]`` (bool or
    0/1), ``sorted_indices`` int64, expert-major with token ids ascending;
    ``permuted = tokens[sorted_indices]``; ``permuted_probs`` (probs' dtype) or None.
    ``num_out_tokens``, when given, must equal ``routing_map.sum()``: it saves the host sync
    that finding the output size needs.
``permute(tokens, token_indices) -> tokens[token_indices]``
    with a 1-D int64 index instead of a routing map: the row gather alone.
``unpermute(permuted, sorted_indices, restore_shape, probs=None, routing_map=None) -> out``
    ``moe_utils.unpermute`` without ``drop_and_pad``: ``out = zeros(restore_shape)``,
    ``out[sorted_indices[p]] += permuted[p] * probs_p``, returned in ``permuted``'s dtype.
    ``probs`` is either the permuted probs ``[num_permuted]`` (what ``permute`` returns) or, as
    upstream, ``[num_tokens, num_experts]`` together with ``routing_map``. Each token's rows are
    summed in fp32 in a fixed order (deterministic, no float atomics), then rounded once.
    Indices outside ``[0, num_tokens)`` are ignored.
``unpermute(permuted, token_indices, row_probs, num_tokens) -> out``
    the same, with ``row_probs`` ``[num_permuted]`` or None and ``restore_shape`` given as
    ``num_tokens`` (the hidden size is ``permuted``'s).

The kernels have no autograd; the torch-side ops wrap them in ``torch.autograd.Function``.
"""

OPS = (
    "rms_norm_fwd", "rms_norm_bwd", "layer_norm_fwd", "layer_norm_bwd",
    "swiglu_fwd", "swiglu_bwd", "rope_fwd", "rope_bwd", "permute", "unpermute",
)
DEVICE_TYPES = ("cuda", "musa")
