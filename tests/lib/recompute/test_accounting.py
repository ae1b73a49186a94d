"""SavedBytes: bytes held for backward, per unique storage, at their size after the forward."""

import torch

from megatron_musa_patch.lib.recompute.accounting import SavedBytes


def test_counts_what_autograd_saves_once_per_storage():
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(16, 16))
    with SavedBytes(exclude=[w]) as saved:
        y = x @ w          # saves x (and w: excluded)
        z = torch.tanh(y)  # saves its output
        a, b = z.chunk(2, dim=1)
        out = (a * b).sum()  # saves two views of z's storage: counted once
    assert saved.nbytes() == x.numel() * 4 + z.numel() * 4
    out.backward()


def test_a_released_storage_counts_nothing():
    x = torch.randn(32, requires_grad=True)
    with SavedBytes() as saved:
        y = x * 2          # multiplying by a constant saves nothing
        z = (y * y).sum()  # saves y (twice: one storage)
    assert saved.nbytes() == 32 * 4
    y.untyped_storage().resize_(0)  # what CheckpointWithoutOutput / NormOutput do
    assert saved.nbytes() == 0
    del z


def test_excluded_inputs_and_nothing_saved_without_grad():
    mask = torch.ones(4, 4, dtype=torch.bool)
    x = torch.randn(4, 4, requires_grad=True)
    with SavedBytes(exclude=[mask]) as saved:
        y = torch.where(mask, x * x, x)
    assert saved.nbytes() == x.numel() * 4  # x (for x*x); the mask is shared, left out
    with torch.no_grad(), SavedBytes() as none:
        torch.tanh(x)
    assert none.nbytes() == 0
    y.sum().backward()
