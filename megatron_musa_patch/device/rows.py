"""The device table: MUSA, CPU and CUDA as rows of one mapping."""

from __future__ import annotations

import importlib

import torch

from . import names
from .base import DeviceMapping


def _torch_musa_module():
    importlib.import_module("torch_musa")  # installs torch.musa and the mccl backend
    return torch.musa


def _cpu_module():
    from . import cpu_api

    return cpu_api


def _cuda_module():
    return torch.cuda


MUSA = DeviceMapping(
    name=names.MUSA,
    torch_type="musa",
    backend="mccl",
    load_module=_torch_musa_module,
    backend_alias="mccl",
    jit_default="eager",  # torch.compile on MUSA depends on the torch_musa build: opt in
    api_aliases={"CUDAGraph": "MUSAGraph"},
)

CPU = DeviceMapping(
    name=names.CPU,
    torch_type="cpu",
    backend="gloo",
    load_module=_cpu_module,
    pinned_memory=False,
    rng_shared_with_host=True,
    # Megatron's TP>1 check demands this CUDA scheduling knob; a CPU has no hardware queues.
    env_defaults={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    jit_default="eager",  # inductor's C++ compile costs more than it saves on tiny CPU models
    memory_stats="process resident set (the CPU allocator keeps no statistics)",
)

CUDA = DeviceMapping(
    name=names.CUDA,
    torch_type="cuda",
    backend="nccl",
    load_module=_cuda_module,
    rewrites_cuda=False,
)

ROWS = {row.name: row for row in (MUSA, CPU, CUDA)}

#: the rows that rewrite Megatron's CUDA spellings (every row but CUDA's own)
OFF_CUDA = frozenset(name for name, row in ROWS.items() if row.rewrites_cuda)
