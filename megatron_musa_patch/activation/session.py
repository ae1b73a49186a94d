"""The state of one activation, handed to every hook (as pytest hands ``config`` to its hooks).

A :class:`Session` holds what a run decided once -- the settings, the device mapping, the
registry of patch records, the plugin manager, the Megatron-LM checkout -- and the per-run state
features keep (flag owners, warnings already given, what the throughput log resolved). Features
receive it as the ``session`` argument of their hooks and bind it into the patches they register;
they never fetch it from a global. ``deactivate()`` drops the session and everything in it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ..core.flag_needs import unavailable_error
from ..core.settings import Settings
from megatron_musa_patch.upstream import installed


@dataclasses.dataclass(eq=False)
class Session:
    settings: Settings
    #: the selected device (``device.base.DeviceMapping``)
    device: Any
    #: the patch records (``registry.Registry``)
    registry: Any
    #: the plugin manager (``pluggy.PluginManager``) with every feature registered
    plugins: Any
    #: Megatron modules that were imported before activation (patched late, copies rebound)
    late_modules: List[str] = dataclasses.field(default_factory=list)
    #: the Megatron-LM checkout: MEGATRON_LM_PATH, or one found on sys.path
    lm_path: Optional[Path] = None
    #: who maps torch's CUDA spellings (``device.adapter``): torchada on the musa row, else the
    #: layer's built-in mapping; it decides which torch-level records apply
    torch_mapping: Any = None
    #: feature -> the argparse actions its ``mmp_add_arguments`` added
    flag_owners: Dict[str, list] = dataclasses.field(default_factory=dict)
    #: dest -> default of every action of Megatron's parser in this run (Megatron's groups, the
    #: script's and the plugins'), recorded when Megatron parses the arguments
    argument_defaults: Dict[str, Any] = dataclasses.field(default_factory=dict)
    #: option string (``--num-layers``) -> dest, for the same parser
    argument_flags: Dict[str, str] = dataclasses.field(default_factory=dict)
    table_logged: bool = False
    _states: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.torch_mapping is None:
            # imported here: the device package imports torch, and importing the package
            # without activating it must not import torch
            from megatron_musa_patch.device.adapter import BuiltinMapping

            self.torch_mapping = BuiltinMapping(self.device.name)

    # ------------------------------------------------------------------ per-run state
    def state_for(self, key: str, factory: Callable[[], Any] = dict) -> Any:
        """The per-run state object a feature keeps under ``key`` (made by ``factory`` once)."""
        try:
            return self._states[key]
        except KeyError:
            value = self._states[key] = factory()
            return value

    # ------------------------------------------------------------------ versions
    def version_of(self, module: str):
        """The installed Megatron version that patches on ``module`` are gated on."""
        return installed.version_for_target(module, self.lm_path)

    def versions(self) -> dict:
        return installed.summary(self.lm_path)

    def upstream(self, fact: str, module: str = "megatron.core") -> bool:
        """Whether the installed Megatron has the behaviour ``fact`` (``upstream.facts``)."""
        from megatron_musa_patch.upstream import facts

        return facts.holds(fact, self.version_of(module))

    # ------------------------------------------------------------------ features
    def why_unavailable(self, feature: str) -> Optional[str]:
        return self.registry.why_unavailable(feature)

    def require(self, feature: str, flag: str, because: str = "", instead: str = "") -> None:
        """Raise the flag-needs-feature paragraph when ``feature`` cannot serve ``flag``."""
        why = self.why_unavailable(feature)
        if why is not None:
            raise unavailable_error(flag, feature, why, because, instead)

    # ------------------------------------------------------------------ reporting
    @staticmethod
    def is_rank_zero() -> bool:
        return os.environ.get("RANK", "0") == "0"

    def log_table_once(self) -> None:
        """What rank 0 says about the layer, once (when Megatron's modules are imported): one
        line, or with ``MEGATRON_MUSA_PATCH_LOG=full`` or a failed patch the whole table."""
        if self.table_logged:
            return
        self.table_logged = True
        if self.is_rank_zero():
            from ..core.results import FAILED
            from ..core.table import render_table, summary

            failed = any(r.status == FAILED for r in self.registry.results())
            if self.settings.log == "full" or failed:
                print(render_table(self, collapse=True), flush=True)
            else:
                print(summary(self), flush=True)
