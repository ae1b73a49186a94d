"""A rank's part of the model, as Megatron built it at a parallel layout: the whole-model name of
each tensor the rank holds, and the rank's piece of a whole tensor.

Names: a pipeline stage's decoder layers are numbered from 0 in its state, and a layer knows its
place in the whole model (``layer_number``, from 1); a MoE layer's local experts are numbered
from 0, and the layer knows which of the model's experts they are (``local_expert_indices``).

Pieces: the shape Megatron built a tensor with on this rank says how it is split: along the one
dimension where it is the whole's divided by the tensor-parallel size (a routed expert's by the
expert tensor-parallel size), and for a gated MLP input ([gate; up]) each half alike. (Megatron
marks its parameters' split only when it initialises them, which a conversion does not.) The
vocabulary is padded to Megatron's first (zero rows)."""

from __future__ import annotations

import re
from typing import Dict, Tuple

#: the state's name of a decoder layer, and of a local expert inside a layer
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.local_experts\.(\d+)\.")


def unwrapped(chunk):
    """The model chunk without Megatron's wrappers (Float16Module and the like)."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def global_names(chunk) -> Dict[str, str]:
    """The chunk's state names -> the whole model's names of the same tensors."""
    import torch

    model = unwrapped(chunk)
    layers = list(getattr(getattr(model, "decoder", None), "layers", None) or [])
    experts = {name: list(module.local_expert_indices) for name, module in model.named_modules()
               if hasattr(module, "local_expert_indices")}
    out = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if not isinstance(tensor, torch.Tensor):
            continue
        whole = name
        for owner, indices in experts.items():  # the experts' layer, by its state name
            prefix = owner + ".experts.local_experts."
            if name.startswith(prefix):
                local = int(name[len(prefix):].split(".", 1)[0])
                whole = prefix + str(indices[local]) + name[len(prefix) + len(str(local)):]
        found = _LAYER.match(whole)
        if found:
            number = layers[int(found.group(1))].layer_number - 1
            whole = f"decoder.layers.{number}." + whole[found.end():]
        out[name] = whole
    return out


def piece(name: str, whole, local_shape, row, vocabulary: bool = False):
    """This rank's piece of the whole tensor ``whole`` (Megatron's ``name``) for a tensor of
    ``local_shape``, as ``row`` maps it (its ``gated`` halves split alike; ``vocabulary``: the
    embedding or output layer, padded to Megatron's vocabulary first). Where the shapes differ
    along one dimension by the tensor-parallel size (a routed expert's: the expert
    tensor-parallel size), the piece is this rank's share of it, checked against the row's
    ``split``; otherwise the whole is returned for the caller to compare."""
    from .families.rows import DIMENSION

    rank, size = _tensor_parallel(is_expert(name))
    if vocabulary:
        whole = padded(whole, local_shape[0] * size)
    local_shape = tuple(local_shape)
    differ = [d for d, (w, n) in enumerate(zip(whole.shape, local_shape)) if w != n]
    if len(differ) != 1 or len(local_shape) != whole.dim() or \
            whole.shape[differ[0]] != local_shape[differ[0]] * size:
        return whole
    dim = differ[0]
    if DIMENSION[row.split] != dim:
        raise SystemExit(f"mmp checkpoint: {name}: Megatron splits it along dimension {dim} "
                         f"across tensor-parallel ranks, the family's table says "
                         f"{row.split}: the table is wrong for this model")
    if row.gated:
        import torch

        return torch.cat([half.chunk(size, dim)[rank] for half in whole.chunk(2, dim)], dim)
    return whole.chunk(size, dim)[rank]


def padded(tensor, rows: int):
    """The embedding (or output layer) with Megatron's padded vocabulary: zero rows appended
    (the export drops them again)."""
    import torch

    if tensor.shape[0] == rows:
        return tensor
    if tensor.shape[0] > rows:
        raise SystemExit(f"mmp checkpoint: the vocabulary has {tensor.shape[0]} rows, Megatron's "
                         f"padded vocabulary only {rows}")
    pad = torch.zeros((rows - tensor.shape[0],) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
    return torch.cat([tensor, pad], dim=0)


def _tensor_parallel(expert: bool) -> Tuple[int, int]:
    from megatron.core import parallel_state as ps

    if expert:
        return (ps.get_expert_tensor_parallel_rank(),
                ps.get_expert_tensor_parallel_world_size())
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def is_expert(name: str) -> bool:
    """Whether the tensor named so (whole-model name) is a routed expert's."""
    return ".experts.local_experts." in name
