"""Checkpointing one block of a layer with Megatron's own ``tensor_parallel.checkpoint``.

``checkpoint_block(fn, args, kwargs, defer)`` runs ``fn(*args, **kwargs)`` under
``CheckpointFunction``: the forward runs without autograd and keeps only the tensor arguments;
backward restores the CPU, device and RNG-tracker states, re-runs ``fn`` with autograd and
back-propagates through it, so dropout masks are the same bit for bit. With ``defer`` (the
``--recompute-variance`` mode), the re-run skips the forward of those linear modules (see
``deferred``): the recompute ends at their input and their backward starts from the saved
output gradient.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Sequence

import torch

#: set on the placeholder outputs of skipped linears, so the all-reduce after one passes it on
MARK = "_mmp_deferred_output"

_state = threading.local()


def deferred_ids() -> frozenset:
    """ids of the linear modules (or grouped-GEMM weights) that skip their forward right now
    (on this thread)."""
    return getattr(_state, "ids", frozenset())


@contextmanager
def deferring(modules):
    previous = deferred_ids()
    _state.ids = previous | {id(m) for m in modules}
    try:
        yield
    finally:
        _state.ids = previous


def _split(args, kwargs):
    """Tensor leaves (top level, or inside a top-level tuple/list) and a way to put them back."""
    tensors, slots = [], []
    for where, items in (("args", list(enumerate(args))), ("kwargs", list(kwargs.items()))):
        for key, value in items:
            if isinstance(value, torch.Tensor):
                slots.append((where, key, None))
                tensors.append(value)
            elif isinstance(value, (tuple, list)):
                for i, item in enumerate(value):
                    if isinstance(item, torch.Tensor):
                        slots.append((where, key, i))
                        tensors.append(item)
    return tensors, slots


def _rebuild(args, kwargs, slots, tensors):
    args, kwargs = list(args), dict(kwargs)
    containers = {}
    for (where, key, index), tensor in zip(slots, tensors):
        target = args if where == "args" else kwargs
        if index is None:
            target[key] = tensor
        else:
            seq = containers.setdefault((where, key), list(target[key]))
            seq[index] = tensor
    for (where, key), seq in containers.items():
        target = args if where == "args" else kwargs
        target[key] = type(target[key])(seq)
    return args, kwargs


class _BlockRun:
    """The function CheckpointFunction calls: once in forward, once more in backward."""

    def __init__(self, fn: Callable, args, kwargs, slots, defer: Sequence[Any]):
        self.fn = fn
        # the tensors themselves travel through the checkpoint (and are saved there only)
        self.args, self.kwargs = _rebuild(args, kwargs, slots, [None] * len(slots))
        self.slots = slots
        self.defer = tuple(defer)
        self.calls = 0

    def __call__(self, *tensors):
        args, kwargs = _rebuild(self.args, self.kwargs, self.slots, tensors)
        self.calls += 1
        if self.calls == 1 or not self.defer:
            return self.fn(*args, **kwargs)
        with deferring(self.defer):
            return self.fn(*args, **kwargs)


def checkpoint_block(fn: Callable, args, kwargs, defer: Sequence[Any] = ()):
    """``fn(*args, **kwargs)``, keeping only its tensor arguments for backward."""
    from megatron.core import tensor_parallel

    tensors, slots = _split(args, kwargs)
    if not any(t.requires_grad for t in tensors):
        # a reentrant checkpoint whose inputs need no gradient would return an output that
        # needs none either, and the block's parameters would get no gradient: run it plainly
        return fn(*args, **kwargs)
    run = _BlockRun(fn, args, kwargs, slots, defer)
    return tensor_parallel.checkpoint(run, False, *tensors)
