"""The readers of the TE version that upstream's code and its unit tests use: the helper itself,
is_te_min_version (the unit tests' conftest asks it before every test), a module holding a
``from megatron.core.utils import get_te_version`` copy, and OptimizerConfig's precision-aware
check. Prints four booleans on one line (True, True for the last two without TE); exits non-zero
where a reader fails.

Run by tests/features/upstream_fixes/test_te_version.py."""

import megatron_musa_patch  # activates the layer: before megatron is imported
from packaging.version import Version
from megatron.core.utils import get_te_version, is_te_min_version
import megatron.core.transformer.transformer_config as tc
from megatron.core.optimizer.optimizer_config import OptimizerConfig


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    print(is_te_min_version("1.3"), is_te_min_version("0.1", check_equality=False),
          get_te_version() < Version("1.3.0"), tc.get_te_version() == Version("0.0.0"))
    OptimizerConfig(use_precision_aware_optimizer=True, use_distributed_optimizer=True)


if __name__ == "__main__":
    main()
