"""upstream_fixes.writer_views_in_place and upstream_fixes.loaded_halves_in_place: a gated MLP
input projection, saved and loaded as Megatron's checkpoint state splits it (two halves), is
neither copied by the writer nor joined by a copy on load, and comes back bit for bit; with the
features off, upstream copies both halves on save and joins them with a copy on load. The
memory it saves a conversion is in docs/benchmarks.md (checkpoint conversion)."""

import pytest
import torch

from megatron_musa_patch.features.upstream_fixes import loaded_halves_in_place, writer_views_in_place

from tests.conftest import printed_lines, run_probe_on_one_cpu_rank

PROBE = "tests.features.upstream_fixes.probes.fused_halves"
TENSOR_BYTES = 2 * 256 * 512 * 4
PREFIXES = ("view copies", "file bytes", "loaded", "joined in place", "joins copied")


def _lines(proc):
    found = dict(line.rsplit(" ", 1) for line in printed_lines(proc, PREFIXES))
    assert TENSOR_BYTES <= int(found.pop("file bytes")) < 1.5 * TENSOR_BYTES  # not two storages
    return found


def test_the_halves_are_written_and_joined_where_they_lie(tmp_path):
    assert _lines(run_probe_on_one_cpu_rank(PROBE, tmp_path)) == {
        "view copies": "0", "loaded": "True", "joined in place": "True", "joins copied": "0"}


def test_upstream_copies_them(tmp_path):
    off = ("upstream_fixes.writer_views_in_place,upstream_fixes.loaded_halves_in_place")
    assert _lines(run_probe_on_one_cpu_rank(PROBE, tmp_path,
                                            MEGATRON_MUSA_PATCH_DISABLE=off)) == {
        "view copies": "2", "loaded": "True", "joined in place": "False", "joins copied": "1"}


def test_alias_shares_the_memory_of_a_contiguous_piece_only():
    whole = torch.arange(24.0).reshape(6, 4)
    top, bottom = whole.chunk(2)
    alias = writer_views_in_place.alias(bottom)
    assert alias.data_ptr() == bottom.data_ptr() and torch.equal(alias, bottom)
    assert alias.untyped_storage().nbytes() == bottom.numel() * bottom.element_size()
    assert writer_views_in_place.alias(whole) is whole  # its own storage already
    column = whole[:, 1]  # not contiguous: upstream copies it
    assert writer_views_in_place.alias(column) is column


@pytest.mark.parametrize("pieces, joined", [
    (lambda w: w.chunk(2), True),
    (lambda w: list(reversed(w.chunk(2))), False),  # out of order: a cat is a copy
    (lambda w: [w[:2], w[3:]], False),  # a gap
    (lambda w: [w[:3], w[3:].clone()], False),  # another storage
])
def test_adjacent_joins_only_pieces_that_lie_in_order(pieces, joined):
    whole = torch.arange(24.0).reshape(6, 4)
    parts = pieces(whole)
    out = loaded_halves_in_place.adjacent(parts)
    if not joined:
        assert out is None
        return
    assert torch.equal(out, torch.cat(parts)) and out.data_ptr() == whole.data_ptr()
