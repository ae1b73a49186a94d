"""megatron.training's ActivationLogger hooks a small Sequential of linears, runs it, and removes
its hooks (no process group: the file store the test passes as ``sys.argv[1]`` goes unused).
Prints ``hooks <count>`` then ``removed <count>``.

Run by tests/features/upstream_fixes/test_activation_logging.py."""

import megatron_musa_patch  # activates the layer: before megatron is imported
import torch
import torch.nn as nn
from megatron.training.activation_logging import ActivationLogger


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    logger = ActivationLogger(save_dir=".")
    logger.register_activation_hooks([model])
    model(torch.randn(4, 16))
    print("hooks", len(logger._activation_hooks))
    logger.remove_activation_hooks()
    print("removed", len(logger._activation_hooks))


if __name__ == "__main__":
    main()
