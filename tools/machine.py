"""The machine a benchmark ran on, printed with every result."""

import os
import platform
import sys


def describe(python_version: str = "", torch_version: str = "") -> str:
    """This machine, with this interpreter's Python and torch unless others are given (the
    interpreter a benchmark ran its work in)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if not torch_version:
        try:
            import torch

            torch_version = torch.__version__
        except ImportError:
            torch_version = "not installed"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"machine: {cpu}, {cores} usable cores, {platform.system()} {platform.release()}, "
            f"Python {python_version or sys.version.split()[0]}, torch {torch_version}")
