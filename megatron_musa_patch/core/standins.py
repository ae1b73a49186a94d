"""Stand-in modules: an upstream module that cannot be imported here (it needs a CUDA
extension, say) served by the layer, by name, while the real one has not been imported."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable

import wrapt


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves one stand-in module by name (kind ``module``)."""

    def __init__(self, name: str, fill: Callable):
        self.name = name
        self.fill = fill

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin="megatron_musa_patch stand-in")

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.fill(module)
        # this finder answered before wrapt's: the post-import hooks of the module (the
        # registry's patches of what the stand-in defines) are run here instead
        wrapt.notify_module_loaded(module)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        module = sys.modules.get(self.name)
        if module is not None and getattr(module.__spec__, "loader", None) is self:
            del sys.modules[self.name]
