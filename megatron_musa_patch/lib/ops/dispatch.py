"""Which implementation an op uses on a device: compiled kernels (``ops.kernels``, csrc/) on
GPUs when they report the op available, otherwise the torch implementation the op module chose
for that device type by measurement. The kernels' calling convention is ``kernels/abi.py``; the
process-wide choices (``MEGATRON_MUSA_PATCH_OPS``, ``_KERNELS``) are ``policy.py``.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

from .. import compiling
from . import kernels as _kernels
from . import policy
from .policy import Policy, configure  # noqa: F401 - activation configures the ops here


#: Element counts below which the CPU runs the op unfused, as upstream's --no-* path does: a
#: compiled call costs ~40 us of guards and launch, more than it saves on a small tensor.
#: Measured crossovers (fwd+bwd, 1 thread, fp32 / bf16; ``benchmarks/bench_ops.py --tokens``):
#: RMSNorm 2^14 / 2^13, SwiGLU input 2^19 / 2^18, RoPE 2^17 / 2^15, causal softmax (bf16 only)
#: 2^17 (a tie at 2^16). One limit per op: the larger of its two.
CPU_MIN_NUMEL = {"rms_norm": 1 << 14, "swiglu": 1 << 19, "rope": 1 << 17, "softmax": 1 << 17}


def forced() -> Optional[str]:
    """The implementation MEGATRON_MUSA_PATCH_OPS forces on every op (eager | compile |
    native), or None (auto: kernels, the size cut-off and the measured choices)."""
    return policy.current().forced


def too_small(op_name: str, device_type: str, numel: Optional[int]) -> bool:
    """Whether ``numel`` elements are below the size where ``op_name``'s compiled CPU
    implementation beats the unfused one (``numel=None``: the size is unknown, no)."""
    return device_type == "cpu" and numel is not None and numel < CPU_MIN_NUMEL.get(op_name, 0)


def choose(op_name: str, device_type: str, numel: Optional[int], *, measured: dict,
           default: str, unfused: str, kernels: tuple = (), forced_as=None) -> str:
    """The implementation an op uses, in order: the one MEGATRON_MUSA_PATCH_OPS forces (mapped
    by ``forced_as`` to a name the op has), ``kernel`` when every op in ``kernels`` is compiled
    for the device, ``unfused`` below the CPU size cut-off, else the device's ``measured``
    choice (``default`` for device types it does not list)."""
    choice = forced()
    if choice:
        return forced_as(choice) if forced_as else choice
    if kernels and all(kernel(name, device_type) for name in kernels):
        return "kernel"
    if too_small(op_name, device_type, numel):
        return unfused
    return measured.get(device_type, default)


def compile_or_eager(choice: str) -> str:
    """MEGATRON_MUSA_PATCH_OPS for ops without a ``native`` implementation."""
    return "compile" if choice == "compile" else "eager"


def kernel(op_name: str, device_type: str) -> Optional[Callable]:
    """The compiled kernel for ``op_name`` on ``device_type``, or None (use torch)."""
    current = policy.current()
    if device_type == "cpu" or current.forced is not None or not current.kernels:
        return None
    return _cached_kernel(op_name, device_type)


@functools.lru_cache(maxsize=None)
def _cached_kernel(op_name: str, device_type: str) -> Optional[Callable]:
    try:
        if not _kernels.available(op_name, device_type):
            return None
        return _kernels.get(op_name)
    except Exception:  # noqa: BLE001 - a broken build falls back to torch, never crashes
        return None


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn)`` made lazily on first call, with the layer's one fallback policy
    (``compiling``). Shapes: torch's default -- static first, dynamic after a second shape
    (static kernels ran faster than ``dynamic=True`` ones on CPU: docs/benchmarks.md)."""
    return compiling.compile_with_fallback(fn)
