"""A tracker that cannot be resumed from stops the job with the file, what was found and the fix.

Upstream reads ``latest_checkpointed_iteration.txt`` and, when it is unreadable (another tool,
a hand edit, an interrupted write by a layer without ``atomic_tracker``), prints "Invalid
metadata file" and exits with status 0 without training; a tracker naming a checkpoint
directory that is not there fails deep inside the load.
"""

from __future__ import annotations

import os
import re

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from .common import CHECKPOINTING, CheckpointError, msc_enabled
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "an unreadable tracker, or one naming a missing checkpoint, is an error",
    aliases=("checkpoint_safety.tracker_check",))

_ITER_DIR = re.compile(r"^iter_(\d{7})$")


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", f"{CHECKPOINTING}:read_metadata", "wrap", _read_metadata,
        why="an unreadable tracker, or one naming a missing checkpoint, is an error "
            "(upstream exits with status 0)"))


def checkpoint_dirs(save_dir: str):
    """Iterations with an ``iter_NNNNNNN`` directory in ``save_dir``, newest first."""
    try:
        names = os.listdir(save_dir)
    except OSError:
        return []
    found = [int(m.group(1)) for m in map(_ITER_DIR.match, names) if m]
    return sorted((i for i in found if os.path.isdir(os.path.join(save_dir, f"iter_{i:07d}"))),
                  reverse=True)


def check_tracker(tracker: str) -> None:
    """Raise CheckpointError when the tracker cannot be resumed from as it is."""
    save_dir = os.path.dirname(os.path.abspath(tracker))
    try:
        with open(tracker, encoding="utf-8") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read the checkpoint tracker {tracker} ({exc}).") from exc
    found = checkpoint_dirs(save_dir)
    listed = (f"checkpoint directories there: {', '.join(f'iter_{i:07d}' for i in found[:5])}"
              f"{' ...' if len(found) > 5 else ''}" if found else "no iter_* directories there")
    if text == "release":
        return
    if not text.isdigit():
        shown = repr(text[:40]) if text else "empty"
        newest = (f"`echo {found[0]} > {tracker}` if iter_{found[0]:07d} is complete"
                  if found else "remove it to start from scratch")
        raise CheckpointError(
            f"the checkpoint tracker {tracker} is {shown}, not an iteration number, so "
            f"--load cannot tell which checkpoint to resume from ({listed}). An interrupted "
            f"write of it leaves it like this. Fix: write the iteration of the newest complete "
            f"checkpoint into it ({newest}), or point --load elsewhere.")
    iteration = int(text)
    if not os.path.isdir(os.path.join(save_dir, f"iter_{iteration:07d}")):
        raise CheckpointError(
            f"the checkpoint tracker {tracker} names iteration {iteration}, but "
            f"{os.path.join(save_dir, f'iter_{iteration:07d}')} does not exist ({listed}). Fix: "
            f"restore that directory, or write the iteration of a complete checkpoint into the "
            f"tracker, or point --load elsewhere.")


def _read_metadata(wrapped, instance, args, kwargs):
    tracker = call_arguments(wrapped, args, kwargs).get("tracker_filename")
    if isinstance(tracker, (str, os.PathLike)) and not msc_enabled():
        check_tracker(os.fspath(tracker))
    return wrapped(*args, **kwargs)
