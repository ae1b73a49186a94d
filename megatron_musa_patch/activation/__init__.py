"""Activation: the one code path behind ``import megatron_musa_patch``, ``mmp run`` and the
``MEGATRON_MUSA_PATCH=1`` start-up hook. It reads the settings, builds the :class:`Session` and
hands it to every plugin; this module alone holds the process's active session (for the public
API, the CLI and the excepthook), and nothing below it asks for it.

Order matters: the layer must be active before Megatron is imported, so its post-import hooks
patch each module as it loads (and ``from x import f`` in later modules sees the patched ``f``).
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import site
import sys
from pathlib import Path
from typing import List, Optional

from ..core import settings as settings_module
from ..device import torchada_import
from ..base.errors import (ActivationOrderError, DeviceSelectionError,
                          MegatronMusaPatchError)
from .session import Session
from ..upstream import check as release_check, installed, tables

logger = logging.getLogger("megatron_musa_patch")

LATE_ENV = settings_module.ALLOW_LATE_ENV

_SESSION: Optional[Session] = None


def active_session() -> Session:
    """The session of this process (public API, CLI and tests; features get theirs handed)."""
    if _SESSION is None:
        raise MegatronMusaPatchError(
            "megatron_musa_patch is not active in this process; import megatron_musa_patch (or "
            "call megatron_musa_patch.activate()) before Megatron."
        )
    return _SESSION


def is_active() -> bool:
    return _SESSION is not None


def activate(settings: Optional[settings_module.Settings] = None,
             allow_late: Optional[bool] = None) -> Session:
    """Select the device, register every plugin's patches and apply them. Idempotent."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    settings = settings or settings_module.from_env()
    late = imported_megatron_modules()
    if allow_late is None:
        allow_late = settings.allow_late
    if late and not allow_late:
        raise ActivationOrderError(
            f"megatron_musa_patch was activated after Megatron was imported ({', '.join(late[:3])}"
            f"{', ...' if len(late) > 3 else ''}), so modules already loaded hold unpatched CUDA "
            f"references. Import megatron_musa_patch before any megatron module, or launch with "
            f"`mmp run` or MEGATRON_MUSA_PATCH=1 (set {LATE_ENV}=1 to patch late anyway)."
        )
    check_lm_path(settings)

    # torchada first where the musa row will use it: before torch, before torch_musa is
    # imported to select the device, before any record captures a torch object
    tada_imported_here = torchada_import.preload(settings)

    import torch  # noqa: F401 - the device layer patches torch; import it under our control

    unverified_torch = release_check.check_torch(settings.allow_unverified)

    from ..core import plugins
    from ..device import adapter
    from ..device.rows import ROWS
    from ..device.select import BuiltinDeviceChoice, mapping
    from ..features import BUILTIN
    from ..lib.ops import dispatch
    from ..core.registry import Registry

    pm = plugins.make_manager(settings, BUILTIN, device_choice=BuiltinDeviceChoice())
    name = pm.hook.mmp_select_device(requested=settings.device, settings=settings)
    if name not in ROWS:
        raise DeviceSelectionError(f"a plugin chose the unknown device {name!r}")
    device = mapping(name)
    torch_mapping = adapter.choose(settings, device, tada_imported_here)
    for key, value in device.env_defaults.items():
        os.environ.setdefault(key, value)
    dispatch.configure(dispatch.Policy.from_settings(settings))
    session = Session(settings=settings, device=device, registry=None, plugins=pm,
                      late_modules=late, lm_path=settings.lm_path, torch_mapping=torch_mapping)
    session.lm_path = order_sys_path(session.lm_path)
    unverified = release_check.check(session.lm_path, settings.allow_unverified)
    release_check.check_training_source(session.lm_path)
    registry = Registry(device.name, plugins.toggles(pm, settings),
                        allow_unverified=settings.allow_unverified, version_of=session.version_of,
                        torch_version=installed.torch_version(), rows=tuple(ROWS))
    registry.scan_for_copies = bool(late)
    session.registry = registry
    pm.hook.mmp_register_patches(session=session, registry=registry, device=device)
    _SESSION = session
    try:
        registry.activate()
    except BaseException:
        registry.unpatch()
        _SESSION = None
        raise
    _install_excepthook()
    if not late:
        _guard_first_megatron_import(session)
    if late:
        logger.warning("megatron_musa_patch: activated after %s was imported; copies were "
                       "rebound where found", late[0])
    if session.is_rank_zero():
        for warning in (unverified, unverified_torch):
            if warning:
                logger.warning("megatron_musa_patch: %s", warning)
    return session


def deactivate() -> None:
    """Undo every applied patch and drop the session with its state (for tests)."""
    global _SESSION
    if _SESSION is not None:
        _SESSION.registry.unpatch()
        _SESSION = None
        from ..lib.ops import dispatch

        dispatch.configure(dispatch.Policy())


def imported_megatron_modules() -> List[str]:
    return sorted(n for n in sys.modules if n == "megatron.core" or n.startswith(
        ("megatron.core.", "megatron.training", "megatron.legacy")))


# ----------------------------------------------------------------------------- sys.path


def check_lm_path(settings: settings_module.Settings) -> None:
    """MEGATRON_LM_PATH names a Megatron-LM checkout with a readable version (which release it
    is, and whether it matches megatron-core, is ``release_check``'s)."""
    path = settings.lm_path
    if path is None:
        return
    tags = tables.tags()
    if not (path / "megatron" / "training" / "__init__.py").is_file():
        raise MegatronMusaPatchError(
            f"MEGATRON_LM_PATH={path} is not a Megatron-LM checkout (no "
            f"megatron/training/__init__.py there). Point it at a checkout of a supported tag "
            f"({tags}), e.g. `git clone -b {tables.MEGATRON[-1].lm_tag} "
            f"https://github.com/NVIDIA/Megatron-LM`."
        )
    if installed.megatron_lm_version(path) is None and not settings.allow_unverified:
        raise MegatronMusaPatchError(
            f"MEGATRON_LM_PATH={path} has no readable version (megatron/core/package_info.py), "
            f"so it cannot be matched with megatron-core. Point it at a checkout of a supported "
            f"tag ({tags}); set MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1 to try this one anyway."
        )


def _site_dirs() -> List[str]:
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    return [os.path.realpath(d) for d in dirs + ([user] if user else [])]


def _is_checkout(entry: str) -> bool:
    root = Path(entry or os.getcwd())
    return (root / "megatron" / "training").is_dir() and (root / "megatron" / "core").is_dir()


def order_sys_path(lm_path: Optional[Path]) -> Optional[Path]:
    """Megatron-LM checkouts go after site-packages: ``megatron`` is a namespace package, and a
    checkout's own ``megatron/core`` would shadow pip's (which carries the compiled dataset
    helpers). ``lm_path`` (MEGATRON_LM_PATH) is appended if missing, so ``megatron.training``
    resolves. Returns the checkout: ``lm_path``, else the first one found on ``sys.path``."""
    sites = set(_site_dirs())
    positions = [i for i, e in enumerate(sys.path) if os.path.realpath(e or os.getcwd()) in sites]
    if positions:
        last_site = max(positions)
        moved = [e for i, e in enumerate(sys.path) if i < last_site and _is_checkout(e)]
        for entry in moved:
            sys.path.remove(entry)
        sys.path.extend(e for e in moved if e not in sys.path)
        if lm_path is not None and str(lm_path) not in [os.path.realpath(e or os.getcwd())
                                                       for e in sys.path]:
            sys.path.append(str(lm_path))
    if lm_path is None:
        found = next((e for e in sys.path if _is_checkout(e)), None)
        if found is not None:
            return Path(found or os.getcwd()).resolve()
    return lm_path


class _FirstMegatronImport(importlib.abc.MetaPathFinder):
    """Re-orders sys.path just before ``megatron`` is first imported: with the start-up hook
    the layer activates before Python puts the script's directory (often a checkout) first."""

    def __init__(self, session: Session):
        self.session = session

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "megatron":
            self.remove()
            found = order_sys_path(self.session.lm_path)
            if found != self.session.lm_path:  # a checkout the script's directory put first
                release_check.check(found, self.session.settings.allow_unverified)
            self.session.lm_path = found
        return None

    def remove(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _guard_first_megatron_import(session: Session) -> None:
    if "megatron" not in sys.modules and not any(
            isinstance(f, _FirstMegatronImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _FirstMegatronImport(session))


# ----------------------------------------------------------------------------- reporting

_PREVIOUS_HOOK = None


def _install_excepthook() -> None:
    global _PREVIOUS_HOOK
    if _PREVIOUS_HOOK is not None:
        return
    _PREVIOUS_HOOK = sys.excepthook

    def excepthook(exc_type, exc, tb):
        _report_error(exc)
        ours = find_own_error(exc)
        if ours is not None:
            rank = os.environ.get("RANK")
            prefix = f"[rank {rank}] " if rank not in (None, "0") else ""
            print(prefix + ours.render(), file=sys.stderr, flush=True)
            return
        _PREVIOUS_HOOK(exc_type, exc, tb)

    sys.excepthook = excepthook


def _report_error(exc: BaseException) -> None:
    """The error that ends this rank, with its time, for ``mmp run`` to say which rank failed
    first (lib/elastic/reports.py)."""
    rank = os.environ.get("RANK")
    if _SESSION is None or rank is None or not rank.isdigit():
        return
    from ..lib.elastic import reports

    reports.write_error(_SESSION.settings.watchdog_dir, int(rank), exc)


def find_own_error(exc: Optional[BaseException]) -> Optional[MegatronMusaPatchError]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, MegatronMusaPatchError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
