"""A rank's ``torch_dist`` writer writes a CPU tensor that is a contiguous piece of a larger one
from where it lies, not from a copy of it.

megatron-core's ``FileSystemWriterAsync.prepare_write_data`` copies every CPU tensor whose storage
is larger than the tensor (its ``_clone_if_needed``: torch's serializer writes a tensor's whole
storage), every one of them before the first byte is written. Megatron's own checkpoint state
makes such pieces of every gated MLP's fused input projection (its two halves), so a model saved
from CPU memory (``mmp checkpoint import-hf``, a gloo run) is held a second time for those: 0.44 of
a Llama's bytes at the save's peak. Here the planner the writer asks hands a contiguous CPU piece
over as a tensor with a storage of its own over the same memory (no byte copied; the writer
keeps the tensors it aliases alive), so the writer sees no view and writes just the piece, as it
would a copy; every other tensor is upstream's. Like every CPU tensor upstream does not copy, the
piece is then read when it is written: an ``--async-save`` from CPU memory writes the values of
that moment for these pieces too, not a copy taken at the save's start. What it saves:
docs/benchmarks.md, checkpoint conversion.
"""

from __future__ import annotations

import ctypes

from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl

FEATURE = feature(
    __name__,
    "a rank's torch_dist writer writes contiguous pieces of CPU tensors (the halves of a fused "
    "gated MLP input) in place instead of copying them all first")
WRITER = "megatron.core.dist_checkpointing.strategies.filesystem_async:FileSystemWriterAsync"


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", f"{WRITER}.prepare_write_data", "wrap", _prepare_write_data,
        why="the writer copies every CPU view before it writes any"))


def _prepare_write_data(wrapped, instance, args, kwargs):
    from megatron_musa_patch.upstream.binding import call_arguments

    call = call_arguments(wrapped, args, kwargs)
    planner = InPlace(call["planner"])
    # the tensors whose memory the aliases are: kept with the writer until its next save
    instance._mmp_aliased = planner.owners
    call["planner"] = planner
    return wrapped(**call)


class InPlace:
    """The save's planner, resolving a contiguous piece of a larger CPU tensor to an alias of
    its memory (``alias``; the piece kept in ``owners``); everything else is the planner's
    own."""

    def __init__(self, planner):
        self._planner = planner
        self.owners: list = []

    def __getattr__(self, name):
        return getattr(self._planner, name)

    def resolve_data(self, item):
        tensor = self._planner.resolve_data(item)
        out = alias(tensor)
        if out is not tensor:
            self.owners.append(tensor)
        return out


def alias(tensor):
    """``tensor`` itself, or, where it is a contiguous piece of a larger CPU storage, a tensor
    of the same memory whose storage is exactly its bytes (the caller keeps ``tensor``)."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or \
            not tensor.is_contiguous() or tensor.numel() == 0:
        return tensor
    nbytes = tensor.numel() * tensor.element_size()
    if tensor.untyped_storage().nbytes() == nbytes:
        return tensor
    memory = (ctypes.c_char * nbytes).from_address(tensor.data_ptr())
    return torch.frombuffer(memory, dtype=torch.uint8).view(tensor.dtype).view(tensor.shape)
