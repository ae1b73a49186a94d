"""Patch records: what a feature changes in upstream, as data.

Kinds (:class:`Kind`):
  * ``wrap``      -- ``impl(wrapped, instance, args, kwargs)`` around the target (wrapt).
  * ``replace``   -- ``impl`` takes the target's place.
  * ``attribute`` -- ``impl`` is set as the value (``create=True`` allows a new name).
  * ``module``    -- ``impl(module)`` fills a stand-in for an upstream module that cannot be
                     imported here (target ``package.module:*``); served only while the real
                     module has not been imported.

A record declares the releases it was verified on; a built-in feature's record takes what it
leaves open from the layer's (``VERIFIED``: the ranges ``upstream/tables.py`` moves when a
release is verified as a whole, through ``Feature.patch``). :func:`patches_at` makes one record
per location a renamed upstream object had across the releases (``upstream/targets.py``).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Optional, Tuple, Union

from megatron_musa_patch.base.errors import PluginError
from megatron_musa_patch.upstream import tables, targets
from megatron_musa_patch.upstream.ranges import Range, completed

#: for a built-in feature's record (``Feature.patch``): the layer's verified range
#: (``tables.MEGATRON_VERIFIED`` / ``TORCH_VERIFIED``), what a record that says nothing of
#: megatron-core gets and what ``torch=VERIFIED`` asks for
VERIFIED = "verified"


class Kind(str, enum.Enum):
    WRAP = "wrap"
    REPLACE = "replace"
    ATTRIBUTE = "attribute"
    MODULE = "module"

    # printed and compared as the plain word ("wrap"), in tables, JSON and f-strings alike
    __str__ = str.__str__
    __format__ = str.__format__


class RecordError(PluginError, ValueError):
    """A patch record that cannot be made (a plugin author's mistake): one paragraph."""


@dataclasses.dataclass(frozen=True)
class Patch:
    """One change to one upstream object."""

    id: str
    target: str  # "package.module:Qual.name"
    kind: Kind
    impl: Any
    feature: str
    #: the device rows the record is for (names from the device table); None: every row
    devices: Optional[frozenset] = None
    #: the megatron-core releases the record applies to and was verified on
    #: (``upstream/ranges.py``), with both bounds: the lower bound is where it starts to apply,
    #: the upper the first release it was not verified on. A release after it shows the record
    #: as unverified (tried, and reported) until someone re-verifies it. Records of one ``id``
    #: with disjoint ranges are variants of one logical patch: the one whose range holds the
    #: installed release applies. A built-in feature's record leaves to ``Feature.patch`` what
    #: it does not say (:func:`layer_range`).
    megatron: str = dataclasses.field(default="", kw_only=True)
    #: the torch releases likewise; required for records that patch torch and for those whose
    #: code reaches torch's private names (``tests/upstream/test_compatibility.py``); None: not
    #: gated on torch
    torch: Optional[str] = dataclasses.field(default=None, kw_only=True)
    #: the third-party package the target belongs to and the releases the record was verified
    #: with, as a requirement (``"dlrover==0.6.1"``): another installed release shows it as
    #: unverified; where the package is not installed, its module is never imported
    distribution: str = dataclasses.field(default="", kw_only=True)
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
        try:
            object.__setattr__(self, "kind", Kind(self.kind))
        except ValueError:
            raise RecordError(f"patch {self.id}: kind must be one of "
                              f"{tuple(k.value for k in Kind)}, not {self.kind!r}") from None
        if ":" not in self.target:
            raise RecordError(f"patch {self.id}: target must look like 'module:Qual.name'")
        _check_range(self, "megatron", self.megatron, tables.MEGATRON)
        if self.torch is None and self.module.split(".")[0] == "torch":
            raise RecordError(
                f"patch {self.id} (feature '{self.feature}') patches torch ({self.target}) but "
                f"names no torch range: give the releases it was verified on, e.g. "
                f"torch='{tables.TORCH_VERIFIED}' (a built-in feature: torch=VERIFIED)")
        if self.distribution:
            try:
                _, spec = self.distribution_range
                if not Range.parse(spec).bounded:
                    raise ValueError("it needs the releases it was verified with, e.g. ==1.2.3")
            except ValueError as exc:  # packaging's InvalidRequirement is one
                raise RecordError(f"patch {self.id}: bad distribution {self.distribution!r}: "
                                  f"{exc}") from exc
        if self.torch is not None:
            _check_range(self, "torch", self.torch, tables.TORCH)

    @property
    def distribution_range(self) -> Tuple[str, str]:
        """(name, range) of ``distribution``; ("", "") for none."""
        if not self.distribution:
            return "", ""
        from packaging.requirements import Requirement

        requirement = Requirement(self.distribution)
        return requirement.name, str(requirement.specifier)

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


def layer_range(spec: Optional[str], verified: str) -> Optional[str]:
    """A built-in record's range as written, with what it leaves open taken from the layer's
    verified range ``verified``: ``VERIFIED`` is that range, ``">=0.17.1"`` starts at 0.17.1 and
    was verified as far as the layer was, an upper bound below the layer's says the record was
    verified on less. None and "" stay (not gated; refused)."""
    if spec == VERIFIED:
        return verified
    if not spec:
        return spec
    try:
        return completed(spec, verified)
    except ValueError:
        return spec  # the record refuses it with the paragraph


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
    if bounds.bounded and bounds.empty():
        raise RecordError(
            f"patch {patch.id} (feature '{patch.feature}'): the {name} range {spec!r} holds no "
            f"release (a lower bound past the layer's verified range ends where it starts)")
    if not bounds.bounded:
        raise RecordError(
            f"patch {patch.id} (feature '{patch.feature}'): the {name} range {spec!r} needs both "
            f"bounds (the upper is the first release it was not verified on), e.g. {example!r}")


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


def overlap(a: Optional[str], b: Optional[str]) -> bool:
    """Two ranges of one dimension share a release (no range: every release)."""
    return a is None or b is None or Range.parse(a).overlaps(Range.parse(b))
