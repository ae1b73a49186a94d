"""The one way a version range is written, and the one comparator.

A range is written as a PEP 440 specifier of ``>=``, ``>``, ``<``, ``<=`` and ``==`` clauses:
``">=0.16.1,<0.20"``. A patch record's range has both bounds (``Range.bounded``): the lower is
where the record starts to apply, the upper the first release it was not verified on (or, with
the record's ``ends``, the release upstream made it unnecessary); a bound the record leaves open
is the layer's verified range's (``completed``).

Versions compare by their release numbers only (major.minor.micro): pre-, post-, dev- and local
parts are dropped. A vendor's source build of torch ("2.11.0a0+git1a2b3c") is then the 2.11.0 it
was built from, torch_musa's "2.11.0.post2+musa5.2" the 2.11.0 it is built on, and a release
candidate "0.20.0rc1" the 0.20.0 it leads to.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

Release = Tuple[int, int, int]

_OPERATORS = (">=", ">", "<", "<=", "==")


def release(version) -> Optional[Release]:
    """``version`` (a string, a ``packaging`` Version, None) as (major, minor, micro)."""
    if version is None:
        return None
    if not isinstance(version, Version):
        try:
            version = Version(str(version))
        except InvalidVersion:
            return None
    numbers = tuple(version.release[:3])
    return numbers + (0,) * (3 - len(numbers))  # type: ignore[return-value]


def series(version) -> Optional[Tuple[int, int]]:
    """(major, minor) of ``version``."""
    numbers = release(version)
    return None if numbers is None else numbers[:2]


def text(numbers: Release) -> str:
    return ".".join(str(n) for n in numbers)


@dataclasses.dataclass(frozen=True)
class Range:
    """An interval of releases, as written."""

    spec: str
    low: Optional[Release] = None
    low_inclusive: bool = True
    high: Optional[Release] = None
    high_inclusive: bool = False

    @classmethod
    def parse(cls, spec: str) -> "Range":
        """``spec`` as one interval; ValueError for an operator other than the five."""
        try:
            clauses = list(SpecifierSet(spec))
        except InvalidSpecifier as exc:
            raise ValueError(f"version range {spec!r} is not a PEP 440 specifier ({exc})") from exc
        low, low_inc, high, high_inc = None, True, None, False
        for clause in clauses:
            op = clause.operator
            if op not in _OPERATORS or "*" in clause.version:
                raise ValueError(f"version range {spec!r}: only >=, >, <, <= and == are used")
            at = release(clause.version)
            if op in (">=", ">", "=="):
                inclusive = op != ">"
                if low is None or at > low or (at == low and not inclusive):
                    low, low_inc = at, inclusive
            if op in ("<", "<=", "=="):
                inclusive = op != "<"
                if high is None or at < high or (at == high and not inclusive):
                    high, high_inc = at, inclusive
        return cls(spec, low, low_inc, high, high_inc)

    @property
    def bounded(self) -> bool:
        return self.low is not None and self.high is not None

    def below(self, version) -> bool:
        """``version`` comes before the range."""
        at = release(version)
        return self.low is not None and at is not None and (
            at < self.low or (at == self.low and not self.low_inclusive))

    def above(self, version) -> bool:
        """``version`` comes after the range."""
        at = release(version)
        return self.high is not None and at is not None and (
            at > self.high or (at == self.high and not self.high_inclusive))

    def __contains__(self, version) -> bool:
        return release(version) is not None and not self.below(version) and \
            not self.above(version)

    def empty(self) -> bool:
        if self.low is None or self.high is None or self.low < self.high:
            return False
        return not (self.low == self.high and self.low_inclusive and self.high_inclusive)

    def intersection(self, other: "Range") -> "Range":
        """The releases both ranges hold, written out as a range."""
        low, low_inc = self.low, self.low_inclusive
        if other.low is not None and (low is None or other.low > low or
                                      (other.low == low and not other.low_inclusive)):
            low, low_inc = other.low, other.low_inclusive
        high, high_inc = self.high, self.high_inclusive
        if other.high is not None and (high is None or other.high < high or
                                       (other.high == high and not other.high_inclusive)):
            high, high_inc = other.high, other.high_inclusive
        clauses = []
        if low is not None:
            clauses.append(f"{'>=' if low_inc else '>'}{_short(low)}")
        if high is not None:
            clauses.append(f"{'<=' if high_inc else '<'}{_short(high)}")
        return Range(",".join(clauses), low, low_inc, high, high_inc)

    def overlaps(self, other: "Range") -> bool:
        """Whether the two ranges share a release."""
        return not self.intersection(other).empty()

    def __str__(self) -> str:
        return self.spec


def _short(numbers: Release) -> str:
    """0.20.0 as "0.20" (how ranges are written), 0.16.1 as "0.16.1"."""
    return text(numbers[:2]) if numbers[2] == 0 else text(numbers)


def completed(spec: str, within: str) -> str:
    """``spec`` with the bound it leaves open taken from ``within``: a record's ``">=0.17.1"`` in
    the layer's verified ``">=0.16.1,<0.20"`` is ``">=0.17.1,<0.20"``; an empty ``spec`` is
    ``within``. The bounds ``spec`` writes are kept as written."""
    if not spec.strip():
        return within
    own, outer = Range.parse(spec), Range.parse(within)
    clauses = [spec]
    if own.low is None and outer.low is not None:
        clauses.insert(0, f"{'>=' if outer.low_inclusive else '>'}{_short(outer.low)}")
    if own.high is None and outer.high is not None:
        clauses.append(f"{'<=' if outer.high_inclusive else '<'}{_short(outer.high)}")
    return ",".join(clauses)


def contains(spec: str, version) -> bool:
    return version in Range.parse(spec)


def row_of(table, version):
    """The row of ``table`` (``tables.MEGATRON`` or ``tables.TORCH``) that ``version`` belongs to:
    its series, from the row's first supported release on; None outside the table."""
    at = release(version)
    if at is None:
        return None
    for row in table:
        if at[:2] == release(row.series)[:2] and at >= release(row.first):
            return row
    return None


def newer_than(table, version) -> bool:
    at = release(version)
    return at is not None and at[:2] > release(table[-1].series)[:2]


def nearest(table, version) -> Release:
    """The release of ``table`` whose records a version outside it is tried as (under
    MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED): the newest row's first release for a newer version,
    the oldest row's for an older one."""
    row = table[-1] if newer_than(table, version) else table[0]
    return release(row.first)
