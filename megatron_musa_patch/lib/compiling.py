"""``torch.compile`` with one fallback policy, for ``@jit_fuser`` and the ops.

The function is compiled on its first call. When the *compiler* fails (dynamo, inductor, the C++
toolchain), the function runs eagerly from then on, with one warning naming it. Any other error
(a wrong shape, a user mistake inside the function) is raised unchanged and compilation stays on:
a bad call must not cost every later call its compiled code.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable

logger = logging.getLogger("megatron_musa_patch")

_COMPILER_ERRORS = {"BackendCompilerFailed", "InductorError", "CppCompileError",
                    "TorchDynamoException", "InvalidCxxCompiler"}


def is_compiler_failure(exc: BaseException) -> bool:
    """Whether ``exc`` comes from torch's compiler stack rather than from the function."""
    mro = type(exc).__mro__
    return bool({cls.__name__ for cls in mro} & _COMPILER_ERRORS) or any(
        cls.__module__.startswith(("torch._dynamo", "torch._inductor")) for cls in mro)


def compile_with_fallback(fn: Callable) -> Callable:
    """``fn`` compiled on first call; eager for good after a compiler failure (see above)."""
    state = {}

    @functools.wraps(fn)
    def call(*args, **kwargs):
        impl = state.get("fn")
        if impl is None:
            import torch

            impl = state["fn"] = torch.compile(fn)
        if impl is fn:
            return fn(*args, **kwargs)
        try:
            return impl(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - classified below; others re-raise
            if not is_compiler_failure(exc):
                raise
            logger.warning("megatron_musa_patch: torch.compile failed for %s (%s); running it "
                           "eagerly from now on", getattr(fn, "__qualname__", fn),
                           type(exc).__name__)
            state["fn"] = fn
            return fn(*args, **kwargs)

    return call
