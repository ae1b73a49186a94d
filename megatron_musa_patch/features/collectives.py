"""Collectives: ``nccl`` means the row's backend (``mccl`` on MUSA, ``gloo`` on CPU).

``--distributed-backend`` accepts ``nccl``, ``mccl`` and ``gloo``; process groups are created
on the mapped backend; on MUSA ``get_backend()`` reports ``nccl`` for ``mccl`` groups so
Megatron's backend-string checks pick the device path, as they do on CUDA.

The records wrap torch's own functions in ``torch.distributed.distributed_c10d`` and put the
wrapper in ``torch.distributed``'s place: on the musa row torchada has replaced
``init_process_group`` / ``new_group`` with wrappers that map only the exact ``"nccl"`` and
refuse torch's newer keywords, so the layer's record takes the place of torchada's instead of
stacking on it (``device/torchada_coverage.py``).
"""

from __future__ import annotations

import atexit
import functools

import wrapt

from ..hookspecs import hookimpl
from ..registry import Patch

FEATURE = "collectives"
REQUIRED = True
DESCRIPTION = "nccl mapped to the device's collective backend (mccl on MUSA, gloo on CPU)"

BACKEND_CHOICES = ("nccl", "mccl", "gloo")


@hookimpl
def mmp_register_patches(session, registry, device):
    devices = frozenset({"musa", "cpu"})
    why = f"backend 'nccl' runs on {device.backend}"
    records = [
        Patch("collectives.init_process_group", "torch.distributed:init_process_group", "replace",
              _over_torch("init_process_group", functools.partial(_init_process_group, device)),
              FEATURE, devices=devices, strict=True, why=why),
        Patch("collectives.new_group", "torch.distributed:new_group", "replace",
              _over_torch("new_group", functools.partial(_with_backend, device)), FEATURE,
              devices=devices, strict=True, why=why),
        Patch("collectives.get_backend", "torch.distributed:get_backend", "replace",
              _over_torch("get_backend", functools.partial(_get_backend, device)), FEATURE,
              devices=frozenset({"musa"}), strict=True,
              condition=lambda: bool(device.backend_alias) or "no backend alias",
              why=f"Megatron's 'nccl' checks hold for {device.backend_alias or 'mccl'}"),
    ]
    registry.extend(session.torch_mapping.arbitrate(records))
    registry.add(Patch("collectives.isend_private_copy",
                       "torch.distributed.distributed_c10d:isend", "wrap", _isend_copy,
                       FEATURE, devices=frozenset({"cpu"}), strict=True,
                       rebind=("torch.distributed",),
                       why="gloo reads a send buffer until the send completes; Megatron "
                           "frees pipeline outputs right after isend (stream-ordered on GPUs)"))


def _over_torch(name, wrapper):
    """``wrapper`` around torch's own ``distributed_c10d.<name>``, whoever replaced the
    ``torch.distributed`` attribute since."""
    from torch.distributed import distributed_c10d

    return wrapt.FunctionWrapper(getattr(distributed_c10d, name), wrapper)


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
    result = wrapped(*args, **kwargs)
    if kwargs["backend"] == "gloo":
        atexit.register(_destroy_if_initialized)
    return result


def _destroy_if_initialized():
    """A gloo group left alive at interpreter exit aborts the process ('terminate called
    without an active exception') when a peer has already gone."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _isend_copy(wrapped, instance, args, kwargs):
    """Send a private copy: the returned work owns it until the send is done, whatever the
    caller does to its own tensor (``deallocate_output_tensor`` swaps its storage)."""
    if args:
        args = (args[0].clone(),) + args[1:]
    else:
        kwargs["tensor"] = kwargs["tensor"].clone()
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
