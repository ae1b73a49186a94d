"""Patch records and their application.

A feature describes what it changes as :class:`Patch` records; the :class:`Registry` decides
whether each applies (device, feature toggles, condition, verified Megatron version), applies it
when its target module is imported (wrapt post-import hooks: a module imported after activation
is patched as it loads, so a later ``from x import f`` sees the patched ``f``; modules imported
*before* activation hold unpatched copies, which is why activation refuses to run late unless
told to), and keeps one :class:`PatchResult` row per record for ``mmp doctor``. Records that do
not apply on the selected device are registered all the same and shown as skipped.

Kinds:
  * ``wrap``      -- ``impl(wrapped, instance, args, kwargs)`` around the target (wrapt).
  * ``replace``   -- ``impl`` takes the target's place.
  * ``attribute`` -- ``impl`` is set as the value (``create=True`` allows a new name).
  * ``module``    -- ``impl(module)`` fills a stand-in for an upstream module that cannot be
                     imported here (target ``package.module:*``); served only while the real
                     module has not been imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.util
import logging
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import wrapt
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from . import releases, version_ranges, versions
from .errors import PatchError
from .toggles import Toggles

logger = logging.getLogger("megatron_musa_patch")

KINDS = ("wrap", "replace", "attribute", "module")
ALL_DEVICES = frozenset({"musa", "cpu", "cuda"})
APPLIED, DEFERRED, SKIPPED, FAILED = "applied", "deferred", "skipped", "failed"

_MISSING = object()
_PATH_ERRORS: Tuple[type, ...] = (AttributeError,) + tuple(
    e for e in (getattr(wrapt, "PathResolutionError", None),) if e is not None
)


@dataclasses.dataclass(frozen=True)
class Patch:
    """One change to one upstream object."""

    id: str
    target: str  # "package.module:Qual.name"
    kind: str
    impl: Any
    feature: str
    devices: frozenset = ALL_DEVICES
    #: the Megatron versions this record is for (verified on), as ``>=a,<b``; None for
    #: non-Megatron targets (torch). Defaults to the whole support table (releases.py) for
    #: ``megatron.*`` targets. Records of one ``id`` with disjoint ranges are variants of one
    #: logical patch: the one whose range holds the installed release applies.
    megatron: Optional[str] = ""
    #: why the record is not needed on a supported release outside ``megatron`` (e.g. "upstream
    #: fixed it in 0.17.0"); shown by ``mmp doctor``
    outside: str = ""
    #: returns True to apply, False or a reason string to skip; evaluated at application time
    condition: Optional[Callable[[], Union[bool, str]]] = None
    #: a failure raises (device and collective patches): never a half-patched process
    strict: bool = False
    create: bool = False
    #: modules known to hold ``from <target module> import <name>`` copies of the target
    rebind: Tuple[str, ...] = ()
    why: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"patch {self.id}: kind must be one of {KINDS}, not {self.kind!r}")
        if ":" not in self.target:
            raise ValueError(f"patch {self.id}: target must look like 'module:Qual.name'")
        if not set(self.devices) <= ALL_DEVICES:
            raise ValueError(f"patch {self.id}: unknown devices {set(self.devices) - ALL_DEVICES}")
        if self.megatron == "" and self.module.startswith("megatron"):
            object.__setattr__(self, "megatron", releases.VERIFIED_MEGATRON)
        elif self.megatron == "":
            object.__setattr__(self, "megatron", None)
        if self.megatron is not None:
            try:
                version_ranges.interval(self.megatron)
            except (InvalidSpecifier, ValueError) as exc:
                raise ValueError(f"patch {self.id}: bad version range {self.megatron!r}") from exc

    @property
    def key(self) -> Tuple[str, Optional[str]]:
        """Identifies one variant: the logical id and its version range."""
        return (self.id, self.megatron)

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":", 1)[1]


@dataclasses.dataclass
class PatchResult:
    id: str
    target: str
    feature: str
    kind: str
    status: str
    reason: str = ""
    strict: bool = False
    #: the version range, when the id has several variants ("" otherwise)
    variant: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


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
                 version_of: Optional[Callable[[str], Any]] = None):
        self.device = device
        #: module name -> the installed Megatron version its patches are gated on
        self.version_of = version_of or (lambda module: versions.version_for_target(module, None))
        self.toggles = toggles or Toggles(frozenset(), {})
        self.allow_unverified = allow_unverified
        self.active = False
        #: rebind copies in every loaded megatron module (activation after Megatron was imported)
        self.scan_for_copies = False
        self._patches: Dict[tuple, Patch] = {}
        self._results: Dict[tuple, PatchResult] = {}
        self._undo: Dict[tuple, _Undo] = {}
        self._hooked_modules: set = set()

    # ------------------------------------------------------------------ records
    def add(self, patch: Patch) -> None:
        for other in self._variants(patch.id):
            if other.megatron is None or patch.megatron is None or \
                    version_ranges.overlap(other.megatron, patch.megatron):
                raise ValueError(
                    f"patch id {patch.id!r} registered twice for overlapping Megatron ranges "
                    f"({other.megatron} and {patch.megatron}): variants of one patch must not "
                    f"overlap, or the release would have two")
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
        reason = self._gate(patch)
        if reason is not None:
            self._set(patch, SKIPPED, reason)
            return
        verdict = self._version_verdict(patch)
        if verdict is not None:
            status, reason = verdict
            if status == FAILED:
                self._fail(patch, reason)
            else:
                self._set(patch, SKIPPED, reason)
            return
        if patch.kind == "module":
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

    def _gate(self, patch: Patch) -> Optional[str]:
        """Why the patch is not to be applied here, or None."""
        if self.device not in patch.devices:
            return f"not needed on {self.device} (applies on {', '.join(sorted(patch.devices))})"
        if self.toggles.is_off(patch.feature):
            return f"feature '{patch.feature}' {self.toggles.why(patch.feature)}"
        return None

    def _version_verdict(self, patch: Patch) -> Optional[Tuple[str, str]]:
        """None to go on; (SKIPPED, why) for a supported release outside the record's range (a
        variant for another release, a fix upstream has made); (FAILED, why) for a release the
        table does not list. An unlisted release let through by ALLOW_UNVERIFIED is treated as
        the nearest listed one: the records for it are tried."""
        if patch.megatron is None:
            return None
        installed = self.version_of(patch.module)
        if installed is None:
            return None  # nothing installed to check; a missing module simply stays deferred
        which = versions.gating_distribution(patch.module)
        effective = installed
        if releases.release_of(installed) is None:
            if not self.allow_unverified:
                return FAILED, (
                    f"patch '{patch.id}' (feature '{patch.feature}') was verified on {which} "
                    f"{releases.VERIFIED_MEGATRON} ({releases.tags()}) but {installed} is "
                    f"installed; install a supported release, or set "
                    f"MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1 to try it anyway")
            newest = releases.newest()
            effective = Version(newest.first if releases.newer_than_table(installed)
                                else releases.oldest().first)
        if effective in SpecifierSet(patch.megatron, prereleases=True):
            return None
        note = f": {patch.outside}" if patch.outside else ""
        return SKIPPED, f"for {which} {patch.megatron}, not {installed}{note}"

    def _apply(self, patch: Patch, module) -> None:
        if patch.key in self._undo:
            return
        if patch.condition is not None:
            verdict = patch.condition()
            if verdict is not True:
                self._set(patch, SKIPPED, verdict if isinstance(verdict, str) else "condition false")
                return
        try:
            parent, attribute, original = self._resolve(module, patch)
        except _PATH_ERRORS as exc:
            installed = self.version_of(patch.module)
            self._fail(
                patch,
                f"patch '{patch.id}' (feature '{patch.feature}'): target {patch.target} does not "
                f"exist in the installed Megatron ({installed or 'version unknown'}; verified on "
                f"{patch.megatron or 'any'}): {exc}. Upstream renamed or removed it; pin a "
                f"verified Megatron version or switch the feature off with "
                f"MEGATRON_MUSA_PATCH_DISABLE={patch.feature}",
            )
            return
        if patch.kind == "wrap":
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
        self._set(patch, APPLIED, patch.why)
        logger.debug("applied %s on %s", patch.id, patch.target)

    def _install_stand_in(self, patch: Patch) -> None:
        if patch.condition is not None:
            verdict = patch.condition()
            if verdict is not True:
                self._set(patch, SKIPPED, verdict if isinstance(verdict, str) else "condition false")
                return
        if patch.module in sys.modules:
            self._set(patch, SKIPPED, f"{patch.module} is already imported: no stand-in needed")
            return
        finder = _StandInFinder(patch.module, patch.impl)
        sys.meta_path.insert(0, finder)
        self._undo[patch.key] = _Undo(sys.meta_path, "", finder, [])
        self._set(patch, APPLIED, patch.why)

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
        variant = patch.megatron or "" if len(self._variants(patch.id)) > 1 else ""
        self._results[patch.key] = PatchResult(
            patch.id, patch.target, patch.feature, patch.kind, status, reason, patch.strict,
            variant)
        if variant:  # a second variant arrived: the first one's row names its range too
            for other in self._variants(patch.id):
                row = self._results.get(other.key)
                if row is not None and not row.variant:
                    row.variant = other.megatron or ""

    # ------------------------------------------------------------------ undo
    def unpatch(self, ids: Optional[Iterable[str]] = None) -> None:
        """Undo applied patches (all by default; ``ids``: logical ids), newest first."""
        wanted = None if ids is None else set(ids)
        chosen = [k for k in self._undo if wanted is None or k[0] in wanted]
        for key in reversed(chosen):
            undo = self._undo.pop(key)
            if isinstance(undo.previous, _StandInFinder):
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
        return next((r for r in rows if r.status == APPLIED), rows[0])

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
        "stand-in", detail). Imports the target module; changes nothing."""
        if patch.kind == "module":
            try:
                exists = importlib.util.find_spec(patch.module) is not None
            except (ImportError, ValueError):
                exists = False
            verdict = patch.condition() if patch.condition is not None else True
            if verdict is True:
                return "stand-in", ("served in place of upstream's module" if exists else
                                    "upstream has no such module here: the stand-in serves it")
            return ("resolved", f"upstream's module is used ({verdict})") if exists else \
                ("missing", f"no such module, and the stand-in is not served ({verdict})")
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


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
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

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        module = sys.modules.get(self.name)
        if module is not None and getattr(module.__spec__, "loader", None) is self:
            del sys.modules[self.name]
