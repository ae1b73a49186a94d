"""megatron-core imported without triton and without the layer: upstream's own import fails
(a non-zero exit naming triton).

Run by tests/upstream/test_triton_free.py."""

import importlib

from tests.upstream.probes.no_triton import block_triton

if __name__ == "__main__":
    block_triton()
    importlib.import_module("megatron.core")
