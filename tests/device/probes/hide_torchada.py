"""torchada made to look not installed (find_spec answers no) for the rest of a probe's process,
before the layer looks: the probes of tests/device/test_torchada_choice.py call
``hide_torchada()`` before they import the layer."""

import importlib.abc
import sys


class NoTorchada(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchada" or name.startswith("torchada."):
            raise ModuleNotFoundError("No module named 'torchada'", name=name)


def hide_torchada():
    sys.meta_path.insert(0, NoTorchada())
