"""Which parameters have their optimizer step on the host.

Upstream's ``HybridDeviceOptimizer`` decides with ``Tensor.is_cuda`` and copies with
``.cpu().pin_memory()``: on MUSA ``is_cuda`` is False for device tensors unless the device layer
rewrites it, and on the CPU row it is False for everything, so nothing is offloaded and the
host-side bookkeeping then fails. Here the device row decides: a tensor is on the accelerator
when its device type is the row's (on the CPU row: every model parameter), and each offloaded
parameter gets its own host tensor, separate from the model's memory on every row, so the host
optimizer really steps on a copy and the result is copied back, as on a GPU.

``split`` returns the five structures ``HybridDeviceOptimizer`` keeps (same meaning as in
megatron-core 0.16.1), so the rest of the upstream class works unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List

import torch


@dataclasses.dataclass
class Split:
    #: param groups stepped by the host optimizer(s): the host tensors
    host_groups: List[dict]
    #: param groups stepped on the device: model shards, or their fp32 masters
    device_groups: List[dict]
    #: model shard -> the host tensor stepped for it
    host_copy: Dict[torch.Tensor, torch.Tensor]
    #: host tensor -> its model shard
    host_owner: Dict[torch.Tensor, torch.Tensor]
    #: model shard that is not fp32 -> the fp32 tensor stepped for it (host or device)
    fp32_master: Dict[torch.Tensor, torch.Tensor]

    def as_upstream(self):
        """The tuple ``HybridDeviceOptimizer._get_sub_optimizer_param_groups`` returns."""
        return (self.host_groups, self.device_groups, self.host_copy, self.host_owner,
                self.fp32_master)


def split(param_groups: List[dict], fraction: float, *, on_device: Callable[[torch.Tensor], bool],
          to_host: Callable[[torch.Tensor, torch.dtype], torch.Tensor],
          fp32_masters: bool) -> Split:
    """Offload parameters in order until ``fraction`` of the device-resident elements are on
    the host (upstream's rule: the parameter that crosses the line goes too).

    ``to_host(tensor, dtype)`` returns a new host tensor holding ``tensor`` in ``dtype``. With
    ``fp32_masters`` every parameter that is not fp32 is stepped on an fp32 copy (upstream's
    ``param_update_in_fp32``); an offloaded one gets that copy on the host directly.
    """
    params = [p for group in param_groups for p in group["params"]]
    budget = fraction * sum(p.numel() for p in params if on_device(p))
    moved = 0
    result = Split([], [], {}, {}, {})
    for group in param_groups:
        host_params, device_params = [], []
        for param in group["params"]:
            offload = moved < budget and on_device(param)
            wants_fp32 = fp32_masters and param.dtype != torch.float32
            if offload:
                moved += param.numel()
                stepped = to_host(param, torch.float32 if wants_fp32 else param.dtype)
                result.host_copy[param] = stepped
                result.host_owner[stepped] = param
                host_params.append(stepped)
            else:
                stepped = param.detach().float() if wants_fp32 else param
                device_params.append(stepped)
            if wants_fp32:
                result.fp32_master[param] = stepped
        for target, chosen in ((result.host_groups, host_params),
                               (result.device_groups, device_params)):
            if chosen:
                target.append({**group, "params": chosen})
    return result


def host_tensor_maker(pin: bool) -> Callable[[torch.Tensor, torch.dtype], torch.Tensor]:
    """``to_host`` for ``split``: a fresh host tensor (page-locked when ``pin``) with the
    tensor's value. Always a new allocation, also when the tensor is already in host memory
    (the CPU row), so the host optimizer never steps on the model's own storage."""

    def to_host(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        host = torch.empty(tensor.shape, dtype=dtype, device="cpu", pin_memory=pin)
        host.copy_(tensor.detach())
        return host

    return to_host


def on_device_of(torch_type: str) -> Callable[[torch.Tensor], bool]:
    """``on_device`` for ``split``: the tensor lives on the row's accelerator."""

    def on_device(tensor: torch.Tensor) -> bool:
        return tensor.device.type == torch_type

    return on_device
