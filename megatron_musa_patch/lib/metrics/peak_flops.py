"""Peak dense FLOP/s per device, the denominator of MFU.

Accelerators come from a table of datasheet numbers (dense, no sparsity), matched against the
device name torch reports (``torch.cuda.get_device_properties(0).name``, which is torch.musa's
on MUSA). The CPU has no datasheet number torch's GEMM reaches, so its peak is measured: a short
matrix-multiply benchmark in the training dtype, run on every rank at the same time (ranks share
the cores, as they do in training). ``--device-peak-tflops`` overrides both.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Dict, Optional, Tuple

#: (pattern on the device name, display name, {dtype: dense TFLOP/s}, source). More specific
#: patterns first. A dtype missing from an entry has no known peak: MFU then needs the flag.
TABLE: Tuple[Tuple[str, str, Dict[str, float], str], ...] = (
    # Moore Threads
    (r"\bS4000\b", "MTT S4000", {"fp32": 25.0, "tf32": 50.0, "fp16": 100.0, "bf16": 100.0},
     "Moore Threads launch specification (Dec 2023)"),
    (r"\bS5000\b", "MTT S5000", {"fp8": 1000.0, "fp16": 500.0, "bf16": 500.0},
     "press reports of Moore Threads' figures (Feb 2026): 1000 TFLOP/s FP8 per card, "
     "liquid-cooled; BF16/FP16 taken as half of FP8; no official FP32 figure"),
    # NVIDIA (dense tensor-core figures from the datasheets; fp32 = non-tensor-core)
    (r"H100.*PCIe", "NVIDIA H100 PCIe",
     {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0},
     "NVIDIA H100 datasheet"),
    (r"H100.*NVL", "NVIDIA H100 NVL",
     {"fp32": 60.0, "tf32": 417.5, "fp16": 835.0, "bf16": 835.0, "fp8": 1670.0},
     "NVIDIA H100 datasheet"),
    (r"H100|H800", "NVIDIA H100/H800 SXM",
     {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9},
     "NVIDIA H100 datasheet"),
    (r"H200", "NVIDIA H200",
     {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9},
     "NVIDIA H200 datasheet"),
    (r"H20\b", "NVIDIA H20", {"fp32": 44.0, "tf32": 74.0, "fp16": 148.0, "bf16": 148.0,
                              "fp8": 296.0}, "NVIDIA H20 specification"),
    (r"A100|A800", "NVIDIA A100/A800",
     {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}, "NVIDIA A100 datasheet"),
    (r"L40S", "NVIDIA L40S",
     {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05, "fp8": 733.0},
     "NVIDIA L40S datasheet"),
    (r"\bA10\b", "NVIDIA A10", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
     "NVIDIA A10 datasheet"),
    (r"V100", "NVIDIA V100", {"fp32": 15.7, "fp16": 125.0}, "NVIDIA V100 datasheet (SXM2)"),
    (r"RTX 4090", "NVIDIA GeForce RTX 4090",
     {"fp32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3},
     "NVIDIA Ada whitepaper (FP32 accumulate)"),
)


@dataclasses.dataclass(frozen=True)
class Peak:
    tflops: float  # per device, dense, in ``dtype``
    dtype: str
    source: str  # where the number comes from (table entry, measured, flag)


def training_dtype(args) -> str:
    """The dtype the model's GEMMs run in, as the peak table names it."""
    if getattr(args, "fp8", None):
        return "fp8"
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "fp32"


def lookup(device_name: str, dtype: str) -> Tuple[Optional[Peak], str]:
    """The table's peak for this device and dtype, or (None, why not)."""
    for pattern, name, peaks, source in TABLE:
        if re.search(pattern, device_name):
            if dtype in peaks:
                return Peak(peaks[dtype], dtype, f"{name}, {source}"), ""
            return None, f"no {dtype} peak is known for {name}"
    return None, f"{device_name!r} is not in the peak table"


def measure_matmul(dtype: str, seconds: float = 0.2, size: int = 512) -> Peak:
    """Best sustained ``size x size`` GEMM rate over ``seconds`` in ``dtype``, on the CPU."""
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(
        dtype, torch.float32)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(torch_dtype)
    b = torch.randn(size, size, generator=gen).to(torch_dtype)
    out = torch.empty(size, size, dtype=torch_dtype)
    torch.mm(a, b, out=out)  # warm-up: thread pool and kernel selection
    best, reps, deadline = float("inf"), 1, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        elapsed = (time.perf_counter() - start) / reps
        best = min(best, elapsed)
        if elapsed * reps < 0.02:  # time batches of at least ~20 ms
            reps *= 2
    threads = torch.get_num_threads()
    return Peak(2 * size ** 3 / best / 1e12, dtype,
                f"measured: {size}x{size} {dtype} torch.mm, {threads} thread(s)")
