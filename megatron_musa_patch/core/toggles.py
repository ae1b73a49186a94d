"""Which features are switched off, with hierarchical names.

Feature names are dotted: ``fused_ops.rope`` is one fusion, ``fused_ops`` the group of all of
them. ``MEGATRON_MUSA_PATCH_DISABLE=fused_ops`` switches the whole group off,
``...=fused_ops.rope`` that one fusion; ``MEGATRON_MUSA_PATCH_ONLY=fused_ops`` keeps every fusion
(and the required features). A name that is neither a feature nor a group of features is an error:
a typo must not leave a feature on unnoticed. A feature that moved keeps its earlier names
(``Feature.aliases``: ``collectives`` is now ``device.collectives``), and a group name keeps
meaning the features it named before others joined it (``Feature.kept_out``).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import FrozenSet, Iterable, Mapping, Optional, Tuple

from megatron_musa_patch.base.errors import SettingsError


def ancestors(name: str) -> Tuple[str, ...]:
    """``a.b.c`` -> ``("a.b.c", "a.b", "a")``: the name and every group it belongs to."""
    parts = name.split(".")
    return tuple(".".join(parts[:i]) for i in range(len(parts), 0, -1))


def groups(features: Iterable[str]) -> FrozenSet[str]:
    """Every name a toggle may use: the features and their groups."""
    return frozenset(a for f in features for a in ancestors(f))


@dataclasses.dataclass(frozen=True)
class Toggles:
    """The switched-off features of one run, decided once from the settings."""

    off: FrozenSet[str]
    #: feature -> why it is off (shown by ``mmp doctor`` and in flag errors)
    reasons: Mapping[str, str]

    def is_off(self, feature: str) -> bool:
        return feature in self.off

    def why(self, feature: str) -> str:
        return self.reasons.get(feature, "")


def names_of(name: str, aliases: Iterable[str] = (), kept_out: Iterable[str] = ()) -> FrozenSet[str]:
    """Every toggle name that switches feature ``name``: it and its groups, its earlier names
    (``aliases``) and their groups, less the groups it joined after their name was in use
    (``kept_out``: a name keeps meaning what it meant)."""
    own = set(ancestors(name)) - set(kept_out)
    return frozenset(own.union(*(ancestors(alias) for alias in aliases)))


def decide(features: Mapping[str, bool], disable: Iterable[str],
           only: Optional[Iterable[str]],
           aliases: Optional[Mapping[str, Tuple[str, ...]]] = None,
           kept_out: Optional[Mapping[str, Tuple[str, ...]]] = None) -> Toggles:
    """``features``: name -> required; ``aliases``: name -> its earlier names; ``kept_out``:
    name -> groups that do not switch it. ``disable`` / ``only``: the settings' lists (``only``
    None when unset, empty for 'none')."""
    disable = tuple(disable)
    switched_by = {name: names_of(name, (aliases or {}).get(name, ()),
                                  (kept_out or {}).get(name, ())) for name in features}
    known = groups(features).union(*switched_by.values())
    for variable, names in (("DISABLE", disable), ("ONLY", only or ())):
        unknown = sorted(set(names) - known)
        if unknown:
            raise SettingsError(
                f"MEGATRON_MUSA_PATCH_{variable} names {_unknown(unknown, known)}; known "
                f"features: {', '.join(sorted(features))} (a group such as "
                f"{_a_group(features, kept_out or {}) or 'reliability'} names all of its "
                f"features).")
    off, reasons = set(), {}
    for name, required in features.items():
        hit = next((a for a in disable if a in switched_by[name]), None)
        if hit is not None:
            off.add(name)
            reasons[name] = f"switched off by MEGATRON_MUSA_PATCH_DISABLE={hit}"
        elif only is not None and not required and not any(a in only
                                                            for a in switched_by[name]):
            off.add(name)
            reasons[name] = (f"switched off: not in MEGATRON_MUSA_PATCH_ONLY="
                             f"{','.join(only) if only else 'none'}")
    return Toggles(frozenset(off), reasons)


def _a_group(features, kept_out: Mapping[str, Tuple[str, ...]]) -> Optional[str]:
    """A group that names all of its features (none kept out of it), for the example."""
    shut = {g for groups_ in kept_out.values() for g in groups_}
    dotted = sorted(f for f in features if "." in f and f.split(".")[0] not in shut)
    return dotted[0].split(".")[0] if dotted else None


def _unknown(unknown, known) -> str:
    """The unknown names, each with the nearest known one where a typo is likely."""
    said = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        said.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return ("an unknown feature " if len(said) == 1 else "unknown features ") + ", ".join(said)
