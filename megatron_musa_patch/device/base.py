"""The generic device mapping: one table row per accelerator.

Megatron is written against ``torch.cuda``, the ``"cuda"`` device string and the ``nccl``
backend. A :class:`DeviceMapping` says what those mean on one device: which torch device type, which
module implements the ``torch.cuda`` API, which collective backend. Everything that rewrites
Megatron's view (``features/device/__init__.py``, ``features/device/collectives.py``) reads the row, so the
code CI exercises on the CPU row is the code that runs on the MUSA row.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional

import torch


@dataclasses.dataclass(frozen=True)
class DeviceMapping:
    #: row name, the value of MEGATRON_MUSA_PATCH_DEVICE
    name: str
    #: torch device type that "cuda" means on this row
    torch_type: str
    #: collective backend that "nccl" means on this row
    backend: str
    #: returns the module implementing the torch.cuda API for this device
    load_module: Callable[[], Any]
    #: False only for CUDA itself: nothing to rewrite
    rewrites_cuda: bool = True
    #: page-locked host memory exists (pin_memory=True is honoured)
    pinned_memory: bool = True
    #: name the backend reports that Megatron must see as "nccl" (MUSA: mccl)
    backend_alias: Optional[str] = None
    #: the device's random ops draw from the host generator (CPU): the RNG tracker's
    #: "CPU RNG state changed" check is meaningless there
    rng_shared_with_host: bool = False
    #: environment defaults that only matter to Megatron's validation on this row
    env_defaults: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: default for @jit_fuser: "compile" (torch.compile) or "eager"
    jit_default: str = "compile"
    #: what memory statistics mean on this row (shown by mmp doctor)
    memory_stats: str = "device allocator"
    #: torch.cuda name -> the row module's own name for it (MUSA: CUDAGraph -> MUSAGraph)
    api_aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def module(self) -> Any:
        return self.load_module()

    def jit_mode(self, setting: str) -> str:
        """What ``@jit_fuser`` does here: ``setting`` (MEGATRON_MUSA_PATCH_JIT), auto = the
        row's own default."""
        return self.jit_default if setting == "auto" else setting

    # -------------------------------------------------------- device-string mapping
    def translate(self, device: Any) -> Any:
        """Map a 'cuda' device spec (str, torch.device or int index) to this row's device.

        Anything that does not name CUDA is returned unchanged, so the call is safe on every
        argument that may hold a device.
        """
        if not self.rewrites_cuda or device is None:
            return device
        kind = type(device)
        if kind is str:
            return _translate_str(self.torch_type, device)
        if kind is int:  # a bare index means the current accelerator
            return self._device(device)
        if isinstance(device, _original_device()) and device.type == "cuda":
            return self._device(device.index)
        return device

    def _device(self, index: Optional[int]):
        if self.torch_type == "cpu" or index is None:
            return _original_device()(self.torch_type)
        return _original_device()(self.torch_type, index)

    def backend_for(self, backend: Optional[str]) -> Optional[str]:
        """Map a backend request (``nccl``, ``mccl``, ``cpu:gloo,cuda:nccl`` ...) to this row."""
        if backend is None:
            return None
        text = str(backend)
        if "," in text or ":" in text:
            parts = []
            for part in text.split(","):
                dev, _, name = part.partition(":")
                dev = self.translate(dev.strip())
                name = self.backend_for(name.strip())
                parts.append(f"{dev}:{name}")
            # cpu:gloo,cpu:gloo on the CPU row collapses to one entry
            return ",".join(dict.fromkeys(parts))
        if text.lower() in ("nccl", "mccl"):
            return self.backend
        return text


_CACHE: Dict[tuple, str] = {}


def _translate_str(torch_type: str, device: str) -> str:
    key = (torch_type, device)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    if device == "cuda":
        result = torch_type
    elif device.startswith("cuda:"):
        result = torch_type if torch_type == "cpu" else torch_type + device[4:]
    else:
        result = device
    _CACHE[key] = result
    return result


# torch's own class, not whatever ``torch.device`` is now: torchada (imported before the layer)
# replaces the attribute with a factory of its own
_ORIGINAL_DEVICE = torch._C.device


def _original_device():
    """The real ``torch.device`` type, even after ``torch.device`` itself was patched."""
    return _ORIGINAL_DEVICE


def cuda_tensor_type_name(tensor_type: str, row: DeviceMapping) -> str:
    """'torch.cuda.FloatTensor' -> this row's spelling (CPU: 'torch.FloatTensor')."""
    if not row.rewrites_cuda or not tensor_type.startswith("torch.cuda."):
        return tensor_type
    base = tensor_type[len("torch.cuda."):]
    return f"torch.{base}" if row.torch_type == "cpu" else f"torch.{row.torch_type}.{base}"

