"""Tensors kept for backward whose values are dropped after forward and recomputed in backward.

The same idea as ``norm_output`` (one norm's output), for a group of tensors produced together:
:func:`release` frees the storage of each tensor (every alias of it, so the copies autograd
saved too) and registers a hook on ``until``; when backward computes ``until``'s gradient -- before
any operation that saved the tensors runs its backward -- ``recompute()`` runs without autograd
and its results are copied back into the same storages. The autograd graph is the one of the run
without recompute; only values are dropped and restored, so gradients are bitwise the same.

A tensor is released only when it owns its whole storage and is contiguous (a view into a larger
buffer, or a tensor computed in place in one of the kept tensors, is kept as it is).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def releasable(tensor, keep: Sequence[torch.Tensor] = ()) -> bool:
    if not isinstance(tensor, torch.Tensor) or not tensor.is_contiguous() or tensor.numel() == 0:
        return False
    storage = tensor.untyped_storage()
    if storage.nbytes() != tensor.numel() * tensor.element_size():
        return False
    return not any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() ==
                   storage.data_ptr() for t in keep)


class Released:
    def __init__(self, tensors, recompute: Callable[[], Sequence[torch.Tensor]], mask):
        self.tensors = list(tensors)
        self.recompute = recompute
        self.mask = mask  # which of recompute()'s results are restored
        self.nbytes = [t.untyped_storage().nbytes() for t in self.tensors]

    def restore(self, grad):
        if self.recompute is None:
            return None
        with torch.no_grad():
            fresh = list(self.recompute())
        chosen = [f for f, keep in zip(fresh, self.mask) if keep]
        for old, new, nbytes in zip(self.tensors, chosen, self.nbytes):
            if new.shape != old.shape or new.dtype != old.dtype or not new.is_contiguous():
                raise RuntimeError(f"recomputed tensor {tuple(new.shape)} {new.dtype} does not "
                                   f"match the released {tuple(old.shape)} {old.dtype}")
            storage = old.untyped_storage()
            storage.resize_(nbytes)
            storage.copy_(new.untyped_storage())
        self.tensors = self.recompute = None
        return None


def release(tensors: Sequence[torch.Tensor], recompute: Callable[[], Sequence[torch.Tensor]], *,
            until: torch.Tensor, keep: Sequence[torch.Tensor] = ()):
    """Free the releasable ``tensors`` now; ``recompute()`` returns fresh values for all of
    ``tensors`` (in order) when ``until``'s gradient is computed. ``keep``: tensors that stay
    (a released storage must not be one of theirs). Returns the entry, or None if nothing was
    released."""
    if not (isinstance(until, torch.Tensor) and until.requires_grad):
        return None
    mask = [releasable(t, keep) for t in tensors]
    # two tensors in one storage: release it once
    seen = set()
    for i, t in enumerate(tensors):
        if mask[i]:
            ptr = t.untyped_storage().data_ptr()
            if ptr in seen:
                mask[i] = False
            seen.add(ptr)
    chosen = [t for t, m in zip(tensors, mask) if m]
    if not chosen:
        return None
    entry = Released(chosen, recompute, mask)
    for t in chosen:
        t.untyped_storage().resize_(0)
    until.register_hook(entry.restore)
    return entry
