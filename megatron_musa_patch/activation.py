"""Activation: the one code path behind ``import megatron_musa_patch``, ``mmp run`` and the
``MEGATRON_MUSA_PATCH=1`` start-up hook.

Order matters: the layer must be active before Megatron is imported, so its post-import hooks
patch each module as it loads (and ``from x import f`` in later modules sees the patched ``f``).
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import logging
import os
import site
import sys
from pathlib import Path
from typing import List, Optional

from packaging.specifiers import SpecifierSet

from . import versions
from .errors import ActivationOrderError, DeviceSelectionError, MegatronMusaPatchError

logger = logging.getLogger("megatron_musa_patch")

LATE_ENV = "MEGATRON_MUSA_PATCH_ALLOW_LATE"


@dataclasses.dataclass
class Activation:
    device: object  # DeviceRow
    registry: object  # Registry
    plugins: object  # pluggy.PluginManager
    late_modules: List[str]
    table_logged: bool = False


_CURRENT: Optional[Activation] = None


def current() -> Activation:
    if _CURRENT is None:
        raise MegatronMusaPatchError(
            "megatron_musa_patch is not active in this process; import megatron_musa_patch (or "
            "call megatron_musa_patch.activate()) before Megatron."
        )
    return _CURRENT


def is_active() -> bool:
    return _CURRENT is not None


def activate(allow_late: Optional[bool] = None) -> Activation:
    """Select the device, register every plugin's patches and apply them. Idempotent."""
    global _CURRENT
    if _CURRENT is not None:
        return _CURRENT
    late = imported_megatron_modules()
    if allow_late is None:
        allow_late = os.environ.get(LATE_ENV, "") == "1"
    if late and not allow_late:
        raise ActivationOrderError(
            f"megatron_musa_patch was activated after Megatron was imported ({', '.join(late[:3])}"
            f"{', ...' if len(late) > 3 else ''}), so modules already loaded hold unpatched CUDA "
            f"references. Import megatron_musa_patch before any megatron module, or launch with "
            f"`mmp run` or MEGATRON_MUSA_PATCH=1 (set {LATE_ENV}=1 to patch late anyway)."
        )
    check_lm_path()
    order_sys_path()

    import torch  # noqa: F401 - the device layer patches torch; import it under our control

    from .device import requested_device, row
    from .plugins import disabled_features, make_manager
    from .registry import Registry

    pm = make_manager()
    requested = requested_device()
    name = pm.hook.mmp_select_device(requested=requested)
    if name not in ("musa", "cpu", "cuda"):
        raise DeviceSelectionError(f"a plugin chose the unknown device {name!r}")
    device = row(name)
    for key, value in device.env_defaults.items():
        os.environ.setdefault(key, value)
    registry = Registry(device.name, disabled_features(pm))
    registry.scan_for_copies = bool(late)
    pm.hook.mmp_register_patches(registry=registry, device=device)
    state = Activation(device, registry, pm, late)
    _CURRENT = state
    try:
        registry.activate()
    except BaseException:
        registry.unpatch()
        _CURRENT = None
        raise
    _install_excepthook()
    if not late:
        _guard_first_megatron_import()
    if late:
        logger.warning("megatron_musa_patch: activated after %s was imported; copies were "
                       "rebound where found", late[0])
    return state


def deactivate() -> None:
    """Undo every applied patch (for tests). Hooks stay registered but do nothing."""
    global _CURRENT
    if _CURRENT is not None:
        _CURRENT.registry.unpatch()
        _CURRENT = None


def imported_megatron_modules() -> List[str]:
    return sorted(n for n in sys.modules if n == "megatron.core" or n.startswith(
        ("megatron.core.", "megatron.training", "megatron.legacy")))


# ----------------------------------------------------------------------------- sys.path


def check_lm_path() -> None:
    path = versions.lm_path()
    if path is None:
        return
    if not (path / "megatron" / "training" / "__init__.py").is_file():
        raise MegatronMusaPatchError(
            f"MEGATRON_LM_PATH={path} is not a Megatron-LM checkout (no "
            f"megatron/training/__init__.py there). Point it at a checkout of tag core_v0.16.1, "
            f"e.g. `git clone -b core_v0.16.1 https://github.com/NVIDIA/Megatron-LM`."
        )
    if os.environ.get("MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED", "") == "1":
        return
    found = versions.megatron_lm_version(path)
    if found is None or found not in SpecifierSet(versions.VERIFIED_MEGATRON, prereleases=True):
        what = (f"is Megatron-LM {found}" if found is not None else
                "has no readable version (megatron/core/package_info.py)")
        raise MegatronMusaPatchError(
            f"MEGATRON_LM_PATH={path} {what}, but this layer's patches were verified on "
            f"Megatron-LM {versions.VERIFIED_MEGATRON} (tag core_v0.16.1). Check out that tag "
            f"(`git -C {path} checkout core_v0.16.1`) or point MEGATRON_LM_PATH at such a "
            f"checkout; set MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1 to try this one anyway."
        )


def _site_dirs() -> List[str]:
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    return [os.path.realpath(d) for d in dirs + ([user] if user else [])]


def _is_checkout(entry: str) -> bool:
    root = Path(entry or os.getcwd())
    return (root / "megatron" / "training").is_dir() and (root / "megatron" / "core").is_dir()


def order_sys_path() -> None:
    """Megatron-LM checkouts go after site-packages: ``megatron`` is a namespace package, and a
    checkout's own ``megatron/core`` would shadow pip's (which carries the compiled dataset
    helpers). ``MEGATRON_LM_PATH`` is appended if missing, so ``megatron.training`` resolves."""
    lm = versions.lm_path()
    sites = set(_site_dirs())
    positions = [i for i, e in enumerate(sys.path) if os.path.realpath(e or os.getcwd()) in sites]
    if not positions:
        return
    last_site = max(positions)
    moved = [e for i, e in enumerate(sys.path) if i < last_site and _is_checkout(e)]
    for entry in moved:
        sys.path.remove(entry)
    sys.path.extend(e for e in moved if e not in sys.path)
    if lm is not None and str(lm) not in [os.path.realpath(e or os.getcwd()) for e in sys.path]:
        sys.path.append(str(lm))
    if versions.lm_path() is None:
        found = next((e for e in sys.path if _is_checkout(e)), None)
        if found is not None:
            versions.set_detected_lm_path(Path(found or os.getcwd()).resolve())


class _FirstMegatronImport(importlib.abc.MetaPathFinder):
    """Re-orders sys.path just before ``megatron`` is first imported: with the start-up hook
    the layer activates before Python puts the script's directory (often a checkout) first."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "megatron":
            self.remove()
            order_sys_path()
        return None

    def remove(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _guard_first_megatron_import() -> None:
    if "megatron" not in sys.modules and not any(
            isinstance(f, _FirstMegatronImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _FirstMegatronImport())


# ----------------------------------------------------------------------------- reporting

_PREVIOUS_HOOK = None


def _install_excepthook() -> None:
    global _PREVIOUS_HOOK
    if _PREVIOUS_HOOK is not None:
        return
    _PREVIOUS_HOOK = sys.excepthook

    def excepthook(exc_type, exc, tb):
        ours = find_own_error(exc)
        if ours is not None:
            rank = os.environ.get("RANK")
            prefix = f"[rank {rank}] " if rank not in (None, "0") else ""
            print(prefix + ours.render(), file=sys.stderr, flush=True)
            return
        _PREVIOUS_HOOK(exc_type, exc, tb)

    sys.excepthook = excepthook


def find_own_error(exc: Optional[BaseException]) -> Optional[MegatronMusaPatchError]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, MegatronMusaPatchError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def log_table_once() -> None:
    state = _CURRENT
    if state is None or state.table_logged:
        return
    state.table_logged = True
    if is_rank_zero():
        from .table import render_table

        print(render_table(state, collapse=True), flush=True)
