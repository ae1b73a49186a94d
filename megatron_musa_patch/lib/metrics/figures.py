"""Measured numbers as people read them: a few significant digits, in plain decimal notation.

``format(x, ".4g")`` switches to exponent notation for large and small values (a big model's
FLOPs per iteration print as ``1.8e+05`` TFLOP, a CPU run's rate as ``2.1e-05`` TFLOP/s), and a
bare float prints every digit the measurement never had (``0.13020214729974966``). Here the
integer digits are always written out, decimals only as far as ``digits`` significant ones, and
trailing zeros are dropped (``0.5``, not ``0.5000``). Machine-readable outputs (JSON) keep the
full values; this is for lines a person reads.
"""

from __future__ import annotations

import math


def significant(value: float, digits: int = 4) -> str:
    """``value`` with ``digits`` significant digits (more where its integer part has more):
    0.13020214729974966 -> 0.1302, 1234.56 -> 1235, 180000.4 -> 180000, 0.5 -> 0.5."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    if decimals and len(text.lstrip("-").replace(".", "").lstrip("0")) > digits:
        text = f"{value:.{decimals - 1}f}"  # rounded up a decade: 9.99996 -> 10.000 -> 10.00
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def percent(value: float, digits: int = 3) -> str:
    """A percentage with ``digits`` significant digits: 22.871 -> 22.9%, 0.0041 -> 0.0041%
    (a slow first iteration is not 0.00%)."""
    return significant(value, digits) + "%"
