"""A rank's ``torch_dist`` writer writes a CPU tensor that is a contiguous piece of a larger one
from where it lies, not from a copy of it.

megatron-core's ``FileSystemWriterAsync.prepare_write_data`` copies every CPU tensor whose storage
is larger than the tensor (its ``_clone_if_needed``: torch's serializer writes a tensor's whole
storage), every one of them before the first byte is written. Megatron's own checkpoint state
makes such pieces of every gated MLP's fused input projection (its two halves), so a model saved
from CPU memory (``mmp checkpoint import-hf``, a gloo run) is held a second time for those: 0.44 of
a Llama's bytes at the save's peak. Here the planner the writer asks hands a contiguous CPU piece
over as a tensor with a storage of its own over the same memory (no byte copied; it keeps the
tensor it aliases alive), so the writer sees no view and writes just the piece, as it would a
copy; every other tensor is upstream's. What it saves: docs/benchmarks.md, checkpoint
conversion.
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
    call["planner"] = InPlace(call["planner"])
    return wrapped(**call)


class InPlace:
    """The save's planner, resolving a contiguous piece of a larger CPU tensor to an alias of
    its memory (``alias``); everything else is the planner's own."""

    def __init__(self, planner):
        self._planner = planner

    def __getattr__(self, name):
        return getattr(self._planner, name)

    def resolve_data(self, item):
        return alias(self._planner.resolve_data(item))


def alias(tensor):
    """``tensor`` itself, or, where it is a contiguous piece of a larger CPU storage, a tensor
    of the same memory whose storage is exactly its bytes."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or \
            not tensor.is_contiguous() or tensor.numel() == 0:
        return tensor
    nbytes = tensor.numel() * tensor.element_size()
    if tensor.untyped_storage().nbytes() == nbytes:
        return tensor
    memory = (ctypes.c_char * nbytes).from_address(tensor.data_ptr())
    out = torch.frombuffer(memory, dtype=torch.uint8).view(tensor.dtype).view(tensor.shape)
    out._mmp_aliased = tensor  # the memory's owner lives as long as the alias
    return out
