"""The ``torch.cuda`` API implemented for the CPU, so Megatron can treat the CPU as its device.

Semantics chosen so Megatron's code paths stay correct, not merely silent:

* Devices: one virtual device per local rank (``LOCAL_WORLD_SIZE``); ``set_device`` records the
  index, every index means the same CPU.
* Streams and events: CPU kernels run synchronously on the calling thread, so every stream is
  already synchronised with every other; events record wall-clock time so ``elapsed_time``
  measures real work.
* RNG: the device generator *is* ``torch.default_generator`` (CPU kernels such as dropout draw
  from it), so Megatron's RNG tracker drives the model's randomness exactly as on a GPU. Beside
  it a *host generator* stands for the CPU generator of a GPU machine: ``torch.manual_seed``
  seeds both, ``torch.cuda.manual_seed`` only the device's, and Megatron's host-side
  initialisation (``use_cpu_initialization``) draws from it (:func:`host_rng`).
* Memory statistics: the CPU allocator keeps none, so these report the process's resident set
  (``memory_stats()['mmp.source'] == 'process_rss'``), clearly not allocator numbers.
* CUDA graphs and memory pools do not exist here and raise a clear error.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from types import SimpleNamespace
from typing import Any, Optional

import torch

from megatron_musa_patch.base.errors import unsupported_stand_in

# index None: the local rank, read when asked (a launcher that forks its ranks from one
# process sets LOCAL_RANK after the layer is imported)
_state = SimpleNamespace(index=None, initial_seed=None)

# ---------------------------------------------------------------------------- device queries


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    return None


def _lazy_call(callable_, **_kwargs) -> None:
    callable_()


def device_count() -> int:
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))


def current_device() -> int:
    if _state.index is None:
        return int(os.environ.get("LOCAL_RANK", "0") or 0)
    return _state.index


def set_device(device: Any) -> None:
    if isinstance(device, torch.device):
        device = device.index or 0
    elif isinstance(device, str):
        device = int(device.rpartition(":")[2]) if ":" in device else 0
    _state.index = int(device) if device is not None and int(device) >= 0 else 0


class device:  # noqa: N801 - mirrors torch.cuda.device
    """Context manager selecting a device index; all indices are the same CPU."""

    def __init__(self, device: Any):
        self.device = device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def get_device_name(device: Any = None) -> str:
    return _cpu_name()


def get_device_capability(device: Any = None):
    return (0, 0)


def get_device_properties(device: Any = None):
    total = _total_memory()
    return SimpleNamespace(
        name=_cpu_name(),
        major=0,
        minor=0,
        total_memory=total,
        multi_processor_count=os.cpu_count() or 1,
        is_integrated=True,
        uuid="cpu",
        L2_cache_size=0,
        gcnArchName="cpu",
    )


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def synchronize(device: Any = None) -> None:
    return None


def is_current_stream_capturing() -> bool:
    return False  # no CUDA graphs on a CPU


def _sleep(cycles: int) -> None:
    return None  # a GPU spin used to order streams; CPU streams are already in order


def ipc_collect() -> None:
    return None


# ---------------------------------------------------------------------------- streams & events


class Stream:
    """A CPU 'stream': work submitted on it has finished when the call returns."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        self = object.__new__(cls)
        self.device = torch.device("cpu")
        self.priority = priority
        return self

    def wait_event(self, event: "Event") -> None:
        return None

    def wait_stream(self, stream: "Stream") -> None:
        return None

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    @property
    def cuda_stream(self) -> int:
        return 0

    def __repr__(self):
        return f"<megatron_musa_patch cpu Stream priority={self.priority}>"


class ExternalStream(Stream):
    def __new__(cls, stream_ptr: int = 0, device: Any = None, **kwargs):
        return super().__new__(cls, device)


_DEFAULT_STREAM = Stream()
_current = SimpleNamespace(stream=_DEFAULT_STREAM)


def current_stream(device: Any = None) -> Stream:
    return _current.stream


def default_stream(device: Any = None) -> Stream:
    return _DEFAULT_STREAM


def set_stream(stream_: Stream) -> None:
    _current.stream = stream_ if stream_ is not None else _DEFAULT_STREAM


class StreamContext:
    """``torch.cuda.stream(s)``: an object, not a generator, so that one context can be entered
    again after it exits, as torch's own is (Megatron's grad sync enters one twice)."""

    def __init__(self, stream_: Optional[Stream]):
        self.stream = stream_
        self.previous = None

    def __enter__(self):
        self.previous = _current.stream
        if self.stream is not None:
            _current.stream = self.stream

    def __exit__(self, *exc_info):
        _current.stream = self.previous


def stream(stream_: Optional[Stream]) -> StreamContext:
    return StreamContext(stream_)


class Event:
    """Records when it was reached; ``elapsed_time`` is in milliseconds like CUDA's."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False, **kwargs):
        self.enable_timing = enable_timing
        self._time: Optional[float] = None

    def record(self, stream: Optional[Stream] = None) -> None:
        self._time = time.perf_counter()

    def wait(self, stream: Optional[Stream] = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: "Event") -> float:
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0


# ---------------------------------------------------------------------------- RNG
# The device generator is the host generator: CPU kernels draw from it.


def _generator(device: Any = None) -> torch.Generator:
    return torch.default_generator


default_generators = tuple(torch.default_generator for _ in range(device_count()))


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.default_generator.get_state()


def get_rng_state_all():
    return [get_rng_state()]


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    torch.default_generator.set_state(new_state)


def set_rng_state_all(new_states) -> None:
    for state in new_states:
        set_rng_state(state)


def manual_seed(seed: int) -> None:
    _state.initial_seed = int(seed)
    torch.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    _state.initial_seed = torch.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    return _state.initial_seed if _state.initial_seed is not None else torch.initial_seed()


# On a GPU machine the host and the device generators are two streams: torch.manual_seed(42)
# seeds both, torch.cuda.manual_seed(41) (model_parallel_cuda_manual_seed) only the device's, and
# Megatron's CPU initialisation keeps drawing from the host's 42 -- which is what makes TP1 and
# TP4 master weights equal whatever the device seed. Here every kernel draws from
# torch.default_generator, the device generator above, so the host stream is kept aside and
# swapped in only around the host-side draws Megatron names as such. torch.Generator() starts
# from the same default seed as torch.default_generator.
_host = torch.Generator()


def seed_host(seed: int) -> None:
    """What torch.manual_seed / torch.seed also do to the CPU generator of a GPU machine."""
    _host.manual_seed(int(seed))


@contextlib.contextmanager
def host_rng():
    """Draws inside come from the host generator and advance it; the device generator is left
    exactly where it was."""
    device_state = torch.default_generator.get_state()
    torch.default_generator.set_state(_host.get_state())
    try:
        yield
    finally:
        _host.set_state(torch.default_generator.get_state())
        torch.default_generator.set_state(device_state)


# ---------------------------------------------------------------------------- memory statistics
# Process resident set size, not allocator numbers (the CPU allocator keeps none).

_peak = SimpleNamespace(rss=0)


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return usage if sys.platform == "darwin" else usage * 1024


def _peak_rss() -> int:
    _peak.rss = max(_peak.rss, _rss())
    return _peak.rss


def memory_allocated(device: Any = None) -> int:
    return _rss()


def max_memory_allocated(device: Any = None) -> int:
    return _peak_rss()


memory_reserved = memory_allocated
max_memory_reserved = max_memory_allocated


def device_memory_used(device: Any = None) -> int:
    return _rss()


def reset_peak_memory_stats(device: Any = None) -> None:
    _peak.rss = _rss()


reset_max_memory_allocated = reset_peak_memory_stats


def memory_stats(device: Any = None) -> dict:
    current, peak = _rss(), _peak_rss()
    return {
        "mmp.source": "process_rss",
        "allocated_bytes.all.current": current,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": current,
        "reserved_bytes.all.peak": peak,
        "active_bytes.all.current": current,
        "active_bytes.all.peak": peak,
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    stats = memory_stats()
    return (
        "CPU device (process resident set, not allocator statistics): "
        f"current {stats['allocated_bytes.all.current'] / 2**20:.1f} MiB, "
        f"peak {stats['allocated_bytes.all.peak'] / 2**20:.1f} MiB"
    )


def mem_get_info(device: Any = None):
    total = _total_memory()
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        free = total - _rss()
    return free, total


def empty_cache() -> None:
    return None


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "CPU " + (platform.processor() or platform.machine())


# ---------------------------------------------------------------------------- telemetry
# Megatron logs these on GPUs; a CPU has no such counters. None is returned, not made-up zeros.


def utilization(device: Any = None):
    return None


temperature = power_draw = clock_rate = utilization


# ---------------------------------------------------------------------------- profiler & nvtx


class _NoCudart:
    def cudaProfilerStart(self):  # noqa: N802 - CUDA's name
        return 0

    def cudaProfilerStop(self):  # noqa: N802
        return 0


def cudart():
    return _NoCudart()


def check_error(res: int) -> None:
    return None


nvtx = SimpleNamespace(
    range_push=lambda msg, *a, **k: 0,
    range_pop=lambda *a, **k: 0,
    mark=lambda msg, *a, **k: None,
    range=lambda msg, *a, **k: contextlib.nullcontext(),
    range_start=lambda msg, *a, **k: 0,
    range_end=lambda range_id: None,
)

# ---------------------------------------------------------------------------- legacy tensor types
FloatTensor = torch.FloatTensor
DoubleTensor = torch.DoubleTensor
HalfTensor = torch.HalfTensor
BFloat16Tensor = torch.BFloat16Tensor
LongTensor = torch.LongTensor
IntTensor = torch.IntTensor
ByteTensor = torch.ByteTensor
BoolTensor = torch.BoolTensor

# ---------------------------------------------------------------------------- not on a CPU


def _unsupported(name: str, what: str, fix: str, as_class: bool = False):
    return unsupported_stand_in(name, f"torch.cuda.{name} ({what}) does not exist on the cpu "
                                      f"device. {fix}", as_class=as_class)


_NO_GRAPHS = "Remove --cuda-graph-impl / --enable-cuda-graph / --external-cuda-graph."
CUDAGraph = _unsupported("CUDAGraph", "CUDA graphs", _NO_GRAPHS, as_class=True)
graph = _unsupported("graph", "CUDA graphs", _NO_GRAPHS, as_class=True)
graph_pool_handle = _unsupported("graph_pool_handle", "CUDA graphs", _NO_GRAPHS)
_NO_POOLS = "Remove the flags that ask for NCCL/user memory pools (e.g. --nccl-ub)."
MemPool = _unsupported("MemPool", "memory pools", _NO_POOLS, as_class=True)
use_mem_pool = _unsupported("use_mem_pool", "memory pools", _NO_POOLS)
