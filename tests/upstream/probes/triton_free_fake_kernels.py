"""A module of triton kernels (the fake package ``fakepkg`` in the directory ``sys.argv[1]``)
executed without triton: its Python code runs, its kernel refuses when launched (prints
``REFUSED ...``), and triton stays missing (``TRITON STILL MISSING``).

Run by tests/upstream/test_triton_free.py."""

import importlib
import sys
import types

from tests.upstream.probes.no_triton import block_triton


def main(package_dir):
    block_triton()
    sys.path.insert(0, package_dir)
    importlib.import_module("fakepkg")  # the package; its kernels module is executed below
    from megatron_musa_patch.upstream.triton_free import execute_without_triton
    from megatron_musa_patch.base.errors import UnsupportedOnDeviceError

    module = types.ModuleType("fakepkg.kernels")
    sys.modules["fakepkg.kernels"] = module
    execute_without_triton(module, "the fake feature (--fake)")
    assert module.BLOCK == 1024 and module.__file__.endswith("kernels.py")
    try:
        module.launch(4096)
    except UnsupportedOnDeviceError as exc:
        print("REFUSED", exc)
    try:
        importlib.import_module("triton")
    except ModuleNotFoundError:
        print("TRITON STILL MISSING")


if __name__ == "__main__":
    main(sys.argv[1])
