"""What is installed, asked one way.

Patch conditions follow the registry's convention: ``True`` to apply, a string saying why not
to skip. ``missing("transformer_engine")`` is ``True`` when TE is not installed and
``"transformer_engine is installed"`` when it is, so the skip reason in ``mmp doctor`` names what
made the patch unnecessary.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Union

TE = "transformer_engine"


def importable(name: str) -> bool:
    """Whether ``import name`` would find a module (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or no __spec__
        return False


def missing(name: str, reason: str = "") -> Union[bool, str]:
    """Condition: ``True`` when ``name`` is not installed, else why the patch is not needed."""
    return True if not importable(name) else (reason or f"{name} is installed")


@functools.lru_cache(maxsize=None)
def te_installed() -> bool:
    """TransformerEngine is installed (its Python package; whether it loads is TE's business)."""
    return importable(TE)


def te_missing() -> Union[bool, str]:
    return True if not te_installed() else "TransformerEngine is installed"
