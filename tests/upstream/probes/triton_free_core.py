"""megatron-core imported through the layer without triton: the GPT model and the module of
the paged stash's triton kernels (``sys.argv[1]``) import; prints ``IMPORTED <block size>`` and
the ``STATUS`` of the patch that makes it work.

Run by tests/upstream/test_triton_free.py."""

import importlib
import sys

from tests.upstream.probes.no_triton import block_triton


def main(kernels):
    block_triton()
    import megatron_musa_patch

    importlib.import_module("megatron.core")
    importlib.import_module("megatron.core.models.gpt.gpt_model")
    print("IMPORTED", importlib.import_module(kernels).GLOBAL_BLOCK_SIZE)
    print("STATUS", [r.status for r in megatron_musa_patch.report()
                     if r.id == "startup.cuda_free_startup.paged_stash_without_triton"])


if __name__ == "__main__":
    main(sys.argv[1])
