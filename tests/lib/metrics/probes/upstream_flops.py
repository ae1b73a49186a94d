"""Megatron-LM's own count, ``num_floating_point_operations``, for the cases ``sys.argv[1]``
gives as JSON ({name: [args as a dict, batch size]}); attributes a case does not set read as
None, as Megatron-LM's parser leaves them without their flags. Prints the counts as one JSON
line.

Run by tests/lib/metrics/test_flops.py."""

import json
import sys
import types

import megatron_musa_patch  # activates the layer: before megatron is imported
from megatron.training.training import num_floating_point_operations as count


class Args(types.SimpleNamespace):
    def __getattr__(self, name):
        return None


def main(cases):
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    print(json.dumps({k: count(Args(**a), b) for k, (a, b) in cases.items()}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
