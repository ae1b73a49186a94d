"""Python fronts of the compiled ops: argument adaptation only (contiguity, the thd view of
RoPE, the alternative call forms of permute/unpermute described in ``abi.py``)."""

from __future__ import annotations


def _c(t):
    return t.contiguous() if t is not None else None


def _rms_norm_fwd(ext):
    def rms_norm_fwd(x, weight, eps):
        y, rstd = ext.rms_norm_fwd(_c(x), _c(weight), float(eps))
        return y, rstd
    return rms_norm_fwd


def _rms_norm_bwd(ext):
    def rms_norm_bwd(dy, x, weight, rstd):
        dx, dw = ext.rms_norm_bwd(_c(dy), _c(x), _c(weight), _c(rstd))
        return dx, dw
    return rms_norm_bwd


def _layer_norm_fwd(ext):
    def layer_norm_fwd(x, weight, bias, eps):
        y, mean, rstd = ext.layer_norm_fwd(_c(x), _c(weight), _c(bias), float(eps))
        return y, mean, rstd
    return layer_norm_fwd


def _layer_norm_bwd(ext):
    def layer_norm_bwd(dy, x, weight, mean, rstd):
        dx, dw, db = ext.layer_norm_bwd(_c(dy), _c(x), _c(weight), _c(mean), _c(rstd))
        return dx, dw, db
    return layer_norm_bwd


def _swiglu_fwd(ext):
    def swiglu_fwd(x):
        return ext.swiglu_fwd(_c(x))
    return swiglu_fwd


def _swiglu_bwd(ext):
    def swiglu_bwd(dy, x):
        return ext.swiglu_bwd(_c(dy), _c(x))
    return swiglu_bwd


def _rope_view(t, tables):
    # thd [t, h, d] -> [t, 1, h, d]; its freqs / cos / sin [t, 1, r] or [t, r] -> [t, 1, 1, r]
    if t.dim() != 3:
        return t, tables, None
    def as4d(x):
        if x.dim() in (2, 3) and x.numel() == x.shape[0] * x.shape[-1]:
            return x.reshape(x.shape[0], 1, 1, x.shape[-1])
        return x.unsqueeze(1) if x.dim() == 3 else x  # [t, h, r] -> [t, 1, h, r]
    return t.unsqueeze(1), [as4d(x) for x in tables], t.shape


def _rope(ext, backward):
    angles = ext.rope_bwd if backward else ext.rope_fwd
    tabled = ext.rope_bwd_cos_sin if backward else ext.rope_fwd_cos_sin

    def rope(t, *args, interleaved=None):
        # (t, freqs, interleaved) or (t, cos, sin, interleaved); see abi.py
        args = list(args)
        if interleaved is None:
            interleaved = args.pop() if args and not hasattr(args[-1], "dim") else False
        if len(args) not in (1, 2):
            raise TypeError("rope: expected (t, freqs, interleaved) or (t, cos, sin, interleaved)")
        t4, tables, shape3 = _rope_view(_c(t), args)
        if len(tables) == 1:
            out = angles(t4, tables[0], bool(interleaved))
        else:
            out = tabled(t4, tables[0], tables[1], bool(interleaved))
        return out.view(shape3) if shape3 is not None else out
    rope.__name__ = "rope_bwd" if backward else "rope_fwd"
    return rope


def _rope_fwd(ext):
    return _rope(ext, backward=False)


def _rope_bwd(ext):
    return _rope(ext, backward=True)


def _permute(ext):
    def permute(tokens, routing_map, probs=None, num_out_tokens=None):
        if routing_map.dim() == 1:  # (tokens, token_indices): the row gather alone
            return ext.gather_rows(_c(tokens), _c(routing_map))
        out, permuted_probs, sorted_indices = ext.permute(
            _c(tokens), routing_map, _c(probs), None if num_out_tokens is None else int(num_out_tokens))
        return out, permuted_probs, sorted_indices
    return permute


def _unpermute(ext):
    def unpermute(permuted, sorted_indices, restore_shape=None, probs=None, routing_map=None):
        if restore_shape is None or hasattr(restore_shape, "dim"):
            # (permuted, token_indices, row_probs or None, num_tokens)
            probs, num_tokens = restore_shape, probs
            if num_tokens is None:
                raise TypeError("unpermute(permuted, token_indices, row_probs, num_tokens): "
                                "num_tokens is missing")
            restore_shape = (int(num_tokens), permuted.shape[-1])
        if probs is not None and probs.dim() == 2:
            if routing_map is None:
                raise ValueError("unpermute: 2-D probs [num_tokens, num_experts] need routing_map "
                                 "(or pass the permuted probs [num_permuted] from permute)")
            probs = probs.T.contiguous().masked_select(routing_map.T.contiguous().bool())
        shape = [int(s) for s in restore_shape]
        return ext.unpermute(_c(permuted), _c(sorted_indices), shape, _c(probs))
    return unpermute


FRONTS = {
    "rms_norm_fwd": _rms_norm_fwd, "rms_norm_bwd": _rms_norm_bwd,
    "layer_norm_fwd": _layer_norm_fwd, "layer_norm_bwd": _layer_norm_bwd,
    "swiglu_fwd": _swiglu_fwd, "swiglu_bwd": _swiglu_bwd,
    "rope_fwd": _rope_fwd, "rope_bwd": _rope_bwd,
    "permute": _permute, "unpermute": _unpermute,
}
