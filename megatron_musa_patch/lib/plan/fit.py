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


def per_collective_and_wait_share(
        points: Sequence[Tuple[float, float, float]]) -> Tuple[float, float]:
    """What synchronous collectives add to a micro-batch beyond their isolated times:
    ``extra = collectives x per_collective + wait_share x compute`` (a cost each: the backend
    waking; a share of the compute: ranks that meet wait for the slowest, whose lag grows with
    the work since they last met). ``points``: (extra seconds, collectives, priced compute
    seconds), fitted in least squares; a negative term is dropped and the other fitted alone."""
    def alone(pick):
        den = sum(pick(n, c) ** 2 for _, n, c in points)
        return max(sum(e * pick(n, c) for e, n, c in points) / den, 0.0) if den else 0.0

    nn = sum(n * n for _, n, _ in points)
    nc = sum(n * c for _, n, c in points)
    cc = sum(c * c for _, _, c in points)
    en = sum(e * n for e, n, _ in points)
    ec = sum(e * c for e, _, c in points)
    determinant = nn * cc - nc * nc
    if determinant > 1e-12 * nn * cc:
        per_collective = (en * cc - ec * nc) / determinant
        share = (nn * ec - nc * en) / determinant
        if per_collective >= 0 and share >= 0:
            return per_collective, share
        if per_collective < 0 <= share:
            return 0.0, alone(lambda n, c: c)
    return alone(lambda n, c: n), 0.0
