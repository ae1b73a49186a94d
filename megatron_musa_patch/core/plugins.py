"""The plugin manager: built-in features plus entry-point plugins, checked and toggled.

``settings.block_plugins`` (``MEGATRON_MUSA_PATCH_BLOCK_PLUGINS=x``) stops an installed external
plugin from loading; ``settings.plugins`` (``MEGATRON_MUSA_PATCH_PLUGINS=pkg.mod``) registers a
plugin module by name without packaging it (development, tests). Which features are switched off
is decided by ``toggles.decide`` from ``MEGATRON_MUSA_PATCH_DISABLE`` / ``ONLY``.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Dict, Iterable, Optional

import pluggy

from . import hookspecs
from megatron_musa_patch.base.errors import ArgumentError, PluginError
from .feature import declaration
from .settings import Settings
from .toggles import Toggles, decide

ENTRY_POINT_GROUP = "megatron_musa_patch"
DEVICE_CHOICE = "builtin-device-choice"
HOOK_PREFIX = "mmp_"


def make_manager(settings: Settings, builtins: Iterable, load_entry_points: bool = True,
                 device_choice: Optional[object] = None) -> pluggy.PluginManager:
    """``builtins``: the feature modules in registration order (``features.BUILTIN``);
    ``device_choice``: the plugin that answers ``mmp_select_device`` when no other does."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in settings.block_plugins:
        pm.set_blocked(name)
    if device_choice is not None:
        pm.register(device_choice, name=DEVICE_CHOICE)
    for module in builtins:
        pm.register(module, name=declaration(module).name)
    if load_entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for name in settings.plugins:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ArgumentError(
                f"MEGATRON_MUSA_PATCH_PLUGINS names {name!r}, which cannot be imported ({exc}); "
                f"fix the module name or PYTHONPATH.") from exc
        declared = declaration(module)
        pm.register(module, name=declared.name if declared else name)
    check_hooks(pm)
    return pm


def check_hooks(pm: pluggy.PluginManager) -> None:
    """Every ``mmp_*`` name a plugin defines is a hook of the contract: a misspelt hook would
    otherwise never be called, and nothing would say so."""
    known = sorted(n for n in dir(hookspecs) if n.startswith(HOOK_PREFIX))
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        for attr in dir(plugin):
            if attr.startswith(HOOK_PREFIX) and attr not in known and callable(
                    getattr(plugin, attr, None)):
                close = difflib.get_close_matches(attr, known, n=1)
                raise PluginError(
                    f"plugin '{name}' defines {attr}, which is not a hook of megatron_musa_patch"
                    f"{f' (did you mean {close[0]}?)' if close else ''}; hooks: "
                    f"{', '.join(known)}. Rename it, or give it a name without the "
                    f"{HOOK_PREFIX} prefix if it is not meant as a hook.")
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:  # pragma: no cover - caught above first
        raise PluginError(f"a plugin does not keep the hook contract: {exc}") from exc


def feature_plugins(pm: pluggy.PluginManager) -> Dict[str, object]:
    return {name: plugin for name, plugin in pm.list_name_plugin()
            if name != DEVICE_CHOICE and plugin is not None}


def toggles(pm: pluggy.PluginManager, settings: Settings) -> Toggles:
    """The switched-off features; unknown names are an error (a typo would be silent)."""
    declared = {name: declaration(plugin) for name, plugin in feature_plugins(pm).items()}
    required = {name: bool(d and d.required) for name, d in declared.items()}
    return decide(required, settings.disable, settings.only,
                  aliases={name: d.aliases for name, d in declared.items() if d},
                  kept_out={name: d.kept_out for name, d in declared.items() if d})
