"""What was imported already when torchada's module started executing, the layer importing it:
prints whether neither torch nor torch_musa was (``True``), then the
TORCHADA_FORCE_CUDA_AVAILABLE the layer left in the environment.

Run by tests/device/test_torchada_choice.py
(test_the_layer_imports_torchada_before_torch_and_torch_musa)."""

import importlib.abc
import importlib.machinery
import os
import sys


class Recorder(importlib.abc.MetaPathFinder):
    """Records, when torchada's module starts executing, whether torch and torch_musa are
    imported already."""

    def __init__(self):
        self.seen = []

    def find_spec(self, name, path=None, target=None):
        if name != "torchada":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            self.seen.append(("torch" in sys.modules, "torch_musa" in sys.modules))
            run(module)
        spec.loader.exec_module = exec_module
        return spec


def main():
    recorder = Recorder()
    sys.meta_path.insert(0, recorder)
    importlib.import_module("megatron_musa_patch")  # the import under test

    print(recorder.seen == [(False, False)], os.environ["TORCHADA_FORCE_CUDA_AVAILABLE"])


if __name__ == "__main__":
    main()
