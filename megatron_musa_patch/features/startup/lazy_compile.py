"""``torch.compile`` in a megatron-core module's body compiles at the first call, not at import.

From 0.17 ``import megatron.core`` reaches ``moe/router.py``, whose ``InferenceTopKRouter``
decorates a method with ``@torch.compile`` as the class is defined. ``torch.compile`` compiles
nothing then (it compiles at the first call), but it imports torch's compiler (dynamo and
inductor): seconds in every process that imports megatron-core (docs/benchmarks.md, start-up),
whether or not it ever routes a token for inference. The module's own source runs with
``torch.compile`` replaced, while it executes (the modules it imports first included), by one that hands back a function
which calls ``torch.compile`` with the same arguments at its first call and the compiled
function from then on: what runs, and how it compiles, is upstream's; only the import of the
compiler waits for the first use. The layer's patches of the module's classes apply to it as
to an imported one (``core/standins.py`` runs their post-import hooks).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types

from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.module_source import execute_real_source

FEATURE = feature(
    __name__,
    "torch.compile called by a megatron-core module as it is imported compiles at the first "
    "call: the import does not load torch's compiler (seconds a process from 0.17)",
    aliases=("lazy_compile",))

@hookimpl
def mmp_register_patches(registry):
    registry.extend(
        FEATURE.patches_at(
            "compile_at_import",
            "moe_router",
            "module",
            _router_with_lazy_compile,
            megatron=">=0.17",
            why="@torch.compile on InferenceTopKRouter's routing compiles at its first call; "
            "`import megatron.core` no longer imports torch's compiler (dynamo, inductor)",
        )
    )


def _router_with_lazy_compile(module) -> None:
    import torch

    execute_real_source(module, compile_deferred(torch))


@contextlib.contextmanager
def compile_deferred(torch):
    """``torch.compile`` is ``lazy(torch.compile)`` inside the block."""
    real = torch.compile
    torch.compile = lazy(real)
    try:
        yield
    finally:
        torch.compile = real


def lazy(compile_):
    """``compile_``'s signature (``compile_(fn, **options)`` or ``compile_(**options)(fn)``);
    a function is compiled at its first call, anything else (a module) at once."""

    def deferred(model=None, **options):
        if model is None:
            return lambda fn: deferred(fn, **options)
        if not isinstance(model, types.FunctionType):  # an nn.Module: what compile_ returns
            return compile_(model, **options)
        compiled = []
        lock = threading.Lock()

        @functools.wraps(model)
        def first_call_compiles(*args, **kwargs):
            if not compiled:
                with lock:
                    if not compiled:
                        compiled.append(compile_(model, **options))
            return compiled[0](*args, **kwargs)

        return first_call_compiles

    return deferred
