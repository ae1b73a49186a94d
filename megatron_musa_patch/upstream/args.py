"""The Megatron args a wrapped upstream function itself reads."""

from __future__ import annotations

import sys
from typing import Any


def args_read_by(module_name: str) -> Any:
    """The args ``module_name``'s code reads: that module's own ``get_args``, which upstream's
    tests patch there with a mock holding only what the module needs (the global args are then
    unset), else megatron.training's global ones."""
    get_args = getattr(sys.modules.get(module_name), "get_args", None)
    if get_args is None:
        from megatron.training.global_vars import get_args
    return get_args()
