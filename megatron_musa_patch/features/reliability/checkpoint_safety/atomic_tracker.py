"""The tracker ``latest_checkpointed_iteration.txt`` is replaced atomically.

Megatron-LM names the checkpoint to resume from in the tracker, which rank 0 writes after every
rank has finished writing, so a checkpoint interrupted while being written is never named there.
But the tracker is rewritten in place (``open(..., 'w')`` truncates it first): a crash between
the truncation and the write leaves it empty, and the next job prints "Invalid metadata file"
and ends with exit status 0 without training. It is written to a temporary file, synced, and
renamed over the old one (atomic on POSIX file systems). Upstream opens it through
``msc_utils.open_file`` (before 0.19) or ``msc_utils.maybe_msc.open`` (0.19): both are hooked,
for the tracker's name and write mode only.
"""

from __future__ import annotations

import builtins
import glob
import os

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.checkpoint_files import TRACKER

from .common import msc_enabled
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "latest_checkpointed_iteration.txt replaced atomically, never truncated in place",
    aliases=("checkpoint_safety.atomic_tracker",))

TMP = ".mmp-tmp-"


@hookimpl
def mmp_register_patches(registry):
    registry.extend(FEATURE.patches_at(
        "checkpoint_tracker_open", "", "wrap",
        {"open_file": _open_tracker_atomically, "maybe_msc": _maybe_msc_open},
        why="latest_checkpointed_iteration.txt is replaced atomically, never truncated in place"))


def _open_arguments(file=None, mode="r", *_, **__):
    """``open_file(*args, **kwargs)`` forwards to ``open``: its parameters are open's."""
    return file, mode


def _is_tracker_write(path, mode) -> bool:
    return (mode == "w" and isinstance(path, (str, os.PathLike))
            and os.path.basename(os.fspath(path)) == TRACKER and not msc_enabled())


def _open_tracker_atomically(wrapped, instance, args, kwargs):
    path, mode = _open_arguments(*args, **kwargs)
    if _is_tracker_write(path, mode):
        return AtomicTextFile(os.fspath(path))
    return wrapped(*args, **kwargs)


def _open_with_atomic_tracker(*args, **kwargs):
    """``maybe_msc.open`` without MSC: the builtin ``open``, the tracker written aside."""
    path, mode = _open_arguments(*args, **kwargs)
    if _is_tracker_write(path, mode):
        return AtomicTextFile(os.fspath(path))
    return builtins.open(*args, **kwargs)


def _maybe_msc_open(wrapped, instance, args, kwargs):
    """``MaybeMultiStorageClient.__getattr__``: its ``open`` (the builtin, without MSC)."""
    value = wrapped(*args, **kwargs)
    if call_arguments(wrapped, args, kwargs).get("name") == "open" and value is builtins.open:
        return _open_with_atomic_tracker
    return value


class AtomicTextFile:
    """A text file written aside and renamed into place on a clean close (or discarded)."""

    def __init__(self, path: str):
        self.path = path
        self.tmp = f"{path}{TMP}{os.getpid()}"
        self._file = open(self.tmp, "w", encoding="utf-8")

    def write(self, text: str) -> int:
        return self._file.write(text)

    def close(self, commit: bool = True) -> None:
        if self._file.closed:
            return
        if not commit:
            self._file.close()
            os.unlink(self.tmp)
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)
        _fsync_directory(os.path.dirname(os.path.abspath(self.path)))
        for stale in glob.glob(glob.escape(self.path + TMP) + "*"):  # left by a killed writer
            try:
                os.unlink(stale)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(commit=exc_type is None)
        return False


def _fsync_directory(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not every file system syncs directories
    finally:
        os.close(fd)
