"""Runs a training script (the first argument) as ``__main__``, as torchrun would, and prints the
process's peak device memory when it exits: the figure benchmarks/e2e_gpu.py compares. It
imports nothing of megatron_musa_patch, so the same entry serves upstream alone (plain
torchrun) and the layer (``mmp run``, which activates before this file runs)."""

import atexit
import os
import runpy
import sys


def _report_peak_memory():
    import torch

    if torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"E2E peak memory allocated (GiB): {peak:.2f}", flush=True)


script = os.path.abspath(sys.argv[1])
sys.argv = sys.argv[1:]
sys.path.append(os.path.dirname(script))  # the script's modules, after site-packages
atexit.register(_report_peak_memory)
runpy.run_path(script, run_name="__main__")
