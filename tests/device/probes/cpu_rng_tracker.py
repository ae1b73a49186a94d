"""Megatron's CUDA RNG tracker drives dropout on the CPU row: the same tracker seed gives the
same mask, another seed another, forks advance the forked state and leave the default one, and
megatron logs no warning about it. Prints ``ok``.

Run by tests/device/test_cpu.py (test_rng_tracker_drives_dropout_without_false_warnings)."""

import logging

import megatron_musa_patch  # activates the layer before megatron loads
import torch
from megatron.core.tensor_parallel import random as mpr


class Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


def masks(seed):
    torch.manual_seed(1)
    torch.cuda.manual_seed(1)
    tracker = mpr.CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", seed)
    before = torch.cuda.get_rng_state()
    with tracker.fork():
        a = torch.nn.functional.dropout(torch.ones(1000, device="cuda"), 0.5)
    outside = torch.equal(before, torch.cuda.get_rng_state())
    with tracker.fork():
        b = torch.nn.functional.dropout(torch.ones(1000, device="cuda"), 0.5)
    return a, b, outside


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    keep = Keep()
    logging.getLogger("megatron.core.tensor_parallel.random").addHandler(keep)
    a1, b1, kept = masks(100)
    a2, _, _ = masks(100)
    a3, _, _ = masks(200)
    assert kept, "the default generator state changed across a fork"
    assert torch.equal(a1, a2), "same tracker seed must give the same dropout mask"
    assert not torch.equal(a1, a3), "another seed must give another mask"
    assert not torch.equal(a1, b1), "the forked state must advance between forks"
    assert not keep.records, keep.records
    print("ok")


if __name__ == "__main__":
    main()
