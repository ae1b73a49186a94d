"""The layer's verified ranges (``upstream/tables.py``: ``MEGATRON_VERIFIED``, ``TORCH_VERIFIED``)
are the one place a release is declared verified for every record that does not say otherwise,
and each series they cover has its evidence: a cell of the compatibility matrix
(``tools/compat_matrix.py``, ``docs/compatibility/results.json``) where the layer's records all
resolved and were verified, the selftest passed and the stock subset ran. Moving a bound without
running the matrix on the new series fails here."""

import json

from megatron_musa_patch.upstream import ranges, tables
from megatron_musa_patch.upstream.ranges import Range

from tests.conftest import REPO

RESULTS = REPO / "docs" / "compatibility" / "results.json"


def passing_cells():
    """(megatron-core version, torch version) of every cell whose steps all passed."""
    cells = json.loads(RESULTS.read_text())["cells"]
    out = []
    for cell in cells.values():
        steps = cell["steps"]
        resolve = steps.get("resolve", {})
        if not {"resolve", "selftest", "stock"} <= steps.keys():
            continue
        if any(step.get("rc") != 0 for step in steps.values()):
            continue
        if resolve.get("unverified") or resolve.get("unresolved"):
            continue
        out.append((cell["versions"]["megatron-core"], cell["versions"]["torch"]))
    return out


def series_in(verified: str, table):
    """The series of ``table`` whose first release the range holds."""
    bounds = Range.parse(verified)
    return [row.series for row in table if row.first in bounds]


def test_every_verified_megatron_series_was_run():
    covered = {ranges.series(core) for core, _ in passing_cells()}
    missing = [s for s in series_in(tables.MEGATRON_VERIFIED, tables.MEGATRON)
               if ranges.series(s + ".0") not in covered]
    assert series_in(tables.MEGATRON_VERIFIED, tables.MEGATRON) == ["0.16", "0.17", "0.18", "0.19"]
    assert missing == [], (f"MEGATRON_VERIFIED {tables.MEGATRON_VERIFIED} covers {missing}, which "
                           f"no passing cell of {RESULTS.name} ran: run tools/compat_matrix.py")


def test_every_verified_torch_series_was_run():
    covered = {ranges.series(torch) for _, torch in passing_cells()}
    missing = [s for s in series_in(tables.TORCH_VERIFIED, tables.TORCH)
               if ranges.series(s + ".0") not in covered]
    assert len(series_in(tables.TORCH_VERIFIED, tables.TORCH)) == len(tables.TORCH)
    assert missing == [], (f"TORCH_VERIFIED {tables.TORCH_VERIFIED} covers {missing}, which no "
                           f"passing cell of {RESULTS.name} ran: run tools/compat_matrix.py")


def test_the_verified_ranges_lie_inside_the_support_tables():
    for verified, supported in ((tables.MEGATRON_VERIFIED, tables.MEGATRON_SUPPORTED),
                                (tables.TORCH_VERIFIED, tables.TORCH_SUPPORTED)):
        inner, outer = Range.parse(verified), Range.parse(supported)
        assert inner.intersection(outer).low == inner.low and \
            inner.intersection(outer).high == inner.high, (verified, supported)


def test_a_series_without_evidence_is_caught(monkeypatch):
    """The check can fail: a verified range moved to 0.20 with no cell of 0.20."""
    monkeypatch.setattr(tables, "MEGATRON", tables.MEGATRON + (tables.MegatronRelease(
        "0.20", "core_v0.20.0", "0.20.0", "3.12", "wheel"),))
    covered = {ranges.series(core) for core, _ in passing_cells()}
    series = series_in(">=0.16.1,<0.21", tables.MEGATRON)
    assert [s for s in series if ranges.series(s + ".0") not in covered] == ["0.20"]
