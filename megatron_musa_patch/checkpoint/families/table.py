"""A family's table and the one engine that runs it either way.

A ``Family`` is one Hugging Face model type: its config fields (``fields``), the rows of its
decoder layers (``layer``: ``Section``s, each for the layers it applies to, an expert's rows
repeated per expert) and what surrounds them (the embedding, the final norm, the output layer
unless tied, and any ``extra`` mappings such as DeepSeek's MTP layers). ``mappings(config)``
expands the table into every tensor pair of the model; ``to_megatron`` and ``to_hf`` run those
pairs in one direction, one tensor at a time, from a ``get(name)`` of the other side."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import ConversionError
from . import common, fields as config_fields
from .rows import COLUMN, Copy, Rename

EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"
#: what every family here builds with: Megatron's local spec, RMSNorm, SwiGLU, no dropout in
#: the residual stream (the Hugging Face configs carry none)
LOCAL_SPEC = ("--transformer-impl", "local", "--normalization", "RMSNorm", "--swiglu",
              "--disable-bias-linear", "--hidden-dropout", "0.0")


@dataclass(frozen=True)
class Section:
    """Rows of a decoder layer, for the layers ``where(config, i)`` holds (all without it);
    with ``experts``, repeated for each routed expert under the prefixes ``experts`` names
    ((Megatron's, Hugging Face's), ``{e}`` the expert)."""

    rows: Tuple
    where: Optional[Callable[[dict, int], bool]] = None
    experts: Optional[Tuple[str, str]] = None


@dataclass(frozen=True)
class Bound:
    """A row placed in the model: its Megatron name, its Hugging Face names."""

    megatron: str
    hf: Tuple[str, ...]
    row: object


@dataclass(frozen=True)
class Family:
    model_type: str
    architecture: str
    fields: Tuple[config_fields.Field, ...]
    layer: Tuple[Section, ...]
    #: flags beyond the fields' (the layer kinds every model of the type has)
    always: Tuple[str, ...] = LOCAL_SPEC
    #: rules across fields, run after each field's own
    checks: Tuple[Callable[[dict], None], ...] = ()
    #: the routed experts of a layer (0: a dense model)
    experts: Callable[[dict], int] = lambda config: 0
    #: whether a checkpoint's args are this model type's (export without a config); None: the
    #: export never makes this type's config from args (another type's stands for it)
    made_from_args: Optional[Callable[[object], bool]] = None
    #: mappings after the final norm's and output layer's (DeepSeek's MTP layers)
    extra: Optional[Callable[["Family", dict], Iterator[Bound]]] = None
    #: refuses a checkpoint the installed megatron-core builds otherwise than the flags would
    built_alike: Optional[Callable[[object, object], None]] = None
    #: the attention's sizes a row's layout needs
    dims: Callable[[dict], Dict[str, int]] = common.dims

    # ------------------------------------------------------------------ config
    def check(self, config: dict) -> None:
        config_fields.check_fields(config, self.model_type, self.fields)
        for rule in self.checks:
            rule(config)

    def flags(self, config: dict) -> List[str]:
        """The Megatron flags that build this model with the local spec."""
        return list(self.always) + config_fields.flags_of(self.fields, config)

    def config_from_args(self, args, base: dict) -> dict:
        """The Hugging Face config of a checkpoint written by stock pretrain_gpt.py, from its
        args (``base``: the vocabulary and dtype)."""
        config = {**base, "model_type": self.model_type, "architectures": [self.architecture]}
        config.update(config_fields.config_of(self.fields, args))
        return config

    def check_built_alike(self, args, core) -> None:
        if self.built_alike is not None:
            self.built_alike(args, core)

    # ------------------------------------------------------------------ tensors
    def mappings(self, config: dict) -> Iterator[Bound]:
        yield Bound(EMBEDDING, ("model.embed_tokens.weight",), Rename("", "", COLUMN))
        for i in range(int(config["num_hidden_layers"])):
            yield from self.layer_mappings(config, i, f"decoder.layers.{i}.", f"model.layers.{i}.")
        yield Bound("decoder.final_layernorm.weight", ("model.norm.weight",), Rename("", ""))
        if not tied(config):
            yield Bound(OUTPUT, ("lm_head.weight",), Rename("", "", COLUMN))
        if self.extra is not None:
            yield from self.extra(self, config)

    def layer_mappings(self, config: dict, i: int, megatron: str, hf: str) -> Iterator[Bound]:
        """Decoder layer ``i``'s pairs under the prefixes ``megatron`` and ``hf``."""
        for section in self.layer:
            if section.where is not None and not section.where(config, i):
                continue
            if section.experts is None:
                yield from _bound(section.rows, megatron, hf)
                continue
            ours, theirs = section.experts
            for e in range(self.experts(config)):
                yield from _bound(section.rows, megatron + ours.format(e=e),
                                  hf + theirs.format(e=e))

    def to_megatron(self, config: dict, get: Callable) -> Iterator[Tuple[str, object]]:
        """Every tensor of the one-process Megatron model, in order, from ``get(hf_name)``."""
        for pair, tensor in self.converted(config, self.mappings(config), get):
            yield pair.megatron, tensor

    def converted(self, config: dict, pairs, get: Callable) -> Iterator[Tuple[Bound, object]]:
        """Each of ``pairs`` with its whole Megatron tensor, from ``get(hf_name)``; a ``Copy``
        is compared with what it repeats (refused where it differs) and yields nothing."""
        dims = self.dims(config)
        for pair in pairs:
            if isinstance(pair.row, Copy):
                check_copy(pair, get)
                continue
            yield pair, pair.row.to_megatron([get(n) for n in pair.hf], dims)

    def to_hf(self, config: dict, get: Callable) -> Iterator[Tuple[str, object]]:
        """Every tensor of the Hugging Face model, in order, from ``get(megatron_name)``."""
        dims = self.dims(config)
        for pair in self.mappings(config):
            yield from zip(pair.hf, pair.row.to_hf(get(pair.megatron), dims))


def _bound(rows: Sequence, megatron: str, hf: str) -> Iterator[Bound]:
    for row in rows:
        yield Bound(megatron + row.megatron, tuple(hf + n for n in row.hf_names), row)


def check_copy(pair: Bound, get: Callable) -> None:
    """A Hugging Face copy equals the tensor it repeats, or the checkpoint is refused."""
    import torch

    if not torch.equal(get(pair.hf[0]), get(pair.row.same_as)):
        raise ConversionError(
            f"{pair.hf[0]} differs from {pair.row.same_as}: Megatron holds one "
            f"{pair.megatron}, which both are copies of, so this checkpoint cannot be held as it "
            f"is. Nothing was written.")


def tied(config: dict) -> bool:
    return bool(config.get("tie_word_embeddings", False))
