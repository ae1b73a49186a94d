"""Which device a run takes: ``MEGATRON_MUSA_PATCH_DEVICE=auto|musa|cpu|cuda`` (the settings' ``device``).

The devices are rows of one table (``rows.py``): a :class:`DeviceMapping` says what Megatron's
CUDA spellings mean on one device.
"""

from __future__ import annotations

import importlib

from megatron_musa_patch.base.env_names import DEVICE_ENV
from megatron_musa_patch.base.errors import DeviceSelectionError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.check import torch_musa_mismatch
from .base import DeviceMapping
from .rows import ROWS

ENV = DEVICE_ENV


def builtin_select(requested: str) -> str:
    """The built-in choice; plugins may answer first through ``mmp_select_device``.

    Where torch_musa is installed but cannot serve the installed torch (pip replaced the MUSA
    SDK's torch), ``auto`` and ``musa`` stop with the paragraph: the run would otherwise fall
    back to the CPU without a word. ``cpu`` (and ``auto`` on a machine with a usable CUDA GPU)
    go ahead."""
    if requested in ("auto", "musa"):
        mismatch = torch_musa_mismatch(_torch_version(), _cuda_build_version())
        if mismatch is not None and not (requested == "auto" and _cuda_usable()):
            raise DeviceSelectionError(f"{ENV}={requested}: {mismatch}")
    if requested == "auto":
        if _torch_musa_problem() is None:
            return "musa"
        return "cuda" if _cuda_usable() else "cpu"
    if requested == "musa":
        problem = _torch_musa_problem()
        if problem is not None:
            raise DeviceSelectionError(
                f"{ENV}=musa but {problem}. Install the torch_musa wheel that matches your torch "
                f"(Moore Threads MUSA SDK), check MUSA_VISIBLE_DEVICES, or set {ENV}=cpu (or "
                f"auto) to run without MUSA."
            )
    elif requested == "cuda" and not _cuda_usable():
        raise DeviceSelectionError(
            f"{ENV}=cuda but torch reports no usable CUDA device (torch {_torch_version()}, "
            f"CUDA build: {_cuda_build()}). Install a CUDA build of torch, check "
            f"CUDA_VISIBLE_DEVICES, or set {ENV}=cpu (or auto)."
        )
    return requested


def mapping(name: str) -> DeviceMapping:
    return ROWS[name]


def _torch_musa_problem():
    try:
        importlib.import_module("torch_musa")
    except ImportError as exc:
        return f"torch_musa cannot be imported ({exc})"
    import torch

    musa = getattr(torch, "musa", None)
    if musa is None or not musa.is_available():
        return "torch_musa imported but no MUSA device is visible"
    return None


def _cuda_usable() -> bool:
    import torch

    return bool(torch.version.cuda) and torch.cuda.is_available()


def _torch_version() -> str:
    import torch

    return torch.__version__


def _cuda_build() -> str:
    return _cuda_build_version() or "no"


def _cuda_build_version():
    import torch

    return torch.version.cuda


class BuiltinDeviceChoice:
    """The plugin that answers ``mmp_select_device`` after every other (``trylast``)."""

    @hookimpl(trylast=True)
    def mmp_select_device(self, requested):
        return builtin_select(requested)
