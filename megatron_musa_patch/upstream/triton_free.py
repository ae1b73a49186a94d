"""Import one upstream module that imports triton at its top, on a machine without triton.

Some megatron-core modules define triton kernels for an optional feature and import triton
unconditionally (from 0.18 the MoE paged stash's, reached from ``import megatron.core``). The
module's real source is executed with stand-ins for ``triton`` and ``triton.language`` visible to
it alone: its Python code is upstream's, its ``@triton.jit`` kernels become objects that raise a
clear error when launched, and ``import triton`` elsewhere still fails as it should.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Callable

from megatron_musa_patch.base.errors import UnsupportedOnDeviceError

from .module_source import execute_real_source


class _Kernel:
    """What ``@triton.jit`` gives here: a kernel that cannot be launched."""

    def __init__(self, fn: Callable, why: str):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.why = why

    def _refuse(self, *args, **kwargs):
        raise UnsupportedOnDeviceError(
            f"{self.why} runs the triton kernel {self.__name__}, and triton is not installed "
            f"here. Install triton for your device, or switch the feature off.")

    def __getitem__(self, grid):
        return self._refuse

    __call__ = _refuse


class _Anything:
    """``tl.constexpr``, ``tl.int64``, ...: names used in kernel signatures, never computed."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self


def _stubs(why: str):
    triton = types.ModuleType("triton")
    language = types.ModuleType("triton.language")
    language.__getattr__ = lambda name: _Anything()

    def jit(fn=None, **options):
        if fn is None:
            return lambda f: _Kernel(f, why)
        return _Kernel(fn, why)

    triton.jit = jit
    triton.language = language
    triton.cdiv = lambda a, b: -(-a // b)
    triton.next_power_of_2 = lambda n: 1 << (int(n) - 1).bit_length()
    triton.__mmp_stand_in__ = True
    return {"triton": triton, "triton.language": language}


def execute_without_triton(module: types.ModuleType, why: str) -> None:
    """Run the real source of ``module`` (a module object being created under its name) with
    triton stand-ins; ``why`` names the upstream feature that would launch the kernels."""
    execute_real_source(module, _visible(_stubs(why)))


@contextlib.contextmanager
def _visible(stubs: dict):
    """The stand-ins in ``sys.modules`` while the module's source runs, then what was there."""
    saved = {key: sys.modules.get(key) for key in stubs}
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
