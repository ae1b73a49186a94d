"""upstream_fixes.writer_metadata_path: megatron-core 0.16's
``dist_checkpointing.remove_sharded_tensors`` works on a torch whose checkpoint writer has no
``metadata_path``: the prefixed tensors leave the metadata and their files go."""

import pytest
from packaging.version import Version

from tests.conftest import printed_lines, run_probe_on_one_cpu_rank

PROBE = "tests.features.upstream_fixes.probes.writer_metadata_path"


def _needs_0_16():
    from megatron_musa_patch.upstream import installed

    return installed.megatron_core_version() >= Version("0.17")


pytestmark = pytest.mark.skipif(_needs_0_16(), reason="megatron-core 0.17 reads the metadata path "
                                                      "itself (the fix is for 0.16)")


def _lines(proc):
    return printed_lines(proc, ("before", "after", "refused"))


def test_remove_sharded_tensors_drops_the_prefixed_tensors(tmp_path):
    assert _lines(run_probe_on_one_cpu_rank(PROBE, tmp_path)) == [
        "before ['keyA', 'prefix_b']", "after ['keyA'] []"]


def test_without_the_fix_it_fails_on_the_writer(tmp_path):
    lines = _lines(run_probe_on_one_cpu_rank(
        PROBE, tmp_path, MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.writer_metadata_path"))
    assert lines[1] == "refused 'FileSystemWriter' object has no attribute 'metadata_path'"
    assert lines[2].startswith("after ['keyA', 'prefix_b']")
