"""A launcher that forks its ranks from one process sets LOCAL_RANK after the layer is active:
the device is still the rank's own (prints 3), until set_device says otherwise (prints 1).

Run by tests/device/test_cpu.py (test_the_device_is_the_local_rank_set_after_activation)."""

import os

import megatron_musa_patch
import torch


def main():
    megatron_musa_patch.activate()
    os.environ["LOCAL_RANK"] = "3"
    print(torch.cuda.current_device())
    torch.cuda.set_device(1)
    print(torch.cuda.current_device())


if __name__ == "__main__":
    main()
