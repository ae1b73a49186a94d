"""Whether the kernels can be used for a device type here: device, torch build, toolchain."""

from __future__ import annotations

import functools
import importlib
import os
import shutil
from typing import Optional

from .abi import DEVICE_TYPES
from .sources import csrc_dir


def problem(device_type: str, enabled: bool) -> Optional[str]:
    """Why the extension cannot be used for ``device_type`` here, or None."""
    if not enabled:
        return "switched off by MEGATRON_MUSA_PATCH_KERNELS=0"
    if device_type not in DEVICE_TYPES:
        return (f"device type {device_type!r} has no compiled kernels (only cuda and musa do; "
                f"the ops use their torch implementations there)")
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return f"torch cannot be imported ({exc})"
    if device_type == "cuda":
        if not torch.version.cuda:
            return f"torch {torch.__version__} is not a CUDA build"
        if not cuda_device_count(torch):
            return "no CUDA device is visible"
    else:
        if not torch_musa_importable():
            return "torch_musa cannot be imported"
        musa = getattr(torch, "musa", None)
        if musa is None or not musa.is_available():
            return "torch_musa is installed but no MUSA device is visible"
    if prebuilt_module(device_type) is not None:
        return None
    return toolchain_problem(device_type)


def cuda_device_count(torch) -> int:
    # the unpatched query: on other device rows the layer may map torch.cuda.* elsewhere
    count = getattr(torch._C, "_cuda_getDeviceCount", None)
    try:
        return int(count()) if count is not None else int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001
        return 0


@functools.lru_cache(maxsize=None)
def torch_musa_importable() -> bool:
    try:
        importlib.import_module("torch_musa")
        return True
    except Exception:  # noqa: BLE001
        return False


def toolchain_problem(device_type: str) -> Optional[str]:
    if csrc_dir() is None:
        return "the csrc/ sources are not installed with this package"
    if shutil.which("ninja") is None:
        try:
            from torch.utils.cpp_extension import is_ninja_available

            if not is_ninja_available():
                return "ninja is not installed (pip install ninja)"
        except Exception:  # noqa: BLE001
            return "ninja is not installed (pip install ninja)"
    if device_type == "cuda":
        from torch.utils.cpp_extension import CUDA_HOME

        nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
        if not nvcc or not os.path.exists(nvcc):
            return "nvcc not found (set CUDA_HOME to the CUDA toolkit)"
        return None
    try:
        ext = importlib.import_module("torch_musa.utils.musa_extension")
    except Exception as exc:  # noqa: BLE001
        return f"torch_musa.utils.musa_extension cannot be imported ({exc})"
    if not hasattr(ext, "load"):
        return "this torch_musa has no musa_extension.load (JIT builds need torch_musa >= 2.x)"
    home = getattr(ext, "MUSA_HOME", None) or os.environ.get("MUSA_HOME") or "/usr/local/musa"
    if not os.path.exists(os.path.join(home, "bin", "mcc")):
        return f"mcc not found under {home} (set MUSA_HOME to the MUSA toolkit)"
    return None


def prebuilt_module(device_type: str):
    try:
        return importlib.import_module(f"megatron_musa_patch._kernels_{device_type}")
    except Exception:  # noqa: BLE001
        return None
