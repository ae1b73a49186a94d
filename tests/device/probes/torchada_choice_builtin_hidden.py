"""The layer's built-in mapping (TORCHADA=0) on the musa row with torchada hidden: prints the
adapter, whether torchada was imported, and torch.cuda.is_available().

Run by tests/device/test_torchada_choice.py (test_builtin_mapping_needs_no_torchada)."""

import sys

from tests.device.probes.hide_torchada import hide_torchada


def main():
    hide_torchada()
    import megatron_musa_patch as m
    import torch

    print(m.active_session().torch_mapping.adapter, 'torchada' in sys.modules,
          torch.cuda.is_available())


if __name__ == "__main__":
    main()
