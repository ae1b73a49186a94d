"""tools/compat_matrix.py: its cells cover both ends of both support tables, and its page says
what ran where, with failures shown, from the results alone."""

import pytest

from megatron_musa_patch.upstream import tables
from tools import compat_matrix


def test_the_default_cells_cover_every_torch_with_both_ends_of_megatron():
    cells = {(c.python, c.torch, c.megatron) for c in compat_matrix.default_cells()}
    oldest, newest = tables.MEGATRON[0].series, tables.MEGATRON[-1].series
    for torch in tables.TORCH:
        assert ("3.11", torch.series, oldest) in cells
        assert ("3.12", torch.series, newest) in cells
    assert {m.series for m in tables.MEGATRON} == {c[2] for c in cells}


def test_a_cell_outside_the_tables_is_refused():
    assert compat_matrix.Cell.parse("py3.12-torch2.15-mc0.19").lm_tag == "core_v0.19.0"
    with pytest.raises(SystemExit, match="not in the support tables"):
        compat_matrix.Cell.parse("py3.12-torch2.16-mc0.19")
    with pytest.raises(SystemExit, match="is not py<X.Y>-torch<X.Y>-mc<X.Y>"):
        compat_matrix.Cell.parse("torch2.15")


def test_the_page_shows_versions_steps_and_failures(tmp_path):
    ok = {"rc": 0, "seconds": 70.0}
    results = {"cells": {
        "py3.12-torch2.15-mc0.19": {
            "versions": {"python": "3.12.1", "torch": "2.15.0", "megatron-core": "0.19.2"},
            "date": "2026-12-03", "machine": "AMD EPYC, 2 cores",
            "steps": {"selftest": ok,
                      "resolve": {"rc": 0, "seconds": 9, "records": 265, "unresolved": [],
                                  "unverified": []},
                      "stock": {"rc": 0, "seconds": 600, "counts": {"passed": 14,
                                                                    "skipped": 2}}}},
        "py3.11-torch2.11-mc0.16": {
            "versions": {"python": "3.11.7", "torch": "2.11.0", "megatron-core": "0.16.1"},
            "date": "2026-12-03", "machine": "AMD EPYC, 2 cores",
            "steps": {"selftest": {"rc": 1, "seconds": 30, "tail": "tp2 MISMATCH"}}},
    }}
    page = compat_matrix.render(results)
    rows = [line for line in page.splitlines() if line.startswith("| py")]
    # oldest Megatron first
    assert rows[0].startswith("| py3.11-torch2.11-mc0.16 | 3.11.7 | 2.11.0 | 0.16.1 | FAIL (30 s)")
    assert "| FAILS |" in rows[0]
    assert rows[1] == ("| py3.12-torch2.15-mc0.19 | 3.12.1 | 2.15.0 | 0.19.2 | ok (70 s) | ok "
                       "(265 records, 0 unresolved, 0 unverified) | ok (14 passed, 2 skipped; "
                       "600 s) | - | passes | 2026-12-03 | AMD EPYC, 2 cores |")
    assert "### py3.11-torch2.11-mc0.16: selftest" in page and "tp2 MISMATCH" in page
