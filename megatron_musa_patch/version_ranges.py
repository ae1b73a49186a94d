"""Version ranges of patch records as intervals, so two variants of one patch can be checked for
overlap when they are registered (packaging's SpecifierSet can test a version, not intersect).

Ranges use ``>=``, ``>``, ``<``, ``<=`` and ``==`` clauses joined by commas (what the records
use); anything else is refused when the record is made.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclasses.dataclass(frozen=True)
class Interval:
    low: Optional[Version] = None
    low_inclusive: bool = True
    high: Optional[Version] = None
    high_inclusive: bool = False

    def empty(self) -> bool:
        if self.low is None or self.high is None:
            return False
        if self.low < self.high:
            return False
        return not (self.low == self.high and self.low_inclusive and self.high_inclusive)


def interval(spec: str) -> Interval:
    """``spec`` (e.g. ``">=0.17,<0.19"``) as one interval; ValueError for other operators."""
    low, low_inc, high, high_inc = None, True, None, False
    for clause in SpecifierSet(spec):
        version, op = Version(clause.version), clause.operator
        if op in (">=", ">", "=="):
            inclusive = op != ">"
            if low is None or version > low or (version == low and not inclusive):
                low, low_inc = version, inclusive
        if op in ("<", "<=", "=="):
            inclusive = op != "<"
            if high is None or version < high or (version == high and not inclusive):
                high, high_inc = version, inclusive
        if op not in (">=", ">", "==", "<", "<="):
            raise ValueError(f"version range {spec!r}: only >=, >, <, <= and == are supported")
    return Interval(low, low_inc, high, high_inc)


def overlap(a: str, b: str) -> bool:
    """Whether two ranges share a version."""
    x, y = interval(a), interval(b)
    low, low_inc = x.low, x.low_inclusive
    if y.low is not None and (low is None or y.low > low or (y.low == low and not y.low_inclusive)):
        low, low_inc = y.low, y.low_inclusive
    high, high_inc = x.high, x.high_inclusive
    if y.high is not None and (high is None or y.high < high or
                               (y.high == high and not y.high_inclusive)):
        high, high_inc = y.high, y.high_inclusive
    return not Interval(low, low_inc, high, high_inc).empty()
