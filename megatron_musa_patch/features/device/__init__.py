"""Device swap: Megatron's CUDA spellings run on the selected device (MUSA or CPU).

Covers the sites where Megatron names CUDA: the ``torch.cuda`` API (device queries, streams, events,
RNG, memory statistics, nvtx), ``device='cuda'`` / ``.cuda()`` / ``torch.device('cuda')`` /
``torch.Generator('cuda')`` / integer device indices, ``Tensor.type()`` strings, ``.is_cuda``
(MUSA), pinned memory, autocast, the RNG tracker, and ``@jit_fuser``. The records are registered
on every device and applied off CUDA only (the CUDA row has nothing to swap; ``@jit_fuser``
follows ``MEGATRON_MUSA_PATCH_JIT`` there too).

On the musa row torchada maps torch (``device/adapter.py``): the session's ``torch_mapping``
skips each torch-level record whose name torchada covers and keeps the rest, with the gap as the
reason. Tensor methods are built over torch's own ``TensorBase`` methods, so a record that takes
the place of torchada's (``Tensor.cuda``) never stacks on it.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from megatron_musa_patch.lib.compiling import compile_with_fallback
from megatron_musa_patch.device import torch_api
from megatron_musa_patch.device.rows import CPU, MUSA, OFF_CUDA
from megatron_musa_patch.base.errors import TorchMappingError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.records import VERIFIED
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "torch.cuda, 'cuda' devices and Tensor CUDA spellings mapped to the selected device",
    required=True)


logger = logging.getLogger("megatron_musa_patch")


@hookimpl
def mmp_register_patches(session, registry, device):
    mapping = session.torch_mapping
    registry.extend(mapping.arbitrate(_torch_cuda_patches(device)))
    registry.extend(mapping.arbitrate(_device_string_patches(device)))
    registry.extend(_megatron_patches(device))
    registry.extend(_host_rng_patches(device))
    registry.extend(_jit_patches(device, session.settings.jit))
    registry.add(FEATURE.patch(
        "torchada_guard", "torchada:*", "module", _refuse_torchada, strict=True,
        condition=mapping.guard_condition(), torch=VERIFIED,
        why="the layer maps torch here: a later `import torchada` would patch the same names "
            "again"))


def _refuse_torchada(module):
    raise TorchMappingError(
        "`import torchada` after megatron_musa_patch, which maps torch itself on this row "
        "(MEGATRON_MUSA_PATCH_TORCHADA=0, or a cpu/cuda row on a machine with torch_musa): the "
        "same torch names would be patched twice. Remove the import, or let torchada map torch: "
        "unset MEGATRON_MUSA_PATCH_TORCHADA on the musa row (the layer then imports it first).")


def _strict(part, target, kind, impl, why, devices=OFF_CUDA, **kw):
    return FEATURE.patch(part, target, kind, impl, devices=frozenset(devices), strict=True,
                         why=why, torch=VERIFIED, **kw)


def _torch_cuda_patches(device):
    api = torch_api.device_api(device)
    why = f"torch.cuda.* answers for the {device.name} device"
    for name in torch_api.CUDA_API:
        yield _strict(f"torch_cuda.{name}", f"torch.cuda:{name}", "attribute", api[name],
                      why, create=True)
    for module, names in torch_api.CUDA_SUBMODULE_API.items():
        for name in names:
            yield _strict(f"{module[6:]}.{name}", f"{module}:{name}", "attribute",
                          api[name], why, create=True)
    for name, value in torch_api.nvtx_api(device).items():
        yield _strict(f"cuda.nvtx.{name}", f"torch.cuda.nvtx:{name}", "attribute", value,
                      "nvtx ranges are no-ops unless the device has its own", create=True)


def _device_string_patches(device):
    why = f"'cuda' / integer device arguments mean {device.torch_type}"
    for name in torch_api.names_present(torch, torch_api.FACTORY_FUNCTIONS):
        yield _strict(f"factory.{name}", f"torch:{name}", "replace",
                      torch_api.factory(device, getattr(torch, name)), why)
    tensor = torch_api.original_tensor_method
    for name in torch_api.names_present(torch.Tensor, torch_api.TENSOR_DEVICE_METHODS):
        yield _strict(f"tensor.{name}", f"torch:Tensor.{name}", "replace",
                      torch_api.tensor_device_method(device, tensor(name)), why)
    yield _strict("tensor.to", "torch:Tensor.to", "replace",
                  torch_api.tensor_to(device, tensor("to")), why)
    yield _strict("tensor.cuda", "torch:Tensor.cuda", "replace",
                  torch_api.tensor_cuda(device, torch_api.original_tensor_method("cuda")), why)
    yield _strict("module.to", "torch.nn:Module.to", "replace",
                  torch_api.module_to(device, torch.nn.Module.to), why)
    yield _strict("module.cuda", "torch.nn:Module.cuda", "replace",
                  torch_api.module_cuda(device, torch.nn.Module.cuda), why)
    yield _strict("torch_device", "torch:device", "attribute",
                  torch_api.device_type(device), "torch.device('cuda') constructs the row's device")
    yield _strict("torch_generator", "torch:Generator", "attribute",
                  torch_api.generator_type(device, torch.Generator),
                  "torch.Generator(device='cuda' or an index) makes the row's generator")
    yield _strict("tensor.type", "torch:Tensor.type", "replace",
                  torch_api.tensor_type(device, tensor("type")),
                  "Megatron compares Tensor.type() with 'torch.cuda.FloatTensor' strings")
    yield _strict("autocast", "torch.amp.autocast_mode:autocast.__init__", "replace",
                  torch_api.autocast_init(device, torch.amp.autocast_mode.autocast.__init__),
                  why)
    yield _strict("tensor.is_cuda", "torch:Tensor.is_cuda", "attribute",
                  torch_api.is_cuda_property(device),
                  "Megatron's .is_cuda gates mean 'on the accelerator'", devices=frozenset({MUSA.name}))
    yield _strict("tensor.pin_memory", "torch:Tensor.pin_memory", "replace",
                  torch_api.tensor_pin_memory(device, tensor("pin_memory")),
                  "no page-locked memory without an accelerator: host data is already host data",
                  devices=frozenset({CPU.name}))
    yield _strict("dataloader_pin_memory", "torch.utils.data:DataLoader.__init__", "wrap",
                  _dataloader_without_pinning,
                  "no page-locked memory without an accelerator (avoids a warning per rank)",
                  devices=frozenset({CPU.name}))
    yield _strict("tensor.record_stream", "torch:Tensor.record_stream", "replace",
                  torch_api.tensor_record_stream(device, tensor("record_stream")),
                  "CPU streams complete synchronously: nothing to keep alive", devices=frozenset({CPU.name}))
    # a CUDA build of torch (what pip gives on Python 3.12) names CUDA as its accelerator even
    # without a GPU; with torch.cuda answering for the CPU, torch's own code (the optimizers'
    # graph-capture check) would then call into CUDA: here there is no accelerator, as with a
    # CPU build of torch
    for name, value in (("current_accelerator", _no_accelerator), ("is_available", _false)):
        yield _strict(f"accelerator.{name}", f"torch.accelerator:{name}", "replace", value,
                      "the CPU row has no accelerator, whatever torch was built for",
                      devices=frozenset({CPU.name}), condition=lambda: _torch_names_an_accelerator())


def _no_accelerator(check_available: bool = False):
    return None


def _false(*args, **kwargs):
    return False


def _torch_names_an_accelerator():
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return "this torch has no torch.accelerator"
    return True if torch._C._accelerator_getAccelerator() is not None else \
        "this torch build names no accelerator"


def _dataloader_without_pinning(wrapped, instance, args, kwargs):
    kwargs["pin_memory"] = False
    return wrapped(*args, **kwargs)


def _megatron_patches(device):
    yield FEATURE.patch(
        "moe_move_to_cpu_numpy", "megatron.core.transformer.moe.moe_utils:"
        "maybe_move_tensor_to_cpu", "wrap", _host_tensor_as_numpy,
        devices=frozenset({CPU.name}), strict=True, torch=VERIFIED,
        why="its .is_cuda gate skips the numpy conversion for tensors already on the host")
    yield FEATURE.patch(
        "inference_broadcast_on_host",
        "megatron.core.inference.communication_utils:_is_cuda",
        "replace",
        _on_the_host,
        devices=frozenset({CPU.name}),
        strict=True,
        torch=VERIFIED,
        why="inference with pipeline parallelism asserts .is_cuda before broadcasting the "
        "logits and tokens between stages; on the CPU row they are host tensors",
    )
    yield FEATURE.patch(
        "rng_tracker_fork", "megatron.core.tensor_parallel.random:"
        "CudaRNGStatesTracker.fork", "wrap", _fork_without_false_warning,
        devices=OFF_CUDA, torch=VERIFIED,
        condition=lambda: device.rng_shared_with_host or
        f"the {device.name} generator is not the host's",
        why="device RNG is the host RNG here: the 'CPU RNG state changed' check cannot hold",
    )


def _on_the_host(tensor):
    """Upstream's check before an inference broadcast between pipeline stages, for the CPU row:
    the tensor exists and is on the row's device."""
    assert tensor is not None
    assert tensor.device.type == "cpu", tensor.device


def _host_tensor_as_numpy(wrapped, instance, args, kwargs):
    """The alltoall dispatcher asks for split sizes as numpy; on the CPU device they are host
    tensors already, which upstream's ``.is_cuda`` gate returns unconverted."""
    result = wrapped(*args, **kwargs)
    as_numpy = kwargs.get("as_numpy", args[1] if len(args) > 1 else False)
    return result.numpy() if as_numpy and torch.is_tensor(result) else result


# ----------------------------------------------------------------------------- RNG tracker

_RNG_WARNING = "CPU RNG state changed within GPU RNG context"


class _DropRngWarning(logging.Filter):
    def filter(self, record):
        return record.getMessage() != _RNG_WARNING


_RNG_FILTER = _DropRngWarning()


def _fork_without_false_warning(wrapped, instance, args, kwargs):
    """The tracker checks that the host RNG is untouched while the device RNG is forked; on the
    CPU row they are one generator (dropout must draw from the forked state), so that check is
    always false there. Drop exactly that record, only while the fork runs."""
    inner = wrapped(*args, **kwargs)
    rng_logger = logging.getLogger("megatron.core.tensor_parallel.random")

    @contextlib.contextmanager
    def fork():
        rng_logger.addFilter(_RNG_FILTER)
        try:
            with inner as value:
                yield value
        finally:
            rng_logger.removeFilter(_RNG_FILTER)

    return fork()


# ----------------------------------------------------------------------------- host RNG
# Where the device generator is the host's (the CPU row), the row keeps a second stream for the
# host generator of a GPU machine (cpu_api.host_rng): seeded by torch.manual_seed / torch.seed,
# not by torch.cuda.manual_seed, and drawn from by Megatron's host-side initialisation. Dropout
# and everything inside the tracker's fork() still draw from the device generator, unchanged.


def _host_rng_patches(device):
    def shared():
        return device.rng_shared_with_host or f"the {device.name} generator is not the host's"

    def record(part, target, impl, why):
        return FEATURE.patch(part, target, "wrap", impl, devices=frozenset({CPU.name}),
                             strict=True, condition=shared, why=why, torch=VERIFIED)

    seeds = "torch.manual_seed seeds the host generator as on a GPU machine"
    for module in ("torch", "torch.random"):
        yield record(f"host_rng.{module}.manual_seed", f"{module}:manual_seed",
                     _seeding_host(device, lambda result, args, kwargs: _seed_argument(args,
                                                                                       kwargs)),
                     seeds)
        yield record(f"host_rng.{module}.seed", f"{module}:seed",
                     _seeding_host(device, lambda result, args, kwargs: result), seeds)
    yield record(
        "host_rng.cpu_initialization",
        "megatron.core.tensor_parallel.layers:_initialize_affine_weight_cpu",
        lambda wrapped, instance, args, kwargs: _on_host_rng(device, wrapped, args, kwargs),
        "use_cpu_initialization draws from the host generator, whatever the device seed")


def _seed_argument(args, kwargs):
    return args[0] if args else kwargs["seed"]


def _seeding_host(device, seed_of):
    def seeding(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        device.module().seed_host(seed_of(result, args, kwargs))
        return result

    return seeding


def _on_host_rng(device, wrapped, args, kwargs):
    with device.module().host_rng():
        return wrapped(*args, **kwargs)


# ----------------------------------------------------------------------------- @jit_fuser


def _jit_patches(device, setting: str):
    mode = device.jit_mode(setting)
    upstream = mode == "compile" and not device.rewrites_cuda

    def needed():
        return True if not upstream else "upstream's own torch.compile on CUDA"

    yield FEATURE.patch(
        "jit_fuser", "megatron.core.jit:jit_fuser", "attribute",
        _eager if mode == "eager" else compile_with_fallback, condition=needed, torch=VERIFIED,
        why=f"@jit_fuser = {mode} on {device.name} (MEGATRON_MUSA_PATCH_JIT=auto|compile|eager)",
    )


def _eager(func):
    return func
