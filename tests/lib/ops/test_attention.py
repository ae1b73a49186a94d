"""ops.attention: SDPA core attention against upstream's unfused math (forward and backward)."""

import math

import pytest
import torch

from megatron_musa_patch.lib.ops import attention as att

# fp32: the flash kernel reorders the sums; bf16: SDPA keeps fp32 statistics where the
# reference rounds the scores and probabilities to bf16
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


GPU = pytest.mark.skipif(not torch.cuda.is_available(),
                         reason="no CUDA GPU here; the case runs where one is available")


def _inputs(sq, sk, b, heads, groups, hn, hv, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sq, b, heads, hn, generator=g).to(device, dtype).requires_grad_()
    k = torch.randn(sk, b, groups, hn, generator=g).to(device, dtype).requires_grad_()
    v = torch.randn(sk, b, groups, hv, generator=g).to(device, dtype).requires_grad_()
    return q, k, v


def _padding_mask(b, s, lengths):
    """Upstream-style [b, 1, s, s] mask (True = masked): causal, and keys past each length."""
    mask = att.causal_mask(s, s).expand(b, 1, s, s).clone()
    for i, n in enumerate(lengths):
        mask[i, :, :, n:] = True
    return mask


def _compare(dtype, mask=None, causal=False, sq=13, sk=13, b=2, heads=4, groups=4, hn=16, hv=16,
             scale=None, device="cpu"):
    q, k, v = _inputs(sq, sk, b, heads, groups, hn, hv, dtype, device=device)
    grad = torch.randn(sq, b, heads * hv, generator=torch.Generator().manual_seed(1)).to(
        device, dtype)
    outs, grads = [], []
    for fn in (att.sdpa_attention, att.reference_attention):
        for t in (q, k, v):
            t.grad = None
        out = fn(q, k, v, mask=mask, causal=causal, scale=scale)
        out.backward(grad)
        outs.append(out.detach().float())
        grads.append([t.grad.float() for t in (q, k, v)])
    assert outs[0].shape == (sq, b, heads * hv)
    torch.testing.assert_close(outs[0], outs[1], **TOL[dtype])
    for mine, ref, name in zip(grads[0], grads[1], "qkv"):
        torch.testing.assert_close(mine, ref, **TOL[dtype], msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [4, 2, 1])
def test_causal_gqa(dtype, groups):
    _compare(dtype, causal=True, groups=groups)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_mask_tensor_batch_one(dtype):
    # pretrain_gpt passes the causal mask as a [b, 1, s, s] tensor: the fast is_causal path
    mask = att.causal_mask(11, 11).expand(1, 1, 11, 11)
    assert att.analyse_mask(mask) == (True, None)
    _compare(dtype, mask=mask, sq=11, sk=11, b=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padding_mask_with_fully_masked_rows(dtype):
    # a length-0 sample masks every key of its rows: upstream attends uniformly there (-10000
    # fill), SDPA alone would return zeros
    mask = _padding_mask(3, 13, [13, 5, 0])
    is_causal, dead = att.analyse_mask(mask)
    assert not is_causal and dead is not None and bool(dead[2].all())
    _compare(dtype, mask=mask, b=3, groups=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_arbitrary_mask_no_causal_cross_lengths(dtype):
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(2, 1, 9, 21, generator=g) < 0.3
    _compare(dtype, mask=mask, sq=9, sk=21, groups=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_mask_and_mla_head_dims_and_scale(dtype):
    # MLA: query/key head dim 24, value head dim 16; an explicit softmax scale
    _compare(dtype, sq=7, sk=7, hn=24, hv=16, scale=0.05)
    _compare(dtype, causal=True, sq=7, sk=7, hn=24, hv=16, scale=1 / math.sqrt(24) / 3)


@GPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_causal_padding_and_gqa(dtype):
    _compare(dtype, causal=True, groups=2, hn=64, hv=64, device="cuda")
    mask = _padding_mask(3, 13, [13, 5, 0]).cuda()
    _compare(dtype, mask=mask, b=3, groups=1, hn=64, hv=64, device="cuda")


def test_decode_step_sq_one_needs_no_mask():
    _compare(torch.float32, causal=True, sq=1, sk=9)


def test_mask_verdict_is_cached_and_invalidated_by_in_place_change():
    mask = att.causal_mask(6, 6).expand(2, 1, 6, 6).clone()
    assert att.analyse_mask(mask)[0] is True
    mask[0, 0, 5, 0] = True  # in place: the cached verdict must not be reused
    assert att.analyse_mask(mask)[0] is False


def test_dropout_statistics_and_gradients_finite():
    # SDPA's dropout pattern differs from nn.Dropout's: compare statistics, not values
    q, k, v = _inputs(64, 64, 2, 4, 2, 16, 16, torch.float32)
    torch.manual_seed(0)
    dropped = att.sdpa_attention(q, k, v, causal=True, dropout_p=0.3)
    clean = att.sdpa_attention(q, k, v, causal=True)
    assert torch.isfinite(dropped).all()
    assert not torch.allclose(dropped, clean)
    # inverted dropout keeps the expectation: the mean over many rows stays close
    assert abs(dropped.mean().item() - clean.mean().item()) < 0.05
    dropped.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    # the same generator state gives the same pattern (the RNG tracker's fork relies on it)
    torch.manual_seed(0)
    again = att.sdpa_attention(q, k, v, causal=True, dropout_p=0.3)
    torch.testing.assert_close(again, dropped, atol=0, rtol=0)


def test_group_mismatch_is_an_error():
    q, k, v = _inputs(4, 4, 1, 3, 2, 8, 8, torch.float32)
    with pytest.raises(ValueError, match="multiple"):
        att.sdpa_attention(q, k, v)


def _fake_module(softmax_scale, coeff=None, window=None, causal=True):
    """What features.flash_attention reads from an upstream DotProductAttention."""
    import types

    from megatron.core.transformer.enums import AttnMaskType

    return types.SimpleNamespace(
        softmax_scale=softmax_scale, training=False, attention_dropout=torch.nn.Dropout(0.0),
        attn_mask_type=AttnMaskType.causal if causal else AttnMaskType.padding,
        scale_mask_softmax=types.SimpleNamespace(scale=coeff, window_size=window),
        config=types.SimpleNamespace(sequence_parallel=False))


def test_feature_glue_layer_scaling_and_sliding_window():
    from megatron_musa_patch.features.fused_ops.flash_attention import run_core_attention

    q, k, v = _inputs(12, 12, 2, 4, 2, 16, 16, torch.float32)
    scale = 1 / math.sqrt(16)
    # apply_query_key_layer_scaling: upstream divides the QK^T scale by the layer number (3)
    # and multiplies the scores by it inside the softmax: the net scale is unchanged
    out = run_core_attention(_fake_module(scale / 3, coeff=3), q, k, v, None)
    torch.testing.assert_close(out, att.reference_attention(q, k, v, causal=True, scale=scale),
                               **TOL[torch.float32])
    # sliding window (4 back, 0 ahead): upstream builds the window mask and ignores the given one
    window = torch.ones(12, 12, dtype=torch.bool).triu(-4).tril(0).logical_not()
    given = torch.zeros(2, 1, 12, 12, dtype=torch.bool)
    out = run_core_attention(_fake_module(scale, window=(4, 0)), q, k, v, given)
    torch.testing.assert_close(out, att.reference_attention(q, k, v, mask=window, scale=scale),
                               **TOL[torch.float32])
    # padding type without a mask attends everywhere
    out = run_core_attention(_fake_module(scale, causal=False), q, k, v, None)
    torch.testing.assert_close(out, att.reference_attention(q, k, v, scale=scale),
                               **TOL[torch.float32])


def test_sdpa_preferred_by_measurement():
    # CPU: 16-bit short sequences keep upstream's unfused path (faster there); fp32 always SDPA
    assert att.sdpa_preferred("cpu", torch.float32, 64, 64)
    assert not att.sdpa_preferred("cpu", torch.bfloat16, 512, 512)
    assert att.sdpa_preferred("cpu", torch.bfloat16, 1024, 1024)
    assert att.sdpa_preferred("cuda", torch.bfloat16, 64, 64)
    assert att.sdpa_preferred("musa", torch.float16, 64, 64)
