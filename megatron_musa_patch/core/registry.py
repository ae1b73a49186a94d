"""Patch records and their application.

A feature describes what it changes as :class:`Patch` records; the :class:`Registry` decides
whether each applies (device, feature toggles, condition, and the megatron-core and torch ranges
it was verified on: ``verdict``), applies it when its target module is imported (wrapt
post-import hooks: a module imported after activation is patched as it loads, so a later
``from x import f`` sees the patched ``f``; modules imported *before* activation hold unpatched
copies, which is why activation refuses to run late unless told to), and keeps one
:class:`PatchResult` row per record for ``mmp doctor``. Records that do not apply on the selected
device are registered all the same and shown as skipped; a record tried on a release it was not
verified on is shown as ``unverified``.

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
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import wrapt

from .errors import PatchError, PluginError
from .toggles import Toggles
from megatron_musa_patch.upstream import installed, ranges, tables, targets
from megatron_musa_patch.upstream.ranges import Range

logger = logging.getLogger("megatron_musa_patch")

KINDS = ("wrap", "replace", "attribute", "module")
APPLIED, DEFERRED, SKIPPED, FAILED = "applied", "deferred", "skipped", "failed"
#: applied on a release outside the record's verified range (a release added to a table since,
#: or one outside the tables under MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED)
UNVERIFIED = "unverified"
#: the statuses of a record that is in effect
IN_EFFECT = (APPLIED, UNVERIFIED)

_MISSING = object()
_PATH_ERRORS: Tuple[type, ...] = (AttributeError,) + tuple(
    e for e in (getattr(wrapt, "PathResolutionError", None),) if e is not None
)


class RecordError(PluginError, ValueError):
    """A patch record that cannot be made (a plugin author's mistake): one paragraph."""


@dataclasses.dataclass(frozen=True)
class Patch:
    """One change to one upstream object."""

    id: str
    target: str  # "package.module:Qual.name"
    kind: str
    impl: Any
    feature: str
    #: the device rows the record is for (names from the device table); None: every row
    devices: Optional[frozenset] = None
    #: the megatron-core releases the record applies to and was verified on, a range with both
    #: bounds (``">=0.16.1,<0.20"``, ``upstream/ranges.py``): the lower bound is where it starts
    #: to apply, the upper the first release it was not verified on. A release after it shows
    #: the record as unverified (tried, and reported) until someone re-verifies it and moves
    #: the bound. Records of one ``id`` with disjoint ranges are variants of one logical patch:
    #: the one whose range holds the installed release applies.
    megatron: str = dataclasses.field(default="", kw_only=True)
    #: the torch releases likewise; required for records that patch torch and for those whose
    #: code reaches torch's private names (``tests/unit/test_compatibility.py``)
    torch: Optional[str] = dataclasses.field(default=None, kw_only=True)
    #: why the record is not needed from its upper bound on (upstream fixed or removed what it
    #: patches): a later release then skips it instead of trying it unverified
    ends: str = dataclasses.field(default="", kw_only=True)
    #: why nothing is needed before its lower bound (shown by ``mmp doctor``)
    starts: str = dataclasses.field(default="", kw_only=True)
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
            raise RecordError(f"patch {self.id}: kind must be one of {KINDS}, not {self.kind!r}")
        if ":" not in self.target:
            raise RecordError(f"patch {self.id}: target must look like 'module:Qual.name'")
        _check_range(self, "megatron", self.megatron, tables.MEGATRON)
        if self.torch is None and self.module.split(".")[0] == "torch":
            raise RecordError(
                f"patch {self.id} (feature '{self.feature}') patches torch ({self.target}) but "
                f"names no torch range: give torch='{tables.TORCH_SUPPORTED}' or the releases it "
                f"was verified on")
        if self.torch is not None:
            _check_range(self, "torch", self.torch, tables.TORCH)

    def for_device(self, name: str) -> bool:
        return self.devices is None or name in self.devices

    @property
    def key(self) -> Tuple[str, str, Optional[str]]:
        """Identifies one variant: the logical id and its version ranges."""
        return (self.id, self.megatron, self.torch)

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":", 1)[1]


def _check_range(patch: Patch, name: str, spec: Optional[str], table) -> None:
    example = tables.span(table)
    if not spec:
        raise RecordError(
            f"patch {patch.id} (feature '{patch.feature}') names no {name} range: records declare "
            f"the releases they were verified on, e.g. {name}='{example}' (upstream/tables.py)")
    try:
        bounds = Range.parse(spec)
    except ValueError as exc:
        raise RecordError(f"patch {patch.id}: bad {name} range {spec!r}: {exc}") from exc
    if not bounds.bounded:
        raise RecordError(
            f"patch {patch.id} (feature '{patch.feature}'): the {name} range {spec!r} needs both "
            f"bounds (the upper is the first release it was not verified on), e.g. {example!r}")


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
    #: the megatron-core and torch releases the record was verified on
    megatron: str = ""
    torch: str = ""

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
                 version_of: Optional[Callable[[str], Any]] = None,
                 torch_version: Any = _MISSING, rows: Sequence[str] = ()):
        self.device = device
        #: the device table's row names (activation hands them down), for the records'
        #: ``devices``; empty: not checked (unit tests' registries)
        self.rows = tuple(rows)
        #: module name -> the installed Megatron version its patches are gated on
        self.version_of = version_of or (lambda module: installed.version_for_target(module, None))
        #: the installed torch, which torch ranges are gated on
        self.torch_version = installed.torch_version() if torch_version is _MISSING \
            else torch_version
        self.toggles = toggles or Toggles(frozenset(), {})
        self.allow_unverified = allow_unverified
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
            if _overlap(other.megatron, patch.megatron) and _overlap(other.torch, patch.torch):
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
        reason = self._gate(patch)
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
        if not patch.for_device(self.device):
            return f"not needed on {self.device} (applies on {', '.join(sorted(patch.devices))})"
        if self.toggles.is_off(patch.feature):
            return f"feature '{patch.feature}' {self.toggles.why(patch.feature)}"
        return None

    def verdict(self, patch: Patch) -> Tuple[str, str]:
        """Whether ``patch`` is meant for the installed releases, whatever the device and
        toggles: (APPLIED, "") where both its ranges hold, (UNVERIFIED, why) where it is tried
        on a release it was not verified on, (SKIPPED, why) where it is not for this release,
        (FAILED, why) on a release outside a table unless ALLOW_UNVERIFIED."""
        verdicts = [self._range_verdict(patch, "megatron", patch.megatron,
                                        self.version_of(patch.module),
                                        installed.gating_distribution(patch.module),
                                        tables.MEGATRON)]
        if patch.torch is not None:
            verdicts.append(self._range_verdict(patch, "torch", patch.torch, self.torch_version,
                                                "torch", tables.TORCH))
        for status in (FAILED, SKIPPED, UNVERIFIED):
            reasons = [why for verdict, why in verdicts if verdict == status]
            if reasons:
                return status, "; ".join(reasons)
        return APPLIED, ""

    def _range_verdict(self, patch: Patch, dimension: str, spec: str, version, which: str,
                       table) -> Tuple[str, str]:
        """One range of ``patch`` against the installed ``version`` of ``which``.

        A release outside the table is refused, or (ALLOW_UNVERIFIED) taken as the table's
        nearest release and the record is unverified. Inside the table: before the range, the
        record is skipped; after it, skipped when upstream made it unnecessary (``ends``) or a
        newer variant takes over, and otherwise tried unverified -- a release the table gained
        since the record was verified."""
        if version is None:
            return APPLIED, ""  # nothing installed to check; a missing module stays deferred
        effective, outside_table = version, ranges.row_of(table, version) is None
        if outside_table:
            if not self.allow_unverified:
                return FAILED, (
                    f"patch '{patch.id}' (feature '{patch.feature}') was verified on {which} "
                    f"{spec} but {version} is installed, outside the supported "
                    f"{tables.span(table)}; install a supported release, or set "
                    f"MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1 to try it anyway")
            effective = ranges.text(ranges.nearest(table, version))
        bounds = Range.parse(spec)
        if effective in bounds:
            if not outside_table:
                return APPLIED, ""
            return UNVERIFIED, (f"{which} {version} is outside the support table: tried as "
                                f"{effective}, verified on {spec}")
        if bounds.below(effective):
            note = f": {patch.starts}" if patch.starts else ""
            return SKIPPED, f"for {which} {spec}, not {version}{note}"
        if patch.ends:
            return SKIPPED, f"for {which} {spec}, not {version}: {patch.ends}"
        if any(Range.parse(getattr(other, dimension) or spec).low > bounds.low
               for other in self._variants(patch.id) if other is not patch):
            return SKIPPED, f"for {which} {spec}, not {version} (a newer variant applies)"
        return UNVERIFIED, (f"verified on {which} {spec}, not on the installed {version}: "
                            f"re-verify it and move the bound (docs/compatibility.md)")

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
            version = self.version_of(patch.module)
            self._fail(
                patch,
                f"patch '{patch.id}' (feature '{patch.feature}'): target {patch.target} does not "
                f"exist in the installed Megatron ({version or 'version unknown'}; verified on "
                f"{patch.megatron}): {exc}. Upstream renamed or removed it; pin a "
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
        self._set_in_effect(patch)
        logger.debug("applied %s on %s", patch.id, patch.target)

    def _set_in_effect(self, patch: Patch) -> None:
        unverified = self._unverified.get(patch.key)
        if unverified is None:
            self._set(patch, APPLIED, patch.why)
        else:
            self._set(patch, UNVERIFIED, unverified)

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


def patches_at(name: str, patch_id: str, kind: str, impl, feature: str, *, megatron: str,
               attribute: str = "", **fields) -> list:
    """The records of one patch on the logical target ``name``: one variant per location that
    the feature's verified range ``megatron`` reaches, each cut to it (``impl`` may map each
    location's flavour to its implementation; ``attribute`` names the attribute when ``name``
    is a module). The releases after a name was removed skip the patch with the reason in
    ``upstream/targets.py``'s ``GONE``."""
    extra_rebind = tuple(fields.pop("rebind", ()))
    ends = fields.pop("ends", "")
    verified = Range.parse(megatron)
    out = []
    for location in targets.variants(name):
        where = Range.parse(location.range)
        if not where.overlaps(verified):
            continue
        chosen = impl[location.flavour] if isinstance(impl, dict) else impl
        target = f"{location.target}:{attribute}" if attribute else location.target
        out.append(Patch(patch_id, target, kind, chosen, feature,
                         megatron=where.intersection(verified).spec,
                         ends=(ends or targets.gone(name)) if where.high is not None else ends,
                         rebind=extra_rebind + location.rebind, **fields))
    return out


def _overlap(a: Optional[str], b: Optional[str]) -> bool:
    """Two ranges of one dimension share a release (no range: every release)."""
    return a is None or b is None or Range.parse(a).overlaps(Range.parse(b))


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
