"""Which features are switched off, with hierarchical names.

Feature names are dotted: ``fused_ops.rope`` is one fusion, ``fused_ops`` the group of all of
them. ``MEGATRON_MUSA_PATCH_DISABLE=fused_ops`` switches the whole group off,
``...=fused_ops.rope`` that one fusion; ``MEGATRON_MUSA_PATCH_ONLY=fused_ops`` keeps every fusion
(and the required features). A name that is neither a feature nor a group of features is an error:
a typo must not leave a feature on unnoticed.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import FrozenSet, Iterable, Mapping, Optional, Tuple

from .errors import SettingsError


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


def decide(features: Mapping[str, bool], disable: Iterable[str],
           only: Optional[Iterable[str]]) -> Toggles:
    """``features``: name -> required. ``disable`` / ``only``: the settings' lists (``only``
    None when unset, empty for 'none')."""
    disable = tuple(disable)
    known = groups(features)
    for variable, names in (("DISABLE", disable), ("ONLY", only or ())):
        unknown = sorted(set(names) - known)
        if unknown:
            raise SettingsError(
                f"MEGATRON_MUSA_PATCH_{variable} names {_unknown(unknown, known)}; known "
                f"features: {', '.join(sorted(features))} (a group such as "
                f"{_a_group(features) or 'fused_ops'} names all of its features).")
    off, reasons = set(), {}
    for name, required in features.items():
        chain = ancestors(name)
        hit = next((a for a in chain if a in disable), None)
        if hit is not None:
            off.add(name)
            reasons[name] = f"switched off by MEGATRON_MUSA_PATCH_DISABLE={hit}"
        elif only is not None and not required and not any(a in only for a in chain):
            off.add(name)
            reasons[name] = (f"switched off: not in MEGATRON_MUSA_PATCH_ONLY="
                             f"{','.join(only) if only else 'none'}")
    return Toggles(frozenset(off), reasons)


def _a_group(features) -> Optional[str]:
    dotted = sorted(f for f in features if "." in f)
    return dotted[0].split(".")[0] if dotted else None


def _unknown(unknown, known) -> str:
    """The unknown names, each with the nearest known one where a typo is likely."""
    said = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        said.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return ("an unknown feature " if len(said) == 1 else "unknown features ") + ", ".join(said)
