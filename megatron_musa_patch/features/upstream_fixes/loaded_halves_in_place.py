"""A loaded gated MLP input projection is not copied once more to join its two halves.

Megatron's checkpoint state splits every gated MLP's fused input projection into its two halves
(``apply_swiglu_sharded_factory``), which ``torch_dist`` loads into the parameter's own memory;
its merge then joins them with ``torch.cat`` (``cat_with_oom_fallback`` from 0.18), a copy of every such projection, all of them held
until the model takes them back into the same memory. Where the two loaded halves are the two
adjacent contiguous pieces of one storage, in order, joining them is that memory itself, and
here the merge returns it, no byte copied; otherwise the merge is upstream's. For a model loaded
into CPU memory (``mmp checkpoint export-hf``, a gloo run) that is 0.44 of a Llama's bytes at the
load's peak. What it saves: docs/benchmarks.md, checkpoint conversion.
"""

from __future__ import annotations

from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl

FEATURE = feature(
    __name__,
    "a loaded gated MLP input projection's two halves are joined where they lie, not copied")
MAPPING = "megatron.core.dist_checkpointing.mapping"
#: the merges that join the pieces with a cat along dim 0, by module and qualified name: the
#: swiglu factory's own up to 0.17, megatron-core's shared one from 0.18
MERGES_BY_CAT = {("megatron.core.transformer.mlp",
                  "apply_swiglu_sharded_factory.<locals>.sh_ten_merge_fn"),
                 ("megatron.core.transformer.utils", "cat_with_oom_fallback")}


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", f"{MAPPING}:apply_factory_merges", "wrap", _apply_factory_merges,
        why="joining the loaded halves copies every gated MLP input projection"))


def _apply_factory_merges(wrapped, instance, args, kwargs):
    from megatron_musa_patch.upstream.binding import call_arguments

    call = call_arguments(wrapped, args, kwargs)
    factory, loaded = call["x2"], call["x1"]
    merge = getattr(factory, "merge_fn", None)
    if (getattr(merge, "__module__", None), getattr(merge, "__qualname__", None)) in \
            MERGES_BY_CAT:
        joined = adjacent(loaded)
        if joined is not None:
            return joined
    return wrapped(*args, **kwargs)


def adjacent(pieces):
    """The tensor that ``torch.cat(pieces)`` equals, as the memory the pieces already lie in,
    where they are contiguous pieces of one storage, each right after the one before; None
    otherwise."""
    import torch

    if not (isinstance(pieces, (list, tuple)) and len(pieces) > 1 and
            all(isinstance(p, torch.Tensor) and p.is_contiguous() for p in pieces)):
        return None
    first = pieces[0]
    storage = first.untyped_storage().data_ptr()
    end = first.data_ptr()
    for piece in pieces:
        if (piece.untyped_storage().data_ptr() != storage or piece.data_ptr() != end or
                piece.dtype != first.dtype or piece.device != first.device or
                piece.shape[1:] != first.shape[1:]):
            return None
        end += piece.numel() * piece.element_size()
    rows = sum(p.shape[0] for p in pieces)
    return torch.empty(0, dtype=first.dtype, device=first.device).set_(
        first.untyped_storage(), first.storage_offset(), (rows, *first.shape[1:]))
