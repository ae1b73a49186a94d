"""What a real run adds to its ops priced one by one, solved from measurements:
``real = factor x priced + ops x per_op`` (a factor on the ops' own time: cache misses, operand
layouts; a cost per op: the framework's Python and autograd between ops)."""

from __future__ import annotations

from typing import Sequence, Tuple


def factor_and_per_op(points: Sequence[Tuple[float, float, float]]) -> Tuple[float, float]:
    """``points``: (real seconds, priced seconds, ops), two or more, fitted in relative error
    (least squares), so a small run counts as much as a large one. Where the points do not
    separate the terms (the same op count and cost ratio) or the fit is not physical (a negative
    cost), the measurements' overall ratio alone, with no per-op cost."""
    rows = [(p / r, n / r) for r, p, n in points if r > 0]
    # normal equations of sum((factor * a + per_op * b - 1)^2)
    aa = sum(a * a for a, _ in rows)
    ab = sum(a * b for a, b in rows)
    bb = sum(b * b for _, b in rows)
    a1 = sum(a for a, _ in rows)
    b1 = sum(b for _, b in rows)
    determinant = aa * bb - ab * ab
    if determinant > 1e-12 * aa * bb:
        factor = (a1 * bb - b1 * ab) / determinant
        per_op = (aa * b1 - ab * a1) / determinant
        if per_op >= 0 and factor > 0:
            return factor, per_op
    return sum(r for r, _, _ in points) / sum(p for _, p, _ in points), 0.0
