"""Collectives: ``nccl`` means the row's backend (``mccl`` on MUSA, ``gloo`` on CPU).

``--distributed-backend`` accepts ``nccl``, ``mccl`` and ``gloo``; process groups are created
on the mapped backend; on MUSA ``get_backend()`` reports ``nccl`` for ``mccl`` groups so
Megatron's backend-string checks pick the device path, as they do on CUDA.
"""

from __future__ import annotations

import functools

from ..hookspecs import hookimpl
from ..registry import Patch

FEATURE = "collectives"
REQUIRED = True
DESCRIPTION = "nccl mapped to the device's collective backend (mccl on MUSA, gloo on CPU)"

BACKEND_CHOICES = ("nccl", "mccl", "gloo")


@hookimpl
def mmp_register_patches(registry, device):
    if not device.rewrites_cuda:
        return
    devices = frozenset({"musa", "cpu"})
    why = f"backend 'nccl' runs on {device.backend}"
    registry.add(Patch("collectives.init_process_group", "torch.distributed:init_process_group",
                       "wrap", functools.partial(_init_process_group, device), FEATURE,
                       devices=devices, strict=True, why=why))
    registry.add(Patch("collectives.new_group", "torch.distributed:new_group", "wrap",
                       functools.partial(_with_backend, device), FEATURE, devices=devices,
                       strict=True, why=why))
    if device.backend_alias:
        registry.add(Patch("collectives.get_backend", "torch.distributed:get_backend", "wrap",
                           functools.partial(_get_backend, device), FEATURE,
                           devices=frozenset({device.name}), strict=True,
                           why=f"Megatron's 'nccl' checks hold for {device.backend_alias}"))


@hookimpl
def mmp_add_arguments(parser):
    action = parser._option_string_actions.get("--distributed-backend")
    if action is not None:
        action.choices = list(BACKEND_CHOICES)
        action.help = ("Collective backend: nccl (mapped to the device's own: mccl on MUSA, gloo "
                       "on CPU), mccl or gloo.")


def _init_process_group(device, wrapped, instance, args, kwargs):
    if args:
        kwargs["backend"] = args[0]
        args = args[1:]
    kwargs["backend"] = device.backend_for(kwargs.get("backend")) or device.backend
    if kwargs.get("device_id") is not None:
        device_id = device.translate(kwargs["device_id"])
        # binding a process group to a device only exists for accelerator backends
        kwargs["device_id"] = None if device.torch_type == "cpu" else device_id
    return wrapped(*args, **kwargs)


def _with_backend(device, wrapped, instance, args, kwargs):
    if "backend" in kwargs:
        kwargs["backend"] = device.backend_for(kwargs["backend"])
    elif len(args) >= 3:  # new_group(ranks, timeout, backend, ...)
        args = args[:2] + (device.backend_for(args[2]),) + args[3:]
    return wrapped(*args, **kwargs)


def _get_backend(device, wrapped, instance, args, kwargs):
    backend = wrapped(*args, **kwargs)
    return "nccl" if str(backend) == device.backend_alias else backend
