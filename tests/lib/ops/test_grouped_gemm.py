"""ops.grouped_gemm: gmm (grouped_gemm.ops.gmm signature) against one matmul per expert."""

import pytest
import torch

from megatron_musa_patch.lib.ops import grouped_gemm as gg

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1e-2, rtol=1e-2),
       torch.float16: dict(atol=1e-2, rtol=1e-2)}


def _reference(a, b, sizes, trans_b):
    """Plain per-expert matmuls in fp32: the reference the implementations are held to."""
    w = b.float().transpose(-1, -2) if trans_b else b.float()
    rows = torch.split(a.float(), sizes.tolist())
    return torch.cat([r @ w[e] for e, r in enumerate(rows)])


def _check(impl, dtype, sizes, k, n, trans_b=False, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.tensor(sizes)
    experts = sizes.numel()
    a = torch.randn(int(sizes.sum()), k, generator=g).to(device, dtype)
    b = torch.randn((experts, n, k) if trans_b else (experts, k, n), generator=g).to(device, dtype)
    grad = torch.randn(int(sizes.sum()), n, generator=g).to(device, dtype)
    outs = []
    for fn in (impl, _reference):
        x, w = a.clone().requires_grad_(), b.clone().requires_grad_()
        out = fn(x, w, sizes, trans_b)
        out.backward(grad.to(out.dtype))
        outs.append((out.float(), x.grad.float(), w.grad.float()))
    for mine, ref, name in zip(outs[0], outs[1], ("out", "da", "db")):
        torch.testing.assert_close(mine, ref, **TOL[dtype], msg=lambda m: f"{name}: {m}")
    # experts with no rows get an exactly zero weight gradient, not None
    for e in (sizes == 0).nonzero().flatten().tolist():
        assert torch.count_nonzero(outs[0][2][e]) == 0
    return outs[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["gmm", "loop", "grouped_mm"])
@pytest.mark.parametrize("sizes", [[5, 0, 9, 3], [0, 0, 7, 0], [1, 1]])
def test_matches_per_expert_matmuls(dtype, impl, sizes):
    fn = {"gmm": gg.gmm, "loop": gg.gmm_loop, "grouped_mm": gg.gmm_grouped_mm}[impl]
    _check(fn, dtype, sizes, k=16, n=32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_trans_b(dtype):
    _check(gg.gmm, dtype, [3, 4, 0], k=24, n=8, trans_b=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_odd_shapes_use_the_loop(dtype):
    # strides of 13 / 7 elements are not 16-byte multiples: grouped_mm cannot take them
    a, b = torch.randn(4, 13).to(dtype), torch.randn(2, 13, 7).to(dtype)
    assert not gg.grouped_mm_usable(a, b)
    _check(gg.gmm, dtype, [3, 6], k=13, n=7)


def test_grouped_mm_equals_loop_bitwise_on_cpu():
    # the reason PREFERRED['cpu'] is grouped_mm: same numbers, faster (see the benchmark)
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(40, 32, generator=g), torch.randn(4, 32, 16, generator=g)
    sizes = torch.tensor([10, 0, 25, 5])
    assert torch.equal(gg.gmm_grouped_mm(a, b, sizes), gg.gmm_loop(a, b, sizes))


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA GPU here; the case runs where one is available")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_gmm(dtype):
    # grouped_mm where the GPU and dtype have a kernel, the loop otherwise: same numbers
    _check(gg.gmm, dtype, [64, 0, 96, 32], k=128, n=256, device="cuda")


def test_no_rows_at_all():
    a = torch.zeros(0, 16, requires_grad=True)
    b = torch.randn(3, 16, 8, requires_grad=True)
    out = gg.gmm(a, b, torch.zeros(3, dtype=torch.long))
    assert out.shape == (0, 8)
    out.sum().backward()
    assert torch.count_nonzero(b.grad) == 0


def test_choice_override():
    from megatron_musa_patch.base.errors import SettingsError
    from megatron_musa_patch.lib.ops import policy
    from megatron_musa_patch.core.settings import from_env

    assert gg.choice("cpu") == gg.PREFERRED["cpu"]
    with policy.overridden(**vars(policy.Policy.from_settings(
            from_env({"MEGATRON_MUSA_PATCH_GMM": "loop"})))):
        assert gg.choice("cpu") == "loop"
    with pytest.raises(SettingsError, match="MEGATRON_MUSA_PATCH_GMM='cutlass' is not a value"):
        from_env({"MEGATRON_MUSA_PATCH_GMM": "cutlass"})


def test_size_mismatch_is_an_error():
    with pytest.raises(ValueError, match="batch sizes"):
        gg.gmm(torch.randn(4, 8), torch.randn(3, 8, 8), torch.tensor([2, 2]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("shape", [([5, 0, 9, 3], 16, 32), ([3, 6], 13, 7), ([0, 4], 1, 8),
                                   ([1, 1, 2], 8, 1)])
@pytest.mark.parametrize("impl", ["loop", "grouped_mm"])
def test_backward_without_forward_is_bitwise_autograds(dtype, trans_b, shape, impl,
                                                       monkeypatch):
    """gmm_backward (what --recompute-variance applies to the grouped experts' fc2 instead of
    re-running it) gives autograd's gradients of gmm bit for bit, whichever implementation gmm
    picks for the operands (odd shapes fall back to the loop)."""
    monkeypatch.setattr(gg, "choice", lambda device_type: impl)
    sizes, k, n = shape
    g = torch.Generator().manual_seed(sum(sizes) + k + n)
    sizes = torch.tensor(sizes)
    a = torch.randn(int(sizes.sum()), k, generator=g).to(dtype).requires_grad_()
    b = torch.randn((sizes.numel(), n, k) if trans_b else (sizes.numel(), k, n),
                    generator=g).to(dtype).requires_grad_()
    out = gg.gmm(a, b, sizes, trans_b=trans_b)
    grad = torch.randn(out.shape, generator=g).to(dtype)
    want = torch.autograd.grad(out, (a, b), grad)
    got = gg.gmm_backward(a.detach(), b.detach(), sizes, trans_b, grad)
    for name, w, h in zip(("da", "db"), want, got):
        assert w.shape == h.shape and w.dtype == h.dtype, name
        assert torch.equal(w, h), (name, float((w.float() - h.float()).abs().max()))
    # a gradient that arrives with other strides (as from a transpose) changes nothing
    t = torch.randn(out.shape[::-1], generator=g).to(dtype).t()
    want = torch.autograd.grad(gg.gmm(a, b, sizes, trans_b=trans_b), (a, b), t)
    got = gg.gmm_backward(a.detach(), b.detach(), sizes, trans_b, t)
    assert all(torch.equal(w, h) for w, h in zip(want, got))
