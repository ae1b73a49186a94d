"""Importing the kernels loader, and loading its sources module by path (``sys.argv[1]``) as
setup.py does, imports no torch: prints whether ``torch`` is in ``sys.modules`` afterwards.

Run by tests/lib/ops/test_kernels_build.py."""

import importlib
import importlib.util
import os
import sys


def main(sources_path):
    os.environ["MEGATRON_MUSA_PATCH_AUTOACTIVATE"] = "0"
    importlib.import_module("megatron_musa_patch.lib.ops.kernels")  # the import under test
    spec = importlib.util.spec_from_file_location("k", sources_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print("torch" in sys.modules)


if __name__ == "__main__":
    main(sys.argv[1])
