"""Replacements that make torch's CUDA spellings mean the selected device.

Each builder takes the row and the original torch object and returns a plain Python function
(cheap to call, and traceable by torch.compile, unlike a C-level proxy). The fast path of every
replacement checks one argument and calls the original.

Which torch names are replaced, and why, is listed as patch records in
``features/device/__init__.py``; this module only knows how.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Iterable

import torch

from megatron_musa_patch.base.errors import unsupported_stand_in
from . import shapes
from .base import DeviceMapping, _original_device, cuda_tensor_type_name

#: torch functions that take ``device=`` (and sometimes ``pin_memory=``)
FACTORY_FUNCTIONS = (
    "tensor", "as_tensor", "asarray", "empty", "zeros", "ones", "full", "rand", "randn",
    "randint", "randperm", "normal", "arange", "range", "linspace", "logspace", "eye",
    "empty_strided", "empty_permuted", "empty_like", "zeros_like", "ones_like", "full_like",
    "rand_like", "randn_like", "randint_like", "tril_indices", "triu_indices", "from_file",
    "sparse_coo_tensor", "scalar_tensor", "bartlett_window", "hann_window", "hamming_window",
    "blackman_window", "kaiser_window",
)

#: Tensor methods that take ``device=``
TENSOR_DEVICE_METHODS = (
    "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided",
)

#: names of the torch.cuda API Megatron (core + training) uses, mapped through the row's module
CUDA_API = (
    "is_available", "is_initialized", "_lazy_init", "_lazy_call", "device_count",
    "current_device", "set_device", "device", "get_device_name", "get_device_capability",
    "get_device_properties", "is_bf16_supported", "synchronize", "ipc_collect",
    "Stream", "ExternalStream", "Event", "current_stream", "default_stream", "set_stream",
    "stream", "default_generators", "get_rng_state", "get_rng_state_all", "set_rng_state",
    "set_rng_state_all", "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_stats", "memory_summary", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "mem_get_info", "empty_cache", "device_memory_used", "utilization", "temperature",
    "power_draw", "clock_rate", "cudart", "check_error", "CUDAGraph", "graph",
    "graph_pool_handle", "MemPool", "use_mem_pool", "FloatTensor", "DoubleTensor",
    "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ByteTensor", "BoolTensor",
    # 0.17-0.19
    "is_current_stream_capturing", "memory_snapshot", "_sleep",
)

#: submodule functions Megatron calls through their full path
CUDA_SUBMODULE_API = {
    "torch.cuda.random": ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all",
                          "seed", "initial_seed"),
    "torch.cuda.memory": ("MemPool", "use_mem_pool", "memory_stats", "memory_allocated",
                          "max_memory_allocated", "memory_reserved", "empty_cache",
                          "_snapshot", "_record_memory_history", "_dump_snapshot"),
}
NVTX_API = ("range_push", "range_pop", "range", "mark")
#: torch.cuda names Megatron reaches that are right as they are on every row, and why
CUDA_PASS_THROUGH = {
    "OutOfMemoryError": "an exception class: raising and catching it works on every device",
    "amp": "a module: torch.cuda.amp.autocast is torch.amp.autocast('cuda'), which the "
           "device.autocast record maps",
    "nvtx": "a module: its functions are mapped one by one (NVTX_API)",
    "memory": "a module: its functions are mapped one by one (CUDA_SUBMODULE_API)",
    "random": "a module: its functions are mapped one by one (CUDA_SUBMODULE_API)",
}


def device_api(row: DeviceMapping) -> Dict[str, Any]:
    """``torch.cuda`` name -> the row's object: the row module's own, a portable fallback from
    the CPU implementation (nvtx, profiler hooks, telemetry), or a raiser naming the row; each
    in the kind of torch's own object (``shapes.follow``: torch inspects some of them)."""
    module = row.module()
    from . import cpu_api

    portable = {"_lazy_call", "_lazy_init", "cudart", "check_error", "utilization",
                "temperature", "power_draw", "clock_rate", "ipc_collect", "device_memory_used",
                "is_current_stream_capturing", "_sleep"}
    api = {}
    memory = getattr(module, "memory", None)
    for name in CUDA_API + tuple(CUDA_SUBMODULE_API["torch.cuda.memory"]):
        if name in api:
            continue
        value = getattr(module, row.api_aliases.get(name, name), None)
        if value is None and name.startswith("_") and memory is not None:
            value = getattr(memory, name, None)  # private memory-history helpers
        if value is None and name in portable:
            value = getattr(cpu_api, name)
        real = _torch_cuda_object(name)
        if value is None:
            value = _unsupported(row, f"torch.cuda.{name}", real)
        api[name] = shapes.follow(real, value, known_kind(name))
    return api


def known_kind(name: str) -> str:
    """The kind of torch's ``torch.cuda.<name>`` where it cannot be read (torchada's redirect
    has taken ``torch.cuda``'s place); tests/device/test_torch_shapes.py checks these against
    torch's own objects on every torch of the table."""
    if name in CUDA_CLASSES:
        return shapes.CLASS
    if name in CUDA_CONTEXT_MANAGERS:
        return shapes.CONTEXT_MANAGER
    return shapes.MISSING


def _torch_cuda_object(name: str):
    """torch's own ``torch.cuda.<name>`` (or ``torch.cuda.memory.<name>``), read before the
    records replace them."""
    import torch.cuda.memory

    found = getattr(torch.cuda, name, None)
    return found if found is not None else getattr(torch.cuda.memory, name, None)


def nvtx_api(row: DeviceMapping) -> Dict[str, Any]:
    from . import cpu_api

    import torch.cuda.nvtx

    nvtx = getattr(row.module(), "nvtx", None)
    return {name: shapes.follow(getattr(torch.cuda.nvtx, name, None),
                                getattr(nvtx, name, None) or getattr(cpu_api.nvtx, name),
                                shapes.CONTEXT_MANAGER if name == "range" else shapes.MISSING)
            for name in NVTX_API}


#: torch.cuda names that are classes in torch: their stand-ins stay classes (annotations)
CUDA_CLASSES = frozenset({"CUDAGraph", "graph", "MemPool", "Stream", "Event", "ExternalStream",
                          "StreamContext", "device", "device_of", "FloatTensor", "DoubleTensor",
                          "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ByteTensor",
                          "BoolTensor"})
#: torch.cuda names that are context-manager functions in torch (torch 2.14's dynamo reads
#: their __wrapped__)
CUDA_CONTEXT_MANAGERS = frozenset({"use_mem_pool"})


def _unsupported(row: DeviceMapping, what: str, real: Any = None):
    name = what.rpartition(".")[2]
    return unsupported_stand_in(
        name, f"{what} has no counterpart on the {row.name} device (torch.{row.torch_type} "
              f"lacks it); remove the Megatron flag that needs it.",
        as_class=inspect.isclass(real) or name in CUDA_CLASSES)


# ----------------------------------------------------------------------------- factories


def factory(row: DeviceMapping, original: Callable) -> Callable:
    """``torch.empty(..., device='cuda')`` etc. on the row's device."""
    translate = row.translate
    strip_pin = not row.pinned_memory

    @functools.wraps(original)
    def factory_on_device(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = translate(kwargs["device"])
        if strip_pin and kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return original(*args, **kwargs)

    return factory_on_device


def tensor_to(row: DeviceMapping, original: Callable) -> Callable:
    """``Tensor.to('cuda')``, ``.to(0)``, ``.to(torch.device('cuda'))``, ``.to(device=...)``."""
    translate = row.translate
    device_type = _original_device()

    def to(self, *args, **kwargs):
        if args:
            first = args[0]
            if type(first) in (str, int) or isinstance(first, device_type):
                args = (translate(first),) + args[1:]
        if "device" in kwargs:
            kwargs["device"] = translate(kwargs["device"])
        return original(self, *args, **kwargs)

    to.__doc__ = original.__doc__
    return to


def module_to(row: DeviceMapping, original: Callable) -> Callable:
    """``nn.Module.to('cuda')`` and friends."""
    return functools.wraps(original)(tensor_to(row, original))


def tensor_cuda(row: DeviceMapping, original: Callable) -> Callable:
    """``Tensor.cuda(device=None, non_blocking=False, memory_format=...)``."""
    translate = row.translate

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        target = translate("cuda" if device is None else device)
        return self.to(target, non_blocking=non_blocking, memory_format=memory_format)

    cuda.__doc__ = original.__doc__
    return cuda


def module_cuda(row: DeviceMapping, original: Callable) -> Callable:
    translate = row.translate

    @functools.wraps(original)
    def cuda(self, device=None):
        return self.to(translate("cuda" if device is None else device))

    return cuda


def tensor_device_method(row: DeviceMapping, original: Callable) -> Callable:
    """``Tensor.new_empty(..., device='cuda')`` and the other ``new_*``."""
    translate = row.translate
    strip_pin = not row.pinned_memory

    def new_on_device(self, *args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = translate(kwargs["device"])
        if strip_pin and kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return original(self, *args, **kwargs)

    new_on_device.__name__ = getattr(original, "__name__", "new")
    new_on_device.__doc__ = original.__doc__
    return new_on_device


def tensor_type(row: DeviceMapping, original: Callable) -> Callable:
    """``Tensor.type()`` spells device tensors as CUDA ones (Megatron compares against
    'torch.cuda.FloatTensor'); ``Tensor.type('torch.cuda.X')`` converts on the row's device."""
    own_prefix = "torch." if row.torch_type == "cpu" else f"torch.{row.torch_type}."
    torch_type = row.torch_type

    def type_(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs:
            name = original(self)
            if self.device.type == torch_type and name.startswith(own_prefix):
                return "torch.cuda." + name[len(own_prefix):]
            return name
        if isinstance(dtype, str):
            dtype = cuda_tensor_type_name(dtype, row)
        return original(self, dtype, non_blocking, **kwargs)

    type_.__doc__ = original.__doc__
    return type_


def tensor_pin_memory(row: DeviceMapping, original: Callable) -> Callable:
    """Without page-locked memory (CPU row) pinning is a no-op: the data is already host data."""

    def pin_memory(self, *args, **kwargs):
        return self

    pin_memory.__doc__ = original.__doc__
    return pin_memory


def tensor_record_stream(row: DeviceMapping, original: Callable) -> Callable:
    """CPU 'streams' finish their work synchronously: nothing to keep alive."""

    def record_stream(self, stream):
        if isinstance(stream, torch.Stream):
            return original(self, stream)
        return None

    record_stream.__doc__ = original.__doc__
    return record_stream


def is_cuda_property(row: DeviceMapping) -> property:
    """``Tensor.is_cuda`` is True for tensors on the row's accelerator (MUSA)."""
    torch_type = row.torch_type

    def is_cuda(self):
        return self.device.type == torch_type

    return property(is_cuda, doc=f"True for tensors on the {row.name} device")


class _DeviceMeta(type):
    """Keeps ``isinstance(x, torch.device)`` true for real devices after the swap."""

    def __instancecheck__(cls, instance):
        return isinstance(instance, _original_device())

    def __subclasscheck__(cls, subclass):
        return issubclass(subclass, _original_device())


def device_type(row: DeviceMapping):
    """A ``torch.device`` stand-in whose constructor maps 'cuda' to the row's device.

    Instances are real ``torch.device`` objects; only construction is intercepted."""
    original = _original_device()
    translate = row.translate

    class device(metaclass=_DeviceMeta):  # noqa: N801 - mirrors torch.device
        __doc__ = original.__doc__

        def __new__(cls, type=None, index=None):  # noqa: A002 - torch's parameter name
            if isinstance(type, original):
                if index is None:
                    return translate(type)
                type = type.type
            if isinstance(type, str):
                if index is not None and (type == "cuda"):
                    return translate(original(type, index))
                return original(translate(type)) if index is None else original(type, index)
            if isinstance(type, int):
                return translate(type)
            return original(type) if index is None else original(type, index)

    device.__module__ = "torch"
    device.__qualname__ = "device"
    device._mmp_original = original
    return device


class _GeneratorMeta(type):
    """Keeps ``isinstance(x, torch.Generator)`` true for every real generator after the swap
    (``torch.default_generator`` included: C code makes them, not the stand-in)."""

    def __instancecheck__(cls, instance):
        return isinstance(instance, torch._C.Generator)

    def __subclasscheck__(cls, subclass):
        return issubclass(subclass, torch._C.Generator)

    def __getattr__(cls, name):  # class-level reads (an unbound method, say) are torch's
        return getattr(torch._C.Generator, name)


def generator_type(row: DeviceMapping, original: Callable):
    """A ``torch.Generator`` stand-in whose constructor maps 'cuda' and integer devices (Megatron's
    inference sampler asks for ``torch.Generator(device=torch.cuda.current_device())``).

    Instances are real generators made by ``original``; only construction is intercepted."""
    translate = row.translate
    original = getattr(original, "_mmp_original", original)  # a second activation

    class Generator(metaclass=_GeneratorMeta):
        __doc__ = original.__doc__

        def __new__(cls, device=None):
            return original() if device is None else original(device=translate(device))

    Generator.__module__ = "torch"
    Generator.__qualname__ = "Generator"
    Generator._mmp_original = original
    return Generator


def autocast_init(row: DeviceMapping, original: Callable) -> Callable:
    """``torch.autocast(device_type='cuda')`` on the row's device."""
    translate = row.translate

    @functools.wraps(original)
    def __init__(self, device_type, *args, **kwargs):  # noqa: N807
        return original(self, translate(device_type), *args, **kwargs)

    return __init__


def original_tensor_method(name: str):
    """torch's own ``Tensor.<name>``: the C ``TensorBase`` method, unless torch defines it in
    Python. Read there, not from ``torch.Tensor``, because torchada (imported before the layer)
    may have replaced it; a record then takes the place of torchada's instead of wrapping it."""
    own = vars(torch.Tensor).get(name)
    if own is not None and getattr(own, "__module__", "").startswith("torch"):
        return own
    return getattr(torch._C.TensorBase, name)


def names_present(owner: Any, names: Iterable[str]):
    return [n for n in names if hasattr(owner, n)]
