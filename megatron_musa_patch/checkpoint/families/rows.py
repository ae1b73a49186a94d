"""The kinds of row a family's table is made of. A row pairs one Megatron tensor with the Hugging
Face tensor(s) it is made of and knows both directions: ``to_megatron(hf tensors) -> tensor``
and ``to_hf(tensor) -> hf tensors``, with the tensor-parallel split Megatron gives its tensor
(``split``: ``COLUMN``, rows cut across ranks, dim 0; ``ROW``: columns, dim 1; ``REPLICATED``:
whole on every rank; a fused QKV is cut by query group, which is dim 0 of its layout, and a
``gated`` tensor's halves are cut alike). Names are relative to where the table puts the row
(a decoder layer, an expert, the model); an expert's rows are split across expert-parallel
ranks by expert. A conversion at a layout checks each split against the shape Megatron built.

torch is imported where a layout is computed (in the worker), not with the module: mmp
checkpoint's own process reads configs and plans without it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

COLUMN, ROW, REPLICATED = "column", "row", "replicated"
#: the dimension a split cuts (None: not cut)
DIMENSION = {COLUMN: 0, ROW: 1, REPLICATED: None}


class _FromOne:
    """A row made of one Hugging Face tensor, ``hf``."""

    @property
    def hf_names(self) -> Tuple[str, ...]:
        return (self.hf,)


@dataclass(frozen=True)
class Rename(_FromOne):
    """One tensor, the same on both sides under another name."""

    megatron: str
    hf: str
    split: str = REPLICATED
    gated = False

    def to_megatron(self, tensors: Sequence, dims: Dict[str, int]):
        return tensors[0]

    def to_hf(self, tensor, dims: Dict[str, int]) -> List:
        return [tensor]


@dataclass(frozen=True)
class PackedGated(Rename):
    """A gated MLP input projection stored fused as Megatron's, gate first (Phi-3's
    ``gate_up_proj``): the same tensor, whose halves are split alike."""

    split: str = COLUMN
    gated = True


@dataclass(frozen=True)
class GroupedQKV:
    """Megatron's fused QKV from separate q, k, v: for each query group, its query heads, then
    its key, then its value ([groups * (heads/groups + 2) * head_dim, ...]); a bias likewise.
    Split across tensor-parallel ranks by query group."""

    megatron: str
    q: str
    k: str
    v: str
    split: str = COLUMN
    gated = False

    @property
    def hf_names(self) -> Tuple[str, ...]:
        return (self.q, self.k, self.v)

    def to_megatron(self, tensors: Sequence, dims: Dict[str, int]):
        return qkv_to_megatron(*tensors, dims["heads"], dims["groups"], dims["head_dim"])

    def to_hf(self, tensor, dims: Dict[str, int]) -> List:
        return list(qkv_from_megatron(tensor, dims["heads"], dims["groups"], dims["head_dim"]))


@dataclass(frozen=True)
class PackedQKV(_FromOne):
    """Megatron's fused QKV from one tensor holding all queries, then all keys, then all values
    (Phi-3's ``qkv_proj``)."""

    megatron: str
    hf: str
    split: str = COLUMN
    gated = False

    def to_megatron(self, tensors: Sequence, dims: Dict[str, int]):
        q, k, v = tensors[0].split(_qkv_sizes(dims), dim=0)
        return qkv_to_megatron(q, k, v, dims["heads"], dims["groups"], dims["head_dim"])

    def to_hf(self, tensor, dims: Dict[str, int]) -> List:
        import torch

        return [torch.cat(qkv_from_megatron(tensor, dims["heads"], dims["groups"],
                                            dims["head_dim"]), dim=0)]


@dataclass(frozen=True)
class Gated:
    """Megatron's gated MLP input projection [gate; up] (its swiglu applies silu to the first
    half) from separate gate and up projections. A tensor-parallel rank holds its part of
    each half."""

    megatron: str
    gate: str
    up: str
    split: str = COLUMN
    gated = True

    @property
    def hf_names(self) -> Tuple[str, ...]:
        return (self.gate, self.up)

    def to_megatron(self, tensors: Sequence, dims: Dict[str, int]):
        import torch

        return torch.cat(list(tensors), dim=0)

    def to_hf(self, tensor, dims: Dict[str, int]) -> List:
        return list(tensor.chunk(2, dim=0))


@dataclass(frozen=True)
class Copy(_FromOne):
    """A Hugging Face tensor that repeats one the table maps elsewhere (the embedding and output
    head a DeepSeek MTP layer keeps): the import checks it equals ``same_as`` and takes nothing
    from it, the export writes Megatron's ``megatron`` tensor under its name again."""

    megatron: str
    hf: str
    same_as: str
    split: str = REPLICATED
    gated = False

    def to_hf(self, tensor, dims: Dict[str, int]) -> List:
        return [tensor]


def _qkv_sizes(dims: Dict[str, int]) -> List[int]:
    return [dims["heads"] * dims["head_dim"], dims["groups"] * dims["head_dim"],
            dims["groups"] * dims["head_dim"]]


def qkv_to_megatron(q, k, v, heads: int, groups: int, head_dim: int):
    per_group = heads // groups
    rest = q.shape[1:]
    q = q.reshape(groups, per_group * head_dim, *rest)
    k = k.reshape(groups, head_dim, *rest)
    v = v.reshape(groups, head_dim, *rest)
    import torch

    return torch.cat([q, k, v], dim=1).reshape(groups * (per_group + 2) * head_dim, *rest)


def qkv_from_megatron(qkv, heads: int, groups: int, head_dim: int):
    per_group = heads // groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * head_dim, *rest)
    q, k, v = grouped.split([per_group * head_dim, head_dim, head_dim], dim=1)
    return (q.reshape(heads * head_dim, *rest), k.reshape(groups * head_dim, *rest),
            v.reshape(groups * head_dim, *rest))
