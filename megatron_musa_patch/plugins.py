"""The plugin manager: built-in features plus entry-point plugins, with the toggles applied.

``MEGATRON_MUSA_PATCH_DISABLE=a,b`` switches features off; ``MEGATRON_MUSA_PATCH_ONLY=a,b``
keeps only those optional features (required ones stay on unless disabled by name);
(``ONLY=none``: required ones alone); ``MEGATRON_MUSA_PATCH_BLOCK_PLUGINS=x`` stops an
installed external plugin from loading; ``MEGATRON_MUSA_PATCH_PLUGINS=pkg.mod`` registers a
plugin module by name without packaging it (development, tests).
"""

from __future__ import annotations

import importlib
import os
from typing import Iterable, List, Set

import pluggy

from . import hookspecs
from .device import builtin_select
from .errors import ArgumentError
from .hookspecs import hookimpl

ENTRY_POINT_GROUP = "megatron_musa_patch"


class _BuiltinDeviceChoice:
    """Runs after every plugin: the built-in device choice."""

    @hookimpl(trylast=True)
    def mmp_select_device(self, requested):
        return builtin_select(requested)


def env_list(name: str) -> List[str]:
    return [part.strip() for part in os.environ.get(name, "").split(",") if part.strip()]


def make_manager(builtins: Iterable = None, load_entry_points: bool = True) -> pluggy.PluginManager:
    from .features import BUILTIN

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in env_list("MEGATRON_MUSA_PATCH_BLOCK_PLUGINS"):
        pm.set_blocked(name)
    pm.register(_BuiltinDeviceChoice(), name="builtin-device-choice")
    for module in BUILTIN if builtins is None else builtins:
        pm.register(module, name=module.FEATURE)
    if load_entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for name in env_list("MEGATRON_MUSA_PATCH_PLUGINS"):
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ArgumentError(
                f"MEGATRON_MUSA_PATCH_PLUGINS names {name!r}, which cannot be imported ({exc}); "
                f"fix the module name or PYTHONPATH.") from exc
        pm.register(module, name=getattr(module, "FEATURE", name))
    return pm


def feature_names(pm: pluggy.PluginManager) -> List[str]:
    return [name for name, _ in pm.list_name_plugin() if name != "builtin-device-choice"]


def disabled_features(pm: pluggy.PluginManager) -> Set[str]:
    """Features the toggles switch off; unknown names are an error (a typo would be silent)."""
    known = set(feature_names(pm))
    disabled = set(env_list("MEGATRON_MUSA_PATCH_DISABLE"))
    only = set(env_list("MEGATRON_MUSA_PATCH_ONLY")) - {"none"}
    only_set = bool(env_list("MEGATRON_MUSA_PATCH_ONLY"))
    unknown = (disabled | only) - known
    if unknown:
        raise ArgumentError(
            f"MEGATRON_MUSA_PATCH_DISABLE/ONLY name unknown features {sorted(unknown)}; known "
            f"features: {', '.join(sorted(known))}."
        )
    if only_set:
        for name, plugin in pm.list_name_plugin():
            if name in known and name not in only and not getattr(plugin, "REQUIRED", False):
                disabled.add(name)
    return disabled
