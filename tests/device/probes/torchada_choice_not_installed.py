"""The layer imported on the musa row (torchada mapping) with torchada hidden, as on a machine
without it: the import must stop with one paragraph on how to install the musa extra (exit 2).

Run by tests/device/test_torchada_choice.py
(test_musa_row_without_torchada_says_to_install_the_musa_extra)."""

import importlib

from tests.device.probes.hide_torchada import hide_torchada


def main():
    hide_torchada()
    importlib.import_module("megatron_musa_patch")  # the import under test


if __name__ == "__main__":
    main()
