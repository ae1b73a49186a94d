"""The architecture families ``mmp checkpoint`` converts, and what every family shares: the
embedding, the final norm and the output layer around the decoder layers.

A family module provides ``ARCHITECTURES`` (Hugging Face class name -> model type), ``check``
(refuse what it cannot map), ``flags`` (the Megatron flags that build the same network),
``layer_to_megatron`` / ``layer_to_hf`` (one decoder layer's tensors, produced one at a time) and
``config_from_args`` (the Hugging Face config of a checkpoint trained with stock
``pretrain_gpt.py``)."""

from __future__ import annotations

from types import ModuleType
from typing import Callable, Iterator, Tuple

from ..errors import ConversionError
from . import deepseek, dense, mixtral

FAMILIES = (dense, mixtral, deepseek)
EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"


def family_of(config: dict) -> ModuleType:
    names = list(config.get("architectures") or [])
    for family in FAMILIES:
        for name in names:
            if name in family.ARCHITECTURES:
                if config.get("model_type") != family.ARCHITECTURES[name]:
                    raise ConversionError(
                        f"config.json: architecture {name} with model_type "
                        f"{config.get('model_type')!r} (expected "
                        f"{family.ARCHITECTURES[name]!r}); the directory looks edited. Nothing "
                        f"was written.")
                return family
    known = sorted(a for f in FAMILIES for a in f.ARCHITECTURES)
    raise ConversionError(
        f"config.json: architecture {names or '(none)'} (model_type "
        f"{config.get('model_type')!r}) is not one this conversion maps; it maps "
        f"{', '.join(known)}. Nothing was written.")


def supported_architectures():
    return sorted(a for f in FAMILIES for a in f.ARCHITECTURES)


def tied(config: dict) -> bool:
    return bool(config.get("tie_word_embeddings", False))


def to_megatron(config: dict, get: Callable) -> Iterator[Tuple[str, object]]:
    """Every tensor of the 1-process Megatron model, in order, from ``get(hf_name)``."""
    family = family_of(config)
    yield EMBEDDING, get("model.embed_tokens.weight")
    for i in range(int(config["num_hidden_layers"])):
        yield from family.layer_to_megatron(config, i, get)
    yield "decoder.final_layernorm.weight", get("model.norm.weight")
    if not tied(config):
        yield OUTPUT, get("lm_head.weight")
    if hasattr(family, "extra_to_megatron"):  # what comes after the decoder (DeepSeek's MTP)
        yield from family.extra_to_megatron(config, get)


def to_hf(config: dict, get: Callable) -> Iterator[Tuple[str, object]]:
    """Every tensor of the Hugging Face model, in order, from ``get(megatron_name)``."""
    family = family_of(config)
    yield "model.embed_tokens.weight", get(EMBEDDING)
    for i in range(int(config["num_hidden_layers"])):
        yield from family.layer_to_hf(config, i, get)
    yield "model.norm.weight", get("decoder.final_layernorm.weight")
    if not tied(config):
        yield "lm_head.weight", get(OUTPUT)
    if hasattr(family, "extra_to_hf"):
        yield from family.extra_to_hf(config, get)


def family_from_args(args) -> ModuleType:
    if getattr(args, "multi_latent_attention", False):
        return deepseek
    return mixtral if getattr(args, "num_experts", None) else dense
