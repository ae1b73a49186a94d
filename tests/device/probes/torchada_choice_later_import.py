"""Where the layer maps torch itself, a later ``import torchada`` is refused and leaves torch as
it was: prints ``REFUSED <error type> <message>`` and ``UNCHANGED <True|False>``.

Run by tests/device/test_torchada_choice.py
(test_a_later_import_torchada_is_refused_where_the_layer_maps_torch)."""

import importlib

import megatron_musa_patch  # activates the layer
import torch


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    before = (torch.cuda, torch.Tensor.to, torch.device)
    try:
        importlib.import_module("torchada")
    except Exception as exc:
        print('REFUSED', type(exc).__name__, exc)
    print('UNCHANGED', before == (torch.cuda, torch.Tensor.to, torch.device))


if __name__ == "__main__":
    main()
