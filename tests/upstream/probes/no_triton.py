"""Triton made unimportable for the rest of a probe's process, as on a machine without it (the
probes of tests/upstream/test_triton_free.py call ``block_triton()`` before anything imports
megatron)."""

import importlib.abc
import sys


class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError("No module named 'triton' (blocked by the test)")
        return None


def block_triton():
    sys.meta_path.insert(0, NoTriton())
