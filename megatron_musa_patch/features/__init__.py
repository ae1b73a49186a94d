"""Built-in features: every module here that declares ``FEATURE = feature(__name__, ...)``.

A feature's name is its module path below this package (``fused_ops/rope.py`` is
``fused_ops.rope``; a package such as ``recompute/`` is a feature of its own when its
``__init__`` declares one). A group (``fused_ops``, ``upstream_fixes``, ...) is a folder: its
name switches all of its features. Adding a feature or an upstream fix is adding its module; the
registration order is :func:`~megatron_musa_patch.core.feature.ordered` over the declarations'
``after``, not a list kept here.
"""

import importlib
import pkgutil

from ..core.feature import Feature, ordered
from ..core.toggles import names_of


def _reraise(name):
    raise  # pkgutil would otherwise skip a feature package that fails to import, silently


def _discover():
    found = []
    for info in pkgutil.walk_packages(__path__, __name__ + ".", onerror=_reraise):
        module = importlib.import_module(info.name)
        if isinstance(getattr(module, "FEATURE", None), Feature):
            found.append(module)
    return tuple(ordered(found))


#: the built-in feature modules, in registration order
BUILTIN = _discover()


def group(name: str) -> tuple:
    """The built-in features a toggle ``name`` switches (``fused_ops`` -> its five fusions)."""
    return tuple(m for m in BUILTIN if name in names_of(m.FEATURE.name, m.FEATURE.aliases,
                                                       m.FEATURE.kept_out))
