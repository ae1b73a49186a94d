"""Run an upstream module's own source for a ``module`` record (``core/standins.py``), with
something swapped while it executes: its code is upstream's, only what its body calls at import
differs (triton stand-ins, a lazy ``torch.compile``)."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import ContextManager


def execute_real_source(module: types.ModuleType, during: ContextManager) -> None:
    """Execute the installed source of ``module`` (a module object being created under its
    name) in its namespace, inside ``during``."""
    name = module.__name__
    parent = sys.modules[name.rpartition(".")[0]]
    spec = importlib.machinery.PathFinder.find_spec(name, parent.__path__)
    if spec is None or spec.loader is None:
        raise ImportError(f"{name} is not installed here")
    module.__file__ = spec.origin
    with during:
        exec(spec.loader.get_code(name), module.__dict__)  # noqa: S102 - upstream's own source
