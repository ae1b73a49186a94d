"""The Megatron releases this layer supports: one table, from which the install requirement
(``setup.py`` reads this file by path), the activation checks, their messages, the tests and
the README's support table derive.

No imports beyond the standard library: ``setup.py`` loads this module before anything is
installed (so versions are compared as tuples here, not with ``packaging``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Release:
    #: the release series, "0.19"
    series: str
    #: the Megatron-LM tag whose scripts (pretrain_gpt.py ...) go with it, and that CI runs
    lm_tag: str
    #: the oldest megatron-core release of the series the layer supports
    first: str
    #: the Python versions upstream supports for it (lowest)
    python: str
    #: where ``megatron.training`` comes from: "checkout" (MEGATRON_LM_PATH) or "wheel"
    training_from: str

    @property
    def core(self) -> str:
        """The megatron-core versions of this row, as a packaging specifier."""
        major, minor = (int(p) for p in self.series.split("."))
        return f">={self.first},<{major}.{minor + 1}"


RELEASES: Tuple[Release, ...] = (
    Release("0.16", "core_v0.16.1", "0.16.1", "3.10", "checkout"),
    Release("0.17", "core_v0.17.1", "0.17.0", "3.12", "wheel"),
    Release("0.18", "core_v0.18.2", "0.18.0", "3.12", "wheel"),
    Release("0.19", "core_v0.19.0", "0.19.0", "3.12", "wheel"),
)

#: the megatron-core versions some row covers (the rows are contiguous)
VERIFIED_MEGATRON = f">={RELEASES[0].first},{RELEASES[-1].core.split(',')[1]}"
#: what ``pip install megatron-musa-patch`` asks for: the whole table, so installing the layer
#: never moves the user's Megatron to another release (pip on Python 3.11 sees 0.16.1 as the
#: newest megatron-core; on 3.12 the newest of the table)
INSTALL_REQUIREMENT = f"megatron-core{VERIFIED_MEGATRON}"


def _numbers(version: str) -> Tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


def release_of(version) -> Optional[Release]:
    """The row a megatron-core / Megatron-LM version belongs to (its series), or None."""
    if version is None:
        return None
    numbers = _numbers(str(version))
    for release in RELEASES:
        if numbers[:2] == _numbers(release.series) and numbers >= _numbers(release.first):
            return release
    return None


def newer_than_table(version) -> bool:
    return version is not None and _numbers(str(version))[:2] > _numbers(RELEASES[-1].series)


def tags() -> str:
    """The Megatron-LM tags of the table, for messages ("core_v0.16.1, ..., core_v0.19.0")."""
    return ", ".join(r.lm_tag for r in RELEASES)


def newest() -> Release:
    return RELEASES[-1]


def oldest() -> Release:
    return RELEASES[0]


def markdown_table() -> str:
    """The README's support table (tests/unit/test_releases.py checks the README holds it)."""
    rows = ["| megatron-core | Megatron-LM tag | Python | `megatron.training` from |",
            "|---|---|---|---|"]
    for r in RELEASES:
        source = ("the checkout (`MEGATRON_LM_PATH`)" if r.training_from == "checkout"
                  else "the megatron-core wheel (scripts from the checkout)")
        rows.append(f"| `{r.core}` | `{r.lm_tag}` | >= {r.python} | {source} |")
    return "\n".join(rows)
