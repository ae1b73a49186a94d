"""The csrc kernels on a device, forward and backward, against torch references in fp32.

Runs where a CUDA or MUSA device is visible (the extension is built on first use, see
megatron_musa_patch/lib/ops/kernels/); everywhere else the kernel cases skip with the reason
(the check of the references against megatron-core still runs, on the CPU). On a device, a
kernel build failure fails the tests (it is not a skip).

Tolerances: the kernels do their math in fp32 and round once; the references compute in fp32
and round once, so outputs differ by about one unit in the last place of the dtype.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from megatron_musa_patch.device.select import builtin_select
from megatron_musa_patch.lib.ops import kernels


def _device_type():
    """The accelerator the layer's auto choice finds, or None on a CPU-only machine."""
    found = builtin_select("auto")
    return None if found == "cpu" else found


DEVICE = _device_type()
HOST = DEVICE or "cpu"  # where the reference self-check runs without a device

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}
# sums over many rows (dweight, dbias) in fp32, then one rounding
SUM_TOL = {
    torch.float32: dict(atol=2e-4, rtol=1e-4),
    torch.bfloat16: dict(atol=5e-2, rtol=1.6e-2),
    torch.float16: dict(atol=1e-2, rtol=2e-3),
}


@pytest.fixture(scope="module")
def k():
    if DEVICE is None:
        pytest.skip("needs a CUDA or MUSA device")
    if not kernels.available("rms_norm_fwd", DEVICE):
        pytest.fail(f"the csrc kernels did not load on {DEVICE}: {kernels.status(DEVICE)}")
    return {op: kernels.get(op, DEVICE) for op in kernels.OPS}


def close(actual, expected, tol):
    torch.testing.assert_close(actual.float(), expected.float(), **tol)


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(HOST).to(dtype)


def leaf(t):
    return t.detach().float().requires_grad_(True)


# ---- norms ---------------------------------------------------------------------------------------

NORM_SHAPES = [(1, 1000), (37, 4097), (4, 8, 1024), (256, 8192), (3, 20480), (2, 7)]
WEIGHT_KINDS = ["same", "fp32"]


def _weight(hidden, dtype, kind, seed):
    w = 1.0 + 0.1 * randn(hidden, seed=seed)
    return w.to(dtype if kind == "same" else torch.float32)


@pytest.mark.parametrize("shape", NORM_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("wkind", WEIGHT_KINDS)
def test_rms_norm(k, shape, dtype, wkind):
    if dtype == torch.float32 and wkind == "fp32":
        pytest.skip("same as wkind=same for fp32 inputs")
    hidden, eps = shape[-1], 1e-5
    x = randn(*shape, dtype=dtype, seed=1)
    w = _weight(hidden, dtype, wkind, seed=2)
    dy = randn(*shape, dtype=dtype, seed=3)

    y, rstd = k["rms_norm_fwd"](x, w, eps)
    xf, wf = leaf(x), leaf(w)
    ref_rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    ref = xf * ref_rstd * wf
    assert y.dtype == dtype and y.shape == x.shape
    assert rstd.dtype == torch.float32 and rstd.shape == x.shape[:-1]
    close(y, ref.to(dtype), TOL[dtype])
    close(rstd, ref_rstd.squeeze(-1), dict(atol=1e-5, rtol=1e-5))

    ref.backward(dy.float())
    dx, dw = k["rms_norm_bwd"](dy, x, w, rstd)
    assert dx.dtype == dtype and dw.dtype == w.dtype and dw.shape == w.shape
    close(dx, xf.grad.to(dtype), TOL[dtype])
    close(dw, wf.grad.to(w.dtype), SUM_TOL[dtype])


@pytest.mark.parametrize("shape", NORM_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("wkind", WEIGHT_KINDS)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
def test_layer_norm(k, shape, dtype, wkind, with_bias):
    if dtype == torch.float32 and wkind == "fp32":
        pytest.skip("same as wkind=same for fp32 inputs")
    hidden, eps = shape[-1], 1e-5
    x = randn(*shape, dtype=dtype, seed=4, scale=2.0) + 0.5  # non-zero mean
    w = _weight(hidden, dtype, wkind, seed=5)
    b = (0.1 * randn(hidden, seed=6)).to(w.dtype) if with_bias else None
    dy = randn(*shape, dtype=dtype, seed=7)

    y, mean, rstd = k["layer_norm_fwd"](x, w, b, eps)
    xf, wf = leaf(x), leaf(w)
    bf = leaf(b) if with_bias else None
    ref = F.layer_norm(xf, (hidden,), wf, bf, eps)
    close(y, ref.to(dtype), TOL[dtype])
    close(mean, xf.mean(-1), dict(atol=1e-5, rtol=1e-5))
    close(rstd, torch.rsqrt(xf.var(-1, unbiased=False) + eps), dict(atol=1e-5, rtol=1e-4))

    ref.backward(dy.float())
    dx, dw, db = k["layer_norm_bwd"](dy, x, w, mean, rstd)
    close(dx, xf.grad.to(dtype), TOL[dtype])
    close(dw, wf.grad.to(w.dtype), SUM_TOL[dtype])
    expected_db = dy.float().reshape(-1, hidden).sum(0)
    close(db, expected_db.to(w.dtype), SUM_TOL[dtype])


# ---- SwiGLU ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 2000), (37, 2 * 4097), (4, 8, 2 * 2048), (3, 14)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu(k, shape, dtype):
    x = randn(*shape, dtype=dtype, seed=8, scale=2.0)
    f = shape[-1] // 2
    dy = randn(*shape[:-1], f, dtype=dtype, seed=9)
    xf = leaf(x)
    a, b = torch.chunk(xf, 2, -1)  # megatron-core: the first half is gated
    ref = F.silu(a) * b
    y = k["swiglu_fwd"](x)
    assert y.shape == (*shape[:-1], f) and y.dtype == dtype
    close(y, ref.to(dtype), TOL[dtype])
    ref.backward(dy.float())
    dx = k["swiglu_bwd"](dy, x)
    assert dx.shape == x.shape
    close(dx, xf.grad.to(dtype), TOL[dtype])


# ---- RoPE --------------------------------------------------------------------------------------------


def rotate_half(x, interleaved):
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def ref_rope(t, cos, sin, interleaved):
    """megatron-core's bshd formula in fp32: rotate the first rot channels, pass the rest."""
    rot = cos.shape[-1]
    head, tail = t[..., :rot], t[..., rot:]
    return torch.cat((head * cos + rotate_half(head, interleaved) * sin, tail), dim=-1)


def megatron_freqs(s, rot, interleaved, offset=0):
    """Angles as megatron's RotaryEmbedding lays them out: [s, 1, 1, rot], fp32."""
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    pos = torch.arange(offset, offset + s, dtype=torch.float32)
    f = torch.outer(pos, inv)
    if interleaved:
        emb = torch.stack((f, f), dim=-1).reshape(s, rot)
    else:
        emb = torch.cat((f, f), dim=-1)
    return emb[:, None, None, :].to(HOST)


# the last two take the kernel that shares cos/sin over a position's rows (>= 32 positions,
# >= 8 rows each); the others the per-row kernel
ROPE_SHAPES = [(7, 2, 3, 64, 64), (5, 1, 4, 128, 64), (1, 1, 1, 32, 32), (33, 3, 2, 80, 48),
               (64, 2, 4, 128, 128), (40, 4, 8, 128, 64)]


@pytest.mark.parametrize("sbhdr", ROPE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_rope_angles(k, sbhdr, dtype, interleaved):
    s, b, h, d, rot = sbhdr
    t = randn(s, b, h, d, dtype=dtype, seed=10)
    dout = randn(s, b, h, d, dtype=dtype, seed=11)
    freqs = megatron_freqs(s, rot, interleaved, offset=4000)  # large angles too
    tf = leaf(t)
    ref = ref_rope(tf, torch.cos(freqs), torch.sin(freqs), interleaved)
    out = k["rope_fwd"](t, freqs, interleaved)
    assert out.shape == t.shape and out.dtype == dtype
    close(out, ref.to(dtype), TOL[dtype])
    assert torch.equal(out[..., rot:], t[..., rot:]), "pass-through channels must be copied exactly"
    ref.backward(dout.float())
    dt = k["rope_bwd"](dout, freqs, interleaved)
    close(dt, tf.grad.to(dtype), TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_angles_per_batch(k, dtype):
    """freqs [s, b, 1, rot] (angles differing across the batch) broadcast like torch does."""
    s, b, h, d, rot = 40, 3, 8, 64, 64
    t = randn(s, b, h, d, dtype=dtype, seed=19)
    freqs = randn(s, b, 1, rot, seed=20, scale=30.0)
    tf = leaf(t)
    ref = ref_rope(tf, torch.cos(freqs), torch.sin(freqs), False)
    close(k["rope_fwd"](t, freqs, False), ref.to(dtype), TOL[dtype])
    dout = randn(s, b, h, d, dtype=dtype, seed=21)
    ref.backward(dout.float())
    close(k["rope_bwd"](dout, freqs, False), tf.grad.to(dtype), TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("s", [9, 48], ids=["s9", "s48"])
def test_rope_cos_sin_tables_and_thd(k, dtype, interleaved, s):
    b, h, d, rot = 2, 8, 64, 32
    t = randn(s, b, h, d, dtype=dtype, seed=12)
    dout = randn(s, b, h, d, dtype=dtype, seed=13)
    freqs = megatron_freqs(s, rot, interleaved)
    cos, sin = (torch.cos(freqs) * 0.9).to(dtype), (torch.sin(freqs) * 0.9).to(dtype)  # mscale
    tf = leaf(t)
    ref = ref_rope(tf, cos.float(), sin.float(), interleaved)
    close(k["rope_fwd"](t, cos, sin, interleaved), ref.to(dtype), TOL[dtype])
    ref.backward(dout.float())
    close(k["rope_bwd"](dout, cos, sin, interleaved), tf.grad.to(dtype), TOL[dtype])
    # thd: [tokens, h, d] with [tokens, 1, r] angles equals the bshd call with b = 1
    t3 = t[:, 0]
    f3 = freqs[:, 0]
    out3 = k["rope_fwd"](t3, f3, interleaved)
    assert out3.shape == t3.shape
    torch.testing.assert_close(out3, k["rope_fwd"](t3.unsqueeze(1), freqs, interleaved).squeeze(1),
                               atol=0, rtol=0)


# ---- MoE permute / unpermute ----------------------------------------------------------------------


def routing(num_tokens, num_experts, topk, seed, dropped=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    scores = torch.rand(num_tokens, num_experts, generator=g)
    top = scores.topk(topk, dim=-1).indices
    routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool)
    routing_map.scatter_(1, top, True)
    if dropped:
        routing_map[:dropped] = False  # tokens no expert takes
    probs = torch.softmax(scores, -1) * routing_map
    return routing_map.to(HOST), probs.to(HOST)


def ref_permute(tokens, routing_map, probs):
    num_tokens, num_experts = routing_map.shape
    mask_t = routing_map.T.contiguous()
    token_ids = torch.arange(num_tokens, device=tokens.device).unsqueeze(0).expand(num_experts, -1)
    sorted_indices = token_ids.masked_select(mask_t)
    return tokens.index_select(0, sorted_indices), probs.T.contiguous().masked_select(mask_t), sorted_indices


def ref_unpermute(permuted, sorted_indices, num_tokens, row_probs):
    rows = permuted.float() * (row_probs.float().unsqueeze(-1) if row_probs is not None else 1.0)
    out = torch.zeros(num_tokens, permuted.shape[1], device=permuted.device)
    return out.index_add_(0, sorted_indices, rows)


@pytest.mark.parametrize("nhe", [(1, 1000, 4), (37, 4097, 8), (300, 256, 8), (64, 2048, 16)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_permute_unpermute(k, nhe, dtype):
    num_tokens, hidden, num_experts = nhe
    routing_map, probs = routing(num_tokens, num_experts, topk=2, seed=14,
                                 dropped=min(3, num_tokens - 1))
    tokens = randn(num_tokens, hidden, dtype=dtype, seed=15)
    ref_out, ref_probs, ref_idx = ref_permute(tokens, routing_map, probs)

    out, pprobs, idx = k["permute"](tokens, routing_map, probs)
    assert idx.dtype == torch.int64
    assert torch.equal(idx, ref_idx)
    assert torch.equal(out, ref_out)
    assert torch.equal(pprobs, ref_probs)
    out2, none_probs, idx2 = k["permute"](tokens, routing_map, None, int(routing_map.sum()))
    assert none_probs is None and torch.equal(out2, ref_out) and torch.equal(idx2, ref_idx)
    assert torch.equal(k["permute"](tokens, ref_idx), ref_out)  # (tokens, token_indices) form

    expected = ref_unpermute(out, idx, num_tokens, pprobs).to(dtype)
    got = k["unpermute"](out, idx, (num_tokens, hidden), pprobs)
    assert got.dtype == dtype and got.shape == (num_tokens, hidden)
    close(got, expected, TOL[dtype])
    # upstream's form: 2-D probs with the routing map
    close(k["unpermute"](out, idx, torch.Size([num_tokens, hidden]), probs, routing_map), expected,
          TOL[dtype])
    # (permuted, token_indices, row_probs, num_tokens) form, and no probs
    close(k["unpermute"](out, idx, pprobs, num_tokens), expected, TOL[dtype])
    plain = k["unpermute"](out, idx, (num_tokens, hidden))
    close(plain, ref_unpermute(out, idx, num_tokens, None).to(dtype), TOL[dtype])
    dropped = ~routing_map.any(-1)
    assert torch.count_nonzero(plain[dropped]) == 0, "tokens without experts must come back as zeros"
    # deterministic: fixed summation order
    assert torch.equal(got, k["unpermute"](out, idx, (num_tokens, hidden), pprobs))


def test_upstream_matches_the_references():
    """The local references above agree with megatron-core's own functions (where installed;
    runs on the CPU when there is no device)."""
    rope_utils = pytest.importorskip("megatron.core.models.common.embeddings.rope_utils")
    moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")
    for interleaved in (False, True):
        t = randn(5, 2, 3, 64, seed=16)
        freqs = megatron_freqs(5, 32, interleaved)
        upstream = rope_utils._apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=interleaved)
        torch.testing.assert_close(upstream, ref_rope(t, torch.cos(freqs), torch.sin(freqs), interleaved))
    routing_map, probs = routing(20, 6, 2, seed=17, dropped=2)
    tokens = randn(20, 16, seed=18)
    # 0.19 requires num_out_tokens and returns two more values (pad offsets, tokens per expert)
    up_out, up_probs, up_idx = moe_utils.permute(tokens, routing_map, probs=probs,
                                                 num_out_tokens=int(routing_map.sum()))[:3]
    out, pprobs, idx = ref_permute(tokens, routing_map, probs)
    assert torch.equal(up_out, out) and torch.equal(up_probs, pprobs) and torch.equal(up_idx, idx)
    up = moe_utils.unpermute(up_out, up_idx, tokens.shape, probs=probs, routing_map=routing_map)
    torch.testing.assert_close(up, ref_unpermute(out, idx, 20, pprobs))


def test_bad_inputs_fail_clearly(k):
    x = torch.randn(4, 8)
    w = torch.ones(8)
    with pytest.raises(RuntimeError, match=f"must be a {DEVICE} tensor"):
        k["rms_norm_fwd"](x, w, 1e-5)
    xd = x.to(DEVICE)
    with pytest.raises(RuntimeError, match="weight must have shape"):
        k["rms_norm_fwd"](xd, torch.ones(7, device=DEVICE), 1e-5)
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        k["swiglu_fwd"](xd.double())
    with pytest.raises(RuntimeError, match="must be even"):
        k["swiglu_fwd"](torch.randn(4, 7, device=DEVICE))
    with pytest.raises(RuntimeError, match="rot_dim"):
        k["rope_fwd"](torch.randn(2, 1, 1, 8, device=DEVICE), torch.randn(2, 1, 1, 10, device=DEVICE), False)
    assert math.isfinite(float(k["rms_norm_fwd"](xd, w.to(DEVICE), 1e-5)[0].sum()))
