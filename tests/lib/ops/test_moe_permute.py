"""ops.moe_permute against megatron-core's non-fused moe_utils.permute / unpermute /
sort_chunks_by_idxs: same rows, same probabilities, same gradients (bitwise on CPU)."""

import pytest
import torch

from megatron_musa_patch.lib.ops import moe_permute as mp

moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")


def _routing(num_tokens, num_experts, topk, seed=0, empty_expert=None):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=g)
    if empty_expert is not None:
        logits[:, empty_expert] = -1e9  # nobody picks it: an expert with zero tokens
    top = logits.topk(topk, dim=-1)
    routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool)
    routing_map.scatter_(1, top.indices, True)
    probs = torch.zeros(num_tokens, num_experts).scatter(1, top.indices, top.values.softmax(-1))
    return routing_map, probs


def _capacity_routing(num_tokens, num_experts, capacity, seed=0):
    """Drop-and-pad routing: every expert keeps exactly ``capacity`` tokens (its top scores)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(num_tokens, num_experts, generator=g)
    keep = scores.topk(capacity, dim=0).indices
    routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool).scatter_(0, keep, True)
    return routing_map, scores * routing_map


def _leaf(t, dtype=None):
    return t.detach().to(dtype or t.dtype).clone().requires_grad_()


def _run(dtype, routing_map, probs, hidden, drop_and_pad=False, seed=1):
    num_tokens, num_experts = routing_map.shape
    tokens = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(seed))
    num_out = int(routing_map.sum())
    results = []
    for fused in (False, True):
        x, p = _leaf(tokens, dtype), _leaf(probs)
        if fused:
            permuted, permuted_probs, index = mp.permute(
                x, routing_map, probs=p, num_out_tokens=num_out, drop_and_pad=drop_and_pad)
        else:
            # from 0.17 upstream also returns pad offsets and token counts
            permuted, permuted_probs, index = moe_utils.permute(
                x, routing_map, probs=p, num_out_tokens=num_out, drop_and_pad=drop_and_pad)[:3]
        expert_out = permuted * 1.5 + 0.25  # stands in for the experts
        if fused:
            out = mp.unpermute(expert_out, index, x.shape, probs=p)
        else:
            out = moe_utils.unpermute(expert_out, index, x.shape, probs=p,
                                      routing_map=routing_map, drop_and_pad=drop_and_pad)
        loss = (out.float() ** 2).sum() + (permuted_probs.float() * 3).sum()
        loss.backward()
        results.append((permuted, permuted_probs, out, x.grad, p.grad))
    for name, mine, ref in zip(("permuted", "permuted_probs", "output", "d_tokens", "d_probs"),
                               results[1], results[0]):
        assert mine.dtype == ref.dtype, name
        assert torch.equal(mine, ref), f"{name} differs: max {(mine - ref).abs().max()}"
    return results[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,topk", [(13, 4, 2), (1, 4, 1), (37, 8, 3)])
def test_permute_unpermute_with_probs(dtype, num_tokens, num_experts, topk):
    routing_map, probs = _routing(num_tokens, num_experts, topk)
    _run(dtype, routing_map, probs, hidden=10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expert_with_zero_tokens(dtype):
    routing_map, probs = _routing(11, 4, 2, empty_expert=2)
    assert routing_map[:, 2].sum() == 0
    _run(dtype, routing_map, probs, hidden=6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drop_and_pad_capacity(dtype):
    routing_map, probs = _capacity_routing(19, 4, capacity=5)
    permuted = _run(dtype, routing_map, probs, hidden=8, drop_and_pad=True)[0]
    assert permuted.shape[0] == 4 * 5


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA GPU here; the case runs where one is available")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_matches_upstream(dtype):
    # kernels from ops.kernels where built (summed in fp32, no atomics): close, not bitwise
    routing_map, probs = _routing(300, 8, 2)
    tokens = torch.randn(300, 64)
    x, p, m = tokens.cuda().to(dtype), probs.cuda(), routing_map.cuda()
    perm, perm_probs, index = mp.permute(x, m, probs=p)
    ref_perm, ref_probs, ref_index = moe_utils.permute(x, m, probs=p,
                                                       num_out_tokens=int(m.sum()))[:3]
    assert torch.equal(perm, ref_perm) and torch.equal(perm_probs, ref_probs)
    out = mp.unpermute(perm * 2, index, x.shape, probs=p)
    ref = moe_utils.unpermute(ref_perm * 2, ref_index, x.shape, probs=p, routing_map=m)
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2 if dtype != torch.float32
                               else 1e-5, rtol=1e-2 if dtype != torch.float32 else 1e-5)


def test_unpermute_without_probs_and_te_style_entry_points():
    routing_map, probs = _routing(9, 4, 2)
    tokens = torch.randn(9, 5)
    ref_perm, _, ref_idx = moe_utils.permute(tokens, routing_map, num_out_tokens=18)[:3]
    perm, row_map = mp.fused_permute(tokens, routing_map, num_out_tokens=18)
    assert torch.equal(perm, ref_perm)
    ref = moe_utils.unpermute(ref_perm, ref_idx, tokens.shape)
    assert torch.equal(mp.fused_unpermute(perm, row_map, restore_shape=tokens.shape), ref)
    # TE's fused_unpermute gets the dense probs without the routing map
    perm, perm_probs, row_map = mp.fused_permute_with_probs(tokens, probs, routing_map, 18)
    ref = moe_utils.unpermute(ref_perm, ref_idx, tokens.shape, probs=probs,
                              routing_map=routing_map)
    assert torch.equal(mp.fused_unpermute(perm, row_map, probs, tokens.shape), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sort_chunks_by_index(dtype):
    split_sizes = torch.tensor([3, 0, 5, 2, 1, 4])
    sorted_idxs = torch.tensor([0, 2, 4, 1, 3, 5])
    data = torch.randn(int(split_sizes.sum()), 7)
    probs = torch.rand(int(split_sizes.sum()))
    outs = []
    for fused in (False, True):
        x = _leaf(data, dtype)
        if fused:
            out, out_probs = mp.sort_chunks_by_index(x, split_sizes, sorted_idxs, probs=probs)
        else:
            out, out_probs = moe_utils.sort_chunks_by_idxs(x, split_sizes, sorted_idxs, probs=probs)
        (out.float() * torch.arange(out.shape[0]).unsqueeze(1)).sum().backward()
        outs.append((out, out_probs, x.grad))
    for mine, ref in zip(outs[1], outs[0]):
        assert torch.equal(mine, ref)
    assert torch.equal(mp.fused_sort_chunks_by_index(data, split_sizes, sorted_idxs),
                       outs[0][0].detach().float() if dtype == torch.float32 else
                       moe_utils.sort_chunks_by_idxs(data, split_sizes, sorted_idxs)[0])
