"""upstream_fixes.writer_threads_together: from megatron-core 0.17, a rank's torch_dist writer
threads write their buckets at the same time (upstream writes them one after another), the
checkpoint holds the same tensors, and a bucket that fails is named."""

import pytest
from packaging.version import Version

from tests.conftest import printed_lines, run_probe_on_one_cpu_rank

PROBE = "tests.features.upstream_fixes.probes.writer_threads"
OFF = {"MEGATRON_MUSA_PATCH_DISABLE": "upstream_fixes.writer_threads_together"}


def _threaded_writer():
    from megatron_musa_patch.upstream import installed

    return installed.megatron_core_version() >= Version("0.17")


pytestmark = pytest.mark.skipif(not _threaded_writer(), reason="megatron-core 0.16 writes the "
                                "buckets in forked processes, started together (the fix is for "
                                "0.17 on)")


def _lines(proc):
    return printed_lines(proc, ("buckets", "overlap", "loaded", "refused"))


def test_buckets_are_written_together_and_load_back(tmp_path):
    assert _lines(run_probe_on_one_cpu_rank(PROBE, tmp_path, "save")) == [
        "buckets 2", "overlap True", "loaded True"]


def test_upstream_writes_them_one_after_another(tmp_path):
    assert _lines(run_probe_on_one_cpu_rank(PROBE, tmp_path, "save", **OFF)) == [
        "buckets 2", "overlap False", "loaded True"]


@pytest.mark.parametrize("bucket", ["__0_0.distcp", "__0_1.distcp"])
def test_a_failed_bucket_is_named(tmp_path, bucket):
    index = bucket[-8]
    [refused] = _lines(run_probe_on_one_cpu_rank(PROBE, tmp_path, bucket))
    assert (f"torch_dist writer: bucket {index} of 2 ({bucket}) failed: "
            f"IsADirectoryError(21, 'Is a directory')") in refused
