"""megatron_musa_patch: run stock Megatron-LM / megatron-core on MUSA, CPU and CUDA.

Importing the package activates it (the MT-Megatron convention): do it before importing
Megatron. ``mmp run`` and ``MEGATRON_MUSA_PATCH=1`` reach the same ``activate()``.

Public API: :func:`activate`, :func:`active_session`, :func:`report`, :func:`deactivate` (tests).
"""

import sys as _sys

from .activation import activate, active_session, deactivate, is_active  # noqa: F401
from .base.errors import MegatronMusaPatchError  # noqa: F401
from .core.settings import autoactivate as _autoactivate
from .base.version import __version__  # noqa: F401

__all__ = ["activate", "active_session", "deactivate", "is_active", "report",
           "MegatronMusaPatchError", "__version__"]

def report():
    """The patch results of this process (list of PatchResult)."""
    return active_session().registry.results()


def _activate_on_import(unless_switched_off: bool = False):
    """``unless_switched_off``: the plain import, which MEGATRON_MUSA_PATCH_AUTOACTIVATE=0 stops
    (the start-up hook activates regardless)."""
    try:
        if not unless_switched_off or _autoactivate():
            activate()
    except MegatronMusaPatchError as exc:
        # A user error at import time: one paragraph and a non-zero exit, not a traceback.
        print(exc.render(), file=_sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None


_activate_on_import(unless_switched_off=True)
