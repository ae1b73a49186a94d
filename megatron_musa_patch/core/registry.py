"""The records of one run, applied and undone.

A feature describes what it changes as :class:`~.records.Patch` records; the :class:`Registry`
asks its :class:`~.gate.Gate` whether each applies (device, feature toggles, condition, and the
megatron-core and torch ranges it was verified on), applies it when its target module is imported
(wrapt post-import hooks: a module imported after activation is patched as it loads, so a later
``from x import f`` sees the patched ``f``; modules imported *before* activation hold unpatched
copies, which is why activation refuses to run late unless told to), and keeps one
:class:`~.results.PatchResult` row per record for ``mmp doctor``. Records that do not apply on
the selected device are registered all the same and shown as skipped; a record tried on a
release it was not verified on is shown as ``unverified``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import wrapt

from megatron_musa_patch.base.errors import PatchError
from .gate import Gate
from .records import Kind, Patch, RecordError, overlap
from .results import APPLIED, DEFERRED, FAILED, IN_EFFECT, SKIPPED, UNVERIFIED, PatchResult
from .standins import StandInFinder
from .toggles import Toggles
from megatron_musa_patch.upstream import installed

logger = logging.getLogger("megatron_musa_patch")

_MISSING = object()
_PATH_ERRORS: Tuple[type, ...] = (AttributeError,) + tuple(
    e for e in (getattr(wrapt, "PathResolutionError", None),) if e is not None
)


@dataclasses.dataclass
class _Undo:
    parent: Any
    attribute: str
    previous: Any  # raw value from the parent's __dict__, or _MISSING if inherited/absent
    rebinds: List[Tuple[Any, str, Any]]


class Registry:
    """Holds records, applies them on import, reports, and can undo them (for tests)."""

    def __init__(self, device: str, toggles: Optional[Toggles] = None,
                 allow_unverified: bool = False,
                 version_of: Optional[Callable[[str], Any]] = None,
                 torch_version: Any = _MISSING, rows: Sequence[str] = ()):
        self.device = device
        #: the device table's row names (activation hands them down), for the records'
        #: ``devices``; empty: not checked (unit tests' registries)
        self.rows = tuple(rows)
        self.toggles = toggles or Toggles(frozenset(), {})
        self.gate = Gate(
            device, self.toggles,
            version_of or (lambda module: installed.version_for_target(module, None)),
            installed.torch_version() if torch_version is _MISSING else torch_version,
            allow_unverified)
        self.active = False
        #: rebind copies in every loaded megatron module (activation after Megatron was imported)
        self.scan_for_copies = False
        self._patches: Dict[tuple, Patch] = {}
        self._results: Dict[tuple, PatchResult] = {}
        self._undo: Dict[tuple, _Undo] = {}
        self._hooked_modules: set = set()
        #: key -> why a record that is being applied is unverified here
        self._unverified: Dict[tuple, str] = {}

    # ------------------------------------------------------------------ records
    def add(self, patch: Patch) -> None:
        if self.rows and patch.devices is not None and not patch.devices <= set(self.rows):
            raise RecordError(f"patch {patch.id}: unknown devices "
                              f"{sorted(patch.devices - set(self.rows))} (the device rows: "
                              f"{', '.join(self.rows)})")
        for other in self._variants(patch.id):
            if overlap(other.megatron, patch.megatron) and overlap(other.torch, patch.torch):
                raise ValueError(
                    f"patch id {patch.id!r} registered twice for overlapping ranges (megatron "
                    f"{other.megatron} and {patch.megatron}, torch {other.torch or 'any'} and "
                    f"{patch.torch or 'any'}): variants of one patch must not overlap, or a "
                    f"release would have two")
        self._patches[patch.key] = patch
        self._set(patch, DEFERRED, f"waiting for `import {patch.module}`")
        if self.active:
            self._schedule(patch)

    def extend(self, patches: Iterable[Patch]) -> None:
        for patch in patches:
            self.add(patch)

    def patches(self) -> List[Patch]:
        return list(self._patches.values())

    def _variants(self, patch_id: str) -> List[Patch]:
        return [p for p in self._patches.values() if p.id == patch_id]

    # ------------------------------------------------------------------ applying
    def activate(self) -> None:
        """Apply what can be applied now; hook the imports of the rest. Idempotent."""
        if self.active:
            return
        self.active = True
        for patch in list(self._patches.values()):
            self._schedule(patch)

    def _schedule(self, patch: Patch) -> None:
        reason = self.gate.off_reason(patch)
        if reason is not None:
            self._set(patch, SKIPPED, reason)
            return
        self._unverified.pop(patch.key, None)
        status, reason = self.verdict(patch)
        if status == FAILED:
            self._fail(patch, reason)
            return
        if status == SKIPPED:
            self._set(patch, SKIPPED, reason)
            return
        if status == UNVERIFIED:
            self._unverified[patch.key] = reason
        if patch.kind is Kind.MODULE:
            self._install_stand_in(patch)
        elif patch.module in sys.modules:
            self._apply(patch, sys.modules[patch.module])
        elif patch.module not in self._hooked_modules:
            self._hooked_modules.add(patch.module)
            wrapt.register_post_import_hook(self._on_import, patch.module)

    def _on_import(self, module) -> None:
        if not self.active:
            return
        for patch in list(self._patches.values()):
            if patch.module == module.__name__ and self._results[patch.key].status == DEFERRED:
                self._apply(patch, module)

    def preview(self, where: str) -> None:
        """Each record's status as far as it can be told without applying it (records applied
        in another process, ``where``): skipped, failed or unverified here with the reason, and
        otherwise deferred to ``where``."""
        for patch in self._patches.values():
            reason = self.gate.off_reason(patch)
            if reason is not None:
                self._set(patch, SKIPPED, reason)
                continue
            status, reason = self.verdict(patch)
            if status in (FAILED, SKIPPED):
                self._set(patch, status, reason)
            else:
                self._set(patch, DEFERRED, f"applied {where}" + (
                    f"; unverified here: {reason}" if status == UNVERIFIED else ""))

    def verdict(self, patch: Patch) -> Tuple[str, str]:
        """Whether ``patch`` is meant for the installed releases (:meth:`Gate.verdict`)."""
        return self.gate.verdict(patch, self._variants(patch.id))

    def _apply(self, patch: Patch, module) -> None:
        if patch.key in self._undo:
            return
        skip = self.gate.condition_reason(patch)
        if skip is not None:
            self._set(patch, SKIPPED, skip)
            return
        try:
            parent, attribute, original = self._resolve(module, patch)
        except _PATH_ERRORS as exc:
            version = self.gate.version_of(patch.module)
            self._fail(
                patch,
                f"patch '{patch.id}' (feature '{patch.feature}'): target {patch.target} does not "
                f"exist in the installed Megatron ({version or 'version unknown'}; verified on "
                f"{patch.megatron}): {exc}. Upstream renamed or removed it; pin a "
                f"verified Megatron version or switch the feature off with "
                f"MEGATRON_MUSA_PATCH_DISABLE={patch.feature}",
            )
            return
        if patch.kind is Kind.WRAP:
            if not callable(original) and not hasattr(original, "__get__"):
                self._fail(patch, f"patch '{patch.id}': {patch.target} is not callable")
                return
            new = wrapt.FunctionWrapper(original, patch.impl)
        else:
            new = patch.impl
        previous = vars(parent).get(attribute, _MISSING) if hasattr(parent, "__dict__") else _MISSING
        setattr(parent, attribute, new)
        rebinds = self._rebind(patch, original, new) if original is not _MISSING else []
        self._undo[patch.key] = _Undo(parent, attribute, previous, rebinds)
        self._set_in_effect(patch)
        logger.debug("applied %s on %s", patch.id, patch.target)

    def _set_in_effect(self, patch: Patch) -> None:
        unverified = self._unverified.get(patch.key)
        if unverified is None:
            self._set(patch, APPLIED, patch.why)
        else:
            self._set(patch, UNVERIFIED, unverified)

    def _install_stand_in(self, patch: Patch) -> None:
        skip = self.gate.condition_reason(patch)
        if skip is not None:
            self._set(patch, SKIPPED, skip)
            return
        if patch.module in sys.modules:
            self._set(patch, SKIPPED, f"{patch.module} is already imported: no stand-in needed")
            return
        finder = StandInFinder(patch.module, patch.impl)
        sys.meta_path.insert(0, finder)
        self._undo[patch.key] = _Undo(sys.meta_path, "", finder, [])
        self._set_in_effect(patch)

    @staticmethod
    def _resolve(module, patch: Patch):
        *owner_path, attribute = patch.qualname.split(".")
        parent = module
        for name in owner_path:
            parent = getattr(parent, name)
        if patch.create:
            return parent, attribute, getattr(parent, attribute, _MISSING)
        return wrapt.resolve_path(parent, attribute)

    def _rebind(self, patch: Patch, original, new) -> List[Tuple[Any, str, Any]]:
        names = list(patch.rebind)
        if self.scan_for_copies:
            names += [n for n in list(sys.modules) if n.startswith("megatron.") or n == "__main__"]
        done = []
        for name in dict.fromkeys(names):
            mod = sys.modules.get(name)
            if mod is None or mod.__name__ == patch.module:
                continue
            for key, value in list(vars(mod).items()):
                if value is original:
                    setattr(mod, key, new)
                    done.append((mod, key, original))
        return done

    def _fail(self, patch: Patch, reason: str) -> None:
        self._set(patch, FAILED, reason)
        if patch.strict:
            raise PatchError(reason)
        logger.warning("megatron_musa_patch: %s", reason)

    def _set(self, patch: Patch, status: str, reason: str) -> None:
        self._results[patch.key] = PatchResult(
            patch.id, patch.target, patch.feature, patch.kind, status, reason, patch.strict,
            self._variant_label(patch), patch.megatron, patch.torch or "")
        if len(self._variants(patch.id)) > 1:  # a variant arrived: each row names its range
            for other in self._variants(patch.id):
                row = self._results.get(other.key)
                if row is not None:
                    row.variant = self._variant_label(other)

    def _variant_label(self, patch: Patch) -> str:
        """The ranges that tell the variants of ``patch.id`` apart ("" for a single record)."""
        others = [p for p in self._variants(patch.id) if p is not patch]
        parts = []
        if any(p.megatron != patch.megatron for p in others):
            parts.append(patch.megatron)
        if any(p.torch != patch.torch for p in others):
            parts.append(f"torch{patch.torch or ' any'}")
        return " ".join(parts)

    # ------------------------------------------------------------------ undo
    def unpatch(self, ids: Optional[Iterable[str]] = None) -> None:
        """Undo applied patches (all by default; ``ids``: logical ids), newest first."""
        wanted = None if ids is None else set(ids)
        chosen = [k for k in self._undo if wanted is None or k[0] in wanted]
        for key in reversed(chosen):
            undo = self._undo.pop(key)
            if isinstance(undo.previous, StandInFinder):
                undo.previous.remove()
                self._set(self._patches[key], DEFERRED, "unpatched")
                continue
            for mod, name, old in undo.rebinds:
                setattr(mod, name, old)
            if undo.previous is _MISSING:
                try:
                    delattr(undo.parent, undo.attribute)
                except AttributeError:
                    pass
            else:
                setattr(undo.parent, undo.attribute, undo.previous)
            self._set(self._patches[key], DEFERRED, "unpatched")
        if ids is None:
            self.active = False

    # ------------------------------------------------------------------ reporting
    def results(self) -> List[PatchResult]:
        return [self._results[k] for k in self._patches]

    def result(self, patch_id: str) -> PatchResult:
        """The row of ``patch_id``: its applied variant, else its first one."""
        rows = [self._results[p.key] for p in self._variants(patch_id)]
        if not rows:
            raise KeyError(patch_id)
        return next((r for r in rows if r.status in IN_EFFECT), rows[0])

    def devices_of(self, patch: Patch) -> List[str]:
        """The rows ``patch`` is for, by name."""
        return sorted(self.rows if patch.devices is None else patch.devices)

    def switched_off(self, feature: str) -> bool:
        return self.toggles.is_off(feature)

    def feature_problems(self, feature: str) -> List[str]:
        """Reasons the feature's patches failed (empty: usable as far as patches go)."""
        return [r.reason for r in self.results() if r.feature == feature and r.status == FAILED]

    def why_unavailable(self, feature: str) -> Optional[str]:
        """Why the feature cannot serve its flags ("is switched off ...", "did not apply: ..."),
        or None when it can."""
        if self.toggles.is_off(feature):
            return f"is {self.toggles.why(feature)}"
        problems = self.feature_problems(feature)
        return f"did not apply: {problems[0]}" if problems else None

    # ------------------------------------------------------------------ resolving all
    def resolve(self, patch: Patch) -> Tuple[str, str]:
        """Whether ``patch``'s target exists in the installed release, whatever the device
        (``mmp patches --resolve-all``): ("resolved" | "missing" | "not importable" |
        "stand-in" | "not installed", detail). Imports the target module; changes nothing."""
        if patch.kind is Kind.MODULE:
            try:
                exists = importlib.util.find_spec(patch.module) is not None
            except (ImportError, ValueError):
                exists = False
            skip = self.gate.condition_reason(patch)
            if skip is None:
                return "stand-in", ("served in place of upstream's module" if exists else
                                    "upstream has no such module here: the stand-in serves it")
            return ("resolved", f"upstream's module is used ({skip})") if exists else \
                ("missing", f"no such module, and the stand-in is not served ({skip})")
        name, _ = patch.distribution_range
        if name and installed.distribution_version(name) is None:
            return "not installed", f"{name} is not installed (the record waits for its import)"
        try:
            module = importlib.import_module(patch.module)
        except Exception as exc:  # noqa: BLE001 - reported, this is a diagnostic
            return "not importable", f"{type(exc).__name__}: {exc}"
        if patch.create:
            return "resolved", "a name the patch creates"
        try:
            self._resolve(module, patch)
        except _PATH_ERRORS as exc:
            return "missing", str(exc)
        return "resolved", ""
