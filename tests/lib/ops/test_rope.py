"""ops.rope against megatron-core's own unfused apply_rotary_pos_emb (the semantics to match):
bshd and thd (ragged cu_seqlens, context-parallel slices, exact-offset freqs), rotate-half and
interleaved, partial rotary dim, MLA channel order, mscale; forward and backward; fp32 and bf16
(fp16 where the eager path runs). The eager implementation is bit-identical to upstream in every
dtype; compiled: ops_cases.TOL."""

from functools import partial

import pytest
import torch

from megatron_musa_patch.upstream.binding import has_parameter

from megatron_musa_patch.lib.ops import rope

from tests.lib.ops.cases import DEVICES, assert_close, grads, wave


class _Group:  # what upstream asks of a context-parallel group
    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def _config(interleaved=False, mla=False):
    from types import SimpleNamespace

    return SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=interleaved,
                           multi_latent_attention=mla, mrope_section=None)


def _upstream():
    from megatron.core.models.common.embeddings import rope_utils

    return rope_utils


def _freqs(rows, rot_dim, device):
    inv = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    f = torch.outer(torch.arange(rows, dtype=torch.float32), inv)
    return torch.cat((f, f), -1)[:, None, None, :].to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("impl", ["eager", "compile"])
@pytest.mark.parametrize("case", ["full", "partial", "batch1", "mla-mscale"])
def test_bshd_matches_upstream(device, dtype, interleaved, impl, case):
    if impl == "compile" and device == "cpu" and (
            dtype == torch.float16 or case != "full" or interleaved != (dtype == torch.bfloat16)):
        pytest.skip("compiled path: fp32 rotate-half, bf16 interleaved (compiles cost seconds)")
    s, b, h, d, rot = {"full": (9, 2, 3, 16, 16), "partial": (5, 2, 3, 20, 12),
                       "batch1": (4, 1, 1, 8, 8), "mla-mscale": (6, 2, 2, 24, 24)}[case]
    mla, mscale = case == "mla-mscale", (1.3 if case == "mla-mscale" else 1.0)
    if mla and interleaved:
        pytest.skip("upstream refuses rotary_interleaved with multi-latent attention")
    t = torch.randn(s, b, h, d, generator=torch.Generator().manual_seed(d)).to(device, dtype)
    freqs = _freqs(s, rot, device)
    up = partial(wave, fn=torch.sin)
    out, (dt,) = grads(lambda x: rope.apply_rope_bshd(x, freqs, interleaved, mla, mscale, impl),
                       (t,), up)
    upstream = _upstream().apply_rotary_pos_emb
    # from 0.19 the caller, not the config, asks for MLA's channel order
    order = {"mla_rotary_interleaved": mla} if has_parameter(upstream, "mla_rotary_interleaved") \
        else {}
    ref, (rdt,) = grads(lambda x: upstream(
        x, freqs, _config(interleaved, mla), mscale=mscale, cp_group=_Group(1, 0), **order),
        (t,), up)
    if impl == "eager":
        assert torch.equal(out, ref) and torch.equal(dt, rdt)
    else:
        assert_close(out, ref, dtype)
        assert_close(dt, rdt, dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("cp_size,cp_rank", [(1, 0), (2, 1)])
@pytest.mark.parametrize("exact", [False, True], ids=["max-s-freqs", "per-token-freqs"])
def test_thd_matches_upstream(interleaved, cp_size, cp_rank, exact):
    lengths = [4, 12, 8] if cp_size > 1 else [3, 11, 1, 6]  # ragged; CP needs 2*cp_size | len
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    t = torch.randn(sum(lengths) // cp_size, 3, 16, generator=torch.Generator().manual_seed(3))
    freqs = _freqs(sum(lengths) if exact else max(lengths), 16, "cpu")
    group = _Group(cp_size, cp_rank)
    up = lambda y: torch.sin(torch.arange(y.numel(), dtype=torch.float32)).view_as(y)  # noqa: E731
    out, (dt,) = grads(lambda x: rope.apply_rope_thd(x, cu, freqs, interleaved, False, 1.0,
                                                     cp_size, cp_rank, "eager"), (t,), up)
    ref, (rdt,) = grads(lambda x: _upstream().apply_rotary_pos_emb(
        x, freqs, _config(interleaved), cu_seqlens=cu, cp_group=group), (t,), up)
    assert torch.equal(out, ref) and torch.equal(dt, rdt)


def test_te_slot_signatures():
    t = torch.randn(5, 2, 2, 8)
    freqs = _freqs(5, 8, "cpu")
    torch.testing.assert_close(rope.fused_apply_rotary_pos_emb(t, freqs, interleaved=True),
                               rope.apply_rope_bshd(t, freqs, True))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    packed = torch.randn(5, 2, 8)
    torch.testing.assert_close(rope.fused_apply_rotary_pos_emb_thd(packed, cu, freqs),
                               rope.apply_rope_thd(packed, cu, freqs))
