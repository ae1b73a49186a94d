"""``dist_checkpointing.remove_sharded_tensors`` on a torch whose checkpoint writer has no
``metadata_path``.

megatron-core 0.16's ``TorchDistLoadShardedStrategy.remove_sharded_tensors`` renames
``FileSystemWriter.metadata_path``; torch's writer now computes that path with
``_get_metadata_path()`` and has no such attribute, so the call fails with an AttributeError
after it has written the new metadata beside the old (on every device, CUDA included). Upstream's
test calls it on rank 0 only, so that rank then misses a barrier the others wait in, and the
file's later tests pair the wrong collectives and hang. 0.17 reads the path itself. The fix gives
the writer the attribute back, as the path torch's own ``_get_metadata_path()`` gives.
"""

from __future__ import annotations

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.facts import fixed_upstream
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.records import VERIFIED

FEATURE = feature(
    __name__,
    "remove_sharded_tensors finds torch's checkpoint metadata path (megatron-core 0.16)")
WRITER = "torch.distributed.checkpoint.filesystem:FileSystemWriter"


class _MetadataPath:
    """Read-only, and a non-data descriptor: a torch that sets its own ``metadata_path`` on the
    instance keeps it."""

    def __get__(self, writer, owner=None):
        return self if writer is None else writer._get_metadata_path()


@hookimpl
def mmp_register_patches(registry):
    until, ends = fixed_upstream("remove_sharded_tensors_without_writer_metadata_path",
                                 since="0.16.1")
    registry.add(FEATURE.patch(
        "", f"{WRITER}.metadata_path", "attribute", _MetadataPath(), create=True,
        condition=_writer_lacks_it, megatron=until, ends=ends, torch=VERIFIED,
        why="megatron-core 0.16's remove_sharded_tensors renames writer.metadata_path"))


def _writer_lacks_it():
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    if hasattr(FileSystemWriter, "metadata_path"):
        return "this torch's FileSystemWriter has metadata_path"
    if not hasattr(FileSystemWriter, "_get_metadata_path"):
        return "this torch's FileSystemWriter has neither metadata_path nor _get_metadata_path"
    return True
