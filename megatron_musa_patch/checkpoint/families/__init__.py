"""The architecture families ``mmp checkpoint`` converts: one module per family, each a table
(``table.Family``: config fields and tensor rows, both directions) per Hugging Face model type,
listed in its ``FAMILIES``; a module may instead refuse architectures with the reason
(``REFUSED``: architecture -> paragraph). The modules are found here by their names, so adding
a family is adding its file."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Dict, Iterator, List, Tuple

from ..errors import ConversionError
from .table import EMBEDDING, OUTPUT, Family, tied

__all__ = ["EMBEDDING", "OUTPUT", "FAMILIES", "REFUSED", "family_of", "family_from_args",
           "supported_architectures", "tied", "to_hf", "to_megatron"]

#: the modules that make the tables, not families
_MACHINERY = frozenset({"common", "fields", "rows", "table"})


def _load() -> Tuple[Tuple[Family, ...], Dict[str, str]]:
    families: List[Family] = []
    refused: Dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in _MACHINERY:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        families += getattr(module, "FAMILIES", ())
        refused.update(getattr(module, "REFUSED", {}))
    return tuple(families), refused


FAMILIES, REFUSED = _load()


def family_of(config: dict) -> Family:
    """The table of a Hugging Face config: its architecture and model type together."""
    names = list(config.get("architectures") or [])
    kind = config.get("model_type")
    for name in names:
        if name in REFUSED:
            raise ConversionError(f"config.json: {REFUSED[name]}")
        types = [f.model_type for f in FAMILIES if f.architecture == name]
        if kind in types:
            return next(f for f in FAMILIES if f.architecture == name and f.model_type == kind)
        if types:
            raise ConversionError(
                f"config.json: architecture {name} with model_type {kind!r} (expected "
                f"{' or '.join(repr(t) for t in types)}); the directory looks edited. Nothing "
                f"was written.")
    raise ConversionError(
        f"config.json: architecture {names or '(none)'} (model_type {kind!r}) is not one this "
        f"conversion maps; it maps {', '.join(supported_architectures())}. Nothing was "
        f"written.")


def supported_architectures() -> List[str]:
    return sorted({f.architecture for f in FAMILIES})


def to_megatron(config: dict, get: Callable) -> Iterator[Tuple[str, object]]:
    """Every tensor of the one-process Megatron model, in order, from ``get(hf_name)``."""
    return family_of(config).to_megatron(config, get)


def to_hf(config: dict, get: Callable) -> Iterator[Tuple[str, object]]:
    """Every tensor of the Hugging Face model, in order, from ``get(megatron_name)``."""
    return family_of(config).to_hf(config, get)


def family_from_args(args) -> Family:
    """The model type whose config the export makes from a checkpoint's args alone."""
    found = [f for f in FAMILIES if f.made_from_args is not None and f.made_from_args(args)]
    if len(found) != 1:
        raise ConversionError(
            f"the checkpoint's args describe {'no' if not found else 'more than one'} model "
            f"type this conversion makes a config for "
            f"({', '.join(f.model_type for f in found) or 'none of them'}). Give the model's "
            f"config with --hf-config.")
    return found[0]
