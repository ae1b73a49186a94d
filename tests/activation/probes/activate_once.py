"""The import activates the layer once (``activate()`` returns that session again) on the CPU
row, where torch's CUDA calls land on the CPU; prints the device's name and how many patches
applied.

Run by tests/activation/test_activation.py."""

import megatron_musa_patch as m
import torch


def main():
    a = m.activate()
    assert a is m.activate()
    assert torch.cuda.is_available() and torch.empty(1, device="cuda").device.type == "cpu"
    print(a.device.name, sum(r.status == "applied" for r in m.report()))


if __name__ == "__main__":
    main()
