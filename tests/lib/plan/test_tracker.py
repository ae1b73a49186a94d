"""The fake run's memory and work: the tracker against the CPU allocator's own count of the same
step run for real (torch's profiler), and its accounting of compiled regions."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from megatron_musa_patch.lib.plan.tracker import Tracker, rounded


def _step(model, x):
    loss = torch.nn.functional.gelu(model(x)).square().mean()
    loss.backward()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    opt.step()
    return opt


def _model():
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 256), torch.nn.LayerNorm(256))


def _allocator_peak(fn) -> int:
    """The most bytes the CPU allocator held live while ``fn`` ran (its own count)."""
    from torch.profiler import ProfilerActivity, profile

    from megatron_musa_patch.lib.plan.allocator import peak_allocated

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        keep = fn()
    del keep
    return peak_allocated(prof)


def test_fake_peak_equals_the_allocators_peak_of_the_real_step():
    torch.manual_seed(0)
    real = _allocator_peak(lambda: (lambda m: (m, _step(m, torch.randn(512, 256))))(_model()))
    tracker = Tracker()
    with FakeTensorMode(), tracker:
        model = _model()
        opt = _step(model, torch.randn(512, 256))
    assert tracker.peak == pytest.approx(real, rel=0.01)
    assert opt is not None


def test_freed_storage_leaves_and_views_are_not_counted_twice():
    tracker = Tracker()
    with FakeTensorMode(), tracker:
        a = torch.empty(1000, dtype=torch.float32)
        view = a[10:20]
        b = torch.empty(500, dtype=torch.bfloat16)
        assert tracker.live == 4000 + 1000
        del a
        assert tracker.live == 5000  # the view keeps the storage
        del view
        assert tracker.live == 1000
        del b
    assert tracker.live == 0 and tracker.peak == 5000
    assert tracker.peak_rounded == rounded(4000) + rounded(1000) == 4096 + 1024


def test_a_compiled_region_counts_its_outputs_only():
    def softmax_like(x):
        y = (x - x.amax(-1, keepdim=True)).exp()
        return y / y.sum(-1, keepdim=True)

    eager, fused = Tracker(), Tracker()
    with FakeTensorMode():
        x = torch.empty(64, 1024)
        with eager:
            out = softmax_like(x)
            del out
        with fused:
            out = fused.fused(softmax_like)(x)
    assert out.shape == x.shape
    assert fused.peak == 64 * 1024 * 4  # the output alone
    assert eager.peak >= 2 * 64 * 1024 * 4  # an intermediate beside the output
    (key, count), = fused.work["setup"].items()
    # one op, math, marked fused (priced at a compiled region's own rate)
    assert count == 1 and key[1] == 2 * 64 * 1024 * 4 and key[3] > 0 and key[4] == 1
    # a norm's root and division fuse into the bytes it moves: no transcendental rate
    norm = Tracker()
    with FakeTensorMode():
        y = torch.empty(64, 1024)
        with norm:
            norm.fused(lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5))(y)
    (key, count), = norm.work["setup"].items()
    assert key[3] == 0 and key[4] == 1


def _one_op_work(fn):
    """The work rows of ``fn(operands)``, with ``operands = fn(None)`` made before tracking."""
    tracker = Tracker()
    with FakeTensorMode():
        operands = fn(None)
        with tracker:
            fn(operands if operands is not None else ())
    return [key for counter in tracker.work.values() for key in counter]


def test_views_cost_nothing_allocations_their_issue_and_indexing_its_selection():
    # matmul hands its result back through _unsafe_view, whose schema says nothing of aliasing
    keys = _one_op_work(lambda o: (torch.empty(8, 4, 64), torch.empty(64, 32)) if o is None
                        else torch.matmul(*o))
    assert len(keys) == 1 and keys[0][0] == 2 * 32 * 64 * 32  # the product alone
    keys = _one_op_work(lambda o: None if o is None else torch.empty(1 << 20, dtype=torch.half))
    assert keys == [(0, 0, 32, 0, 0)]  # issued, nothing read or written (width: none read)
    # a gather of 8 rows of a 4000-row table reads those rows and the indices, not the table
    keys = _one_op_work(lambda o: (torch.empty(4000, 256), torch.zeros(8, dtype=torch.long))
                        if o is None else o[0][o[1]])
    (flops, nbytes, *_), = keys
    assert nbytes == 2 * 8 * 256 * 4 + 8 * 8
    keys = _one_op_work(lambda o: (torch.empty(4000, 256), torch.zeros(8, dtype=torch.long),
                                   torch.empty(8, 256)) if o is None
                        else o[0].index_put_((o[1],), o[2]))
    (flops, nbytes, *_), = keys
    assert nbytes == 2 * 8 * 256 * 4 + 8 * 8


def test_a_value_asked_of_a_fake_tensor_is_neutral():
    with FakeTensorMode(), Tracker():
        t = torch.empty(4)
        assert bool(torch.isnan(t).any()) is False
        assert float(t.norm()) == 1.0


def test_grouped_gemms_count_their_products_forward_and_backward():
    # MoE's --moe-grouped-gemm runs aten._grouped_mm, which torch's FLOP table lacks: priced by
    # its bytes alone it would cost next to nothing
    from megatron_musa_patch.lib.ops.grouped_gemm import gmm

    tracker = Tracker()
    with FakeTensorMode():
        a = torch.empty(64, 32, dtype=torch.bfloat16, requires_grad=True)
        b = torch.empty(4, 32, 48, dtype=torch.bfloat16, requires_grad=True)
        tokens_per_expert = torch.tensor([16, 8, 0, 40])
        with tracker:
            gmm(a, b, tokens_per_expert).sum().backward()
    products = sorted(flops for counter in tracker.work.values() for (flops, *_), n in
                      counter.items() for _ in range(n) if flops)
    # forward, input gradient, weight gradient: each 2 x tokens x 32 x 48
    assert products == [2 * 64 * 32 * 48] * 3


def test_equal_of_fake_tensors_is_true_so_a_causal_mask_takes_the_causal_path():
    # the layer's SDPA path compares the attention mask with the causal pattern (torch.equal),
    # whose answer a fake tensor does not have
    with FakeTensorMode(), Tracker():
        mask = torch.empty(1, 1, 8, 8, dtype=torch.bool)
        assert torch.equal(mask, torch.ones(8, 8, dtype=torch.bool).triu(1)) is True


def test_the_planned_flash_attention_stores_no_scores_even_with_dropout():
    # the planning CPU has no flash kernel with dropout: SDPA's math path would store the fp32
    # sequence x sequence scores that a device's flash kernel never makes
    from megatron_musa_patch.lib.plan import fake_world

    def peak():
        tracker = Tracker()
        with FakeTensorMode():
            q = torch.empty(1, 4, 1024, 64, dtype=torch.bfloat16, requires_grad=True)
            with tracker:
                torch.nn.functional.scaled_dot_product_attention(q, q, q, None, 0.1,
                                                                 is_causal=True)
        return tracker.peak

    scores = 4 * 1024 * 1024 * 4
    assert peak() >= scores  # torch's own choice on the CPU
    with fake_world.applied(fake_world.Recorder()):
        assert peak() < scores // 8


def test_the_planned_flash_attention_of_mla_stores_no_scores_and_keeps_the_values_width():
    # MLA's values are narrower than its queries (128 against 192): the CPU's flash kernel
    # wants them equal, and SDPA's math path would store the scores
    from megatron_musa_patch.lib.plan import fake_world

    def planned():
        tracker = Tracker()
        with FakeTensorMode():
            q = torch.empty(1, 4, 1024, 192, dtype=torch.bfloat16, requires_grad=True)
            v = torch.empty(1, 4, 1024, 128, dtype=torch.bfloat16, requires_grad=True)
            with tracker:
                out = torch.nn.functional.scaled_dot_product_attention(q, q, value=v,
                                                                       is_causal=True)
        return tracker.peak, out.shape

    scores = 4 * 1024 * 1024 * 4
    peak, _ = planned()
    assert peak >= scores  # torch's own choice on the CPU: the math path
    with fake_world.applied(fake_world.Recorder()):
        peak, shape = planned()
    # the padded values and the padded output (1.5 MB each), no scores (16 MB)
    assert peak < scores // 4 and shape == (1, 4, 1024, 128)
    # the values the padded call gives are the math path's
    q, k, v = (torch.randn(1, 2, 16, d) for d in (24, 24, 16))
    with fake_world.applied(fake_world.Recorder()):
        flash = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(flash, torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True))


def test_the_planned_flash_attention_counts_its_products_on_every_torch():
    # torch 2.11's FLOP table has no formula for the CPU's flash kernel (2.15 has one): priced by
    # its bytes alone, the attention of a long sequence would cost next to nothing
    tracker = Tracker()
    with FakeTensorMode():
        q = torch.empty(1, 4, 1024, 64, dtype=torch.bfloat16, requires_grad=True)
        kv = torch.empty(1, 2, 1024, 64, dtype=torch.bfloat16, requires_grad=True)
        with tracker:
            torch.nn.functional.scaled_dot_product_attention(
                q, kv, kv, is_causal=True, enable_gqa=True).sum().backward()
    products = sorted(flops for counter in tracker.work.values() for (flops, *_), n in
                      counter.items() for _ in range(n) if flops > 10 ** 6)
    square = 2 * 4 * 1024 * 1024
    assert products == [square * 128, square * 320]  # forward; backward (scores recomputed)
