"""The launcher's side of activation: the records a launcher's process applies
(``mmp_register_launcher_patches``) -- ``mmp run`` before torchrun, the start-up hook in
dlrover-run's or ft_launcher's agent -- gated by the same toggles and releases as the ranks'."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional

from ..base.errors import MegatronMusaPatchError
from ..core import settings as settings_module

#: the launcher-side records' state in this process (``mmp run``, or a launcher's agent)
_LAUNCHER: Optional["LauncherSide"] = None
#: where the launcher's records are applied, as doctor says it
LAUNCHER_PROCESSES = ("by the launcher (mmp run; dlrover-run or ft_launcher with "
                      "MEGATRON_MUSA_PATCH=1), not in the ranks")


@dataclasses.dataclass
class LauncherSide:
    """The records a launcher's process applies (``mmp_register_launcher_patches``) and the
    state they read."""

    registry: Any
    supervision: Any


def launcher_side(settings: Optional[settings_module.Settings] = None,
                  pm: Any = None) -> LauncherSide:
    """The launcher's records, registered and gated by the same toggles and releases as the
    ranks', not applied (``mmp doctor`` previews them). ``pm``: the plugin manager a caller has
    already made (an activated session's); None: made here, entry points included."""
    settings = settings or settings_module.from_env()
    from ..core import plugins
    from ..core.registry import Registry
    from ..lib.elastic.supervision import Supervision

    if pm is None:
        from ..features import BUILTIN

        pm = plugins.make_manager(settings, BUILTIN)
    registry = Registry("launcher", plugins.toggles(pm, settings),
                        allow_unverified=settings.allow_unverified)
    supervision = Supervision()
    pm.hook.mmp_register_launcher_patches(registry=registry, supervision=supervision)
    return LauncherSide(registry, supervision)


def activate_launcher(settings: Optional[settings_module.Settings] = None) -> LauncherSide:
    """Apply the launcher's records in this process (idempotent): ``mmp run`` before torchrun,
    the start-up hook in dlrover-run's or ft_launcher's agent. A strict record's failure undoes
    the rest and raises."""
    global _LAUNCHER
    if _LAUNCHER is None:
        side = launcher_side(settings)
        try:
            side.registry.activate()
        except BaseException:
            side.registry.unpatch()
            raise
        _LAUNCHER = side
    return _LAUNCHER


def activate_launcher_on_import(launcher: str) -> None:
    """In the agent of ``launcher`` (dlrover-run, ft_launcher) started with MEGATRON_MUSA_PATCH=1
    (the start-up hook; the workers it starts activate the layer themselves): the launcher's
    records, from when the launcher's module is imported (nothing heavier at start-up)."""
    import wrapt

    from ..lib.elastic.launchers import LAUNCHERS

    wrapt.register_post_import_hook(_activate_in_agent, LAUNCHERS[launcher].module)


def _activate_in_agent(module) -> None:
    """A refusal (a misspelt toggle, a plugin's error, a strict record) is its paragraph and the
    agent's exit status, not a traceback from inside the launcher's import."""
    try:
        activate_launcher()
    except MegatronMusaPatchError as exc:
        print(exc.render(), file=sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None


def deactivate_launcher() -> None:
    """Undo the launcher's records (the end of ``mmp run``, tests)."""
    global _LAUNCHER
    if _LAUNCHER is not None:
        _LAUNCHER.registry.unpatch()
        _LAUNCHER = None
