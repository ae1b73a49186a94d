"""The compiled kernels of ``csrc/`` (CUDA and MUSA), built on first use.

The torch-side ops ask ``available(op, device_type)`` and, when it says yes, call ``get(op)``
(signatures: ``abi.py``). Nothing here imports torch at module import time, ``available`` and
``status`` never raise, and both are cheap after the first call.

Where the extension comes from, in order:

1. an ahead-of-time build installed with the package (``MMP_BUILD_KERNELS=1 pip install .``):
   the module ``megatron_musa_patch._kernels_cuda`` / ``_kernels_musa``;
2. a just-in-time build of ``csrc/`` (``build.py``), cached under ``$TORCH_EXTENSIONS_DIR/mmp/``.

Only for device type ``cuda`` (a CUDA build of torch with a visible GPU, nvcc, ninja) and
``musa`` (torch_musa with a visible device, mcc / MUSA_HOME, ninja); ``toolchain.py`` says why
not elsewhere. ``MEGATRON_MUSA_PATCH_KERNELS=0`` (the ops policy) never loads or builds them.

Modules: ``abi`` (the ops and their calling convention), ``sources`` (files and compiler flags),
``toolchain`` (can they be used here), ``build`` (the JIT build), ``fronts`` (Python fronts).
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, Optional

from .. import policy
from . import build as _build_module
from . import toolchain
from .abi import DEVICE_TYPES, OPS  # noqa: F401 - the public names
from .fronts import FRONTS
from .sources import BINDING_SOURCE, HEADERS, KERNEL_SOURCES, csrc_dir  # noqa: F401

_lock = threading.RLock()
# device type -> ("ok", module) | ("unavailable", reason) | ("failed", reason)
_state: Dict[str, tuple] = {}
_wrapped: Dict[tuple, Callable] = {}


def available(op_name: str, device_type: str) -> bool:
    """True when the compiled extension for ``device_type`` is loaded (building it now if needed)
    and has ``op_name``. Never raises; the reason for False is in ``status(device_type)``."""
    try:
        if op_name not in OPS:
            return False
        entry = _ensure(device_type_name(device_type))
        return entry[0] == "ok" and hasattr(entry[1], op_name)
    except Exception:  # noqa: BLE001 - the contract is "never raises"
        return False


def get(op_name: str, device_type: Optional[str] = None) -> Callable:
    """The op ``op_name`` (signatures in ``abi.py``). ``device_type`` defaults to the device
    type whose extension is loaded (or, when none is, the one this torch can build for).
    Raises KeyError for an unknown op and RuntimeError naming the reason when unavailable."""
    if op_name not in OPS:
        raise KeyError(f"unknown kernel op {op_name!r}; known: {', '.join(OPS)}")
    device_type = _default_device_type() if device_type is None else device_type_name(device_type)
    entry = _ensure(device_type)
    if entry[0] != "ok":
        raise RuntimeError(f"csrc kernel {op_name!r} is unavailable on {device_type}: {entry[1]}")
    key = (device_type, op_name)
    fn = _wrapped.get(key)
    if fn is None:
        fn = _wrapped[key] = FRONTS[op_name](entry[1])
    return fn


def status(device_type: Optional[str] = None) -> str:
    """One line for ``mmp doctor``: loaded, buildable (not built yet) or why not. Builds nothing."""
    try:
        device_type = device_type_name(device_type) if device_type else _default_device_type()
        with _lock:
            entry = _state.get(device_type)
        if entry is not None:
            if entry[0] == "ok":
                origin = getattr(entry[1], "__file__", "?")
                return f"{device_type}: loaded ({origin})"
            return f"{device_type}: {'build failed' if entry[0] == 'failed' else 'unavailable'}: {entry[1]}"
        problem = toolchain.problem(device_type, policy.current().kernels)
        if problem is not None:
            return f"{device_type}: unavailable: {problem}"
        if toolchain.prebuilt_module(device_type) is not None:
            return f"{device_type}: prebuilt extension installed (loaded on first use)"
        return f"{device_type}: not built yet; built on first use into {_build_module.build_root()}"
    except Exception as exc:  # noqa: BLE001
        return f"{device_type}: unknown ({type(exc).__name__}: {exc})"


def reset() -> None:
    """Forget loaded/failed states (tests)."""
    with _lock:
        _state.clear()
        _wrapped.clear()
    toolchain.torch_musa_importable.cache_clear()


def device_type_name(device_type) -> str:
    """'cuda', torch.device('cuda:1') and 'cuda:1' all name the device type 'cuda'."""
    return str(getattr(device_type, "type", device_type)).split(":")[0]


def _ensure(device_type: str) -> tuple:
    with _lock:
        entry = _state.get(device_type)
        if entry is None:
            entry = _load(device_type)
            _state[device_type] = entry
        return entry


def _load(device_type: str) -> tuple:
    problem = toolchain.problem(device_type, policy.current().kernels)
    if problem is not None:
        return ("unavailable", problem)
    module = toolchain.prebuilt_module(device_type)
    if module is not None:
        return ("ok", module)
    try:
        module = _build_module.build(device_type)
    except Exception as exc:  # noqa: BLE001 - reported through status()
        text = str(exc).strip().splitlines()
        tail = " | ".join(line.strip() for line in text[-6:] if line.strip())
        return ("failed", f"{type(exc).__name__}: {tail} "
                          f"(build dir {_build_module.build_dir(device_type)})")
    return ("ok", module)


def _default_device_type() -> str:
    with _lock:
        for dt, entry in _state.items():
            if entry[0] == "ok":
                return dt
    if toolchain.torch_musa_importable():
        return "musa"
    try:
        import torch

        if torch.version.cuda:
            return "cuda"
    except Exception:  # noqa: BLE001
        pass
    return "cpu"
