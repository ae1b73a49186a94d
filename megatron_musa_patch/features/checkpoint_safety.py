"""Checkpoints that a crash cannot make unusable (Megatron-LM's ``megatron.training.checkpointing``).

Megatron-LM names the checkpoint to resume from in ``<save>/latest_checkpointed_iteration.txt``
(the tracker), which rank 0 writes after every rank has finished writing, so a checkpoint
interrupted while being written is never named there. Three holes remain, closed here:

* The tracker is rewritten in place (``open(..., 'w')`` truncates it first): a crash between the
  truncation and the write leaves it empty, and the next job prints "Invalid metadata file" and
  ends with exit status 0 without training. It is written to a temporary file, synced, and
  renamed over the old one (atomic on POSIX file systems).
* A tracker that is unreadable anyway (another tool, a hand edit), or that names a checkpoint
  directory that is not there, stops the job with an error naming the file and what was found,
  and a non-zero exit.
* A job restarted after it had finished loads the latest checkpoint, trains nothing, and then
  saves the same iteration again over the only complete checkpoint (when the last iteration is
  not a multiple of ``--save-interval``): a crash during that rewrite would leave the tracker
  naming a half-written checkpoint. Such a save is skipped (the state is the one on disk).

* The legacy format (``--ckpt-format torch``) is written only by expert-data-parallel rank 0.
  With MoE experts split unlike the dense layers (``--expert-tensor-parallel-size`` other than
  ``--tensor-model-parallel-size``) that group spans tensor-parallel ranks, so their dense
  shards are never saved and the checkpoint loads nowhere (found only at the next ``--load``).
  That combination is refused before training, with the fix.

And for exact resume where the device's random ops draw from the host generator (the CPU row):
Megatron-LM restores the RNG states from the checkpoint and only then builds the data iterators,
whose DataLoader draws its base seed from the host generator. On a GPU that draw does not touch
the device generator that dropout uses; on the CPU it shifts the dropout stream, so a resumed run
drops different units than the uninterrupted one. Building the iterators leaves the host RNG
state as it found it there, in every run, so both see the same stream.
"""

from __future__ import annotations

import glob
import os
import re
import sys

from ..errors import ArgumentError, MegatronMusaPatchError
from ..hookspecs import hookimpl
from ..registry import Patch

FEATURE = "checkpoint_safety"
REQUIRED = False
DESCRIPTION = "atomic latest_checkpointed_iteration.txt, clear errors for a bad one, no in-place " \
              "rewrite of the loaded latest checkpoint"

CHECKPOINTING = "megatron.training.checkpointing"
TRACKER = "latest_checkpointed_iteration.txt"
TMP = ".mmp-tmp-"
_ITER_DIR = re.compile(r"^iter_(\d{7})$")


class CheckpointError(MegatronMusaPatchError):
    """A checkpoint directory that cannot be resumed from as it is."""


@hookimpl
def mmp_validate_args(args, device):
    if getattr(args, "ckpt_format", "torch_dist") != "torch" or not getattr(args, "num_experts", 0):
        return
    if not (getattr(args, "save", None) or getattr(args, "load", None)):
        return
    tp = getattr(args, "tensor_model_parallel_size", 1) or 1
    etp = getattr(args, "expert_tensor_parallel_size", None) or tp
    if etp != tp:
        raise ArgumentError(
            f"--ckpt-format torch with --expert-tensor-parallel-size {etp} and "
            f"--tensor-model-parallel-size {tp}: Megatron-LM's legacy format is written only by "
            f"expert-data-parallel rank 0, which here leaves out tensor-parallel ranks, so their "
            f"shards would never be saved and the checkpoint could not be loaded. Use "
            f"--ckpt-format torch_dist (the default), or --expert-tensor-parallel-size {tp}.")


@hookimpl
def mmp_register_patches(registry, device):
    registry.add(Patch(
        "checkpoint_safety.atomic_tracker", f"{CHECKPOINTING}:open_file", "wrap",
        _open_tracker_atomically, FEATURE,
        why="latest_checkpointed_iteration.txt is replaced atomically, never truncated in place"))
    registry.add(Patch(
        "checkpoint_safety.read_tracker", f"{CHECKPOINTING}:read_metadata", "wrap", _read_metadata,
        FEATURE, why="an unreadable tracker, or one naming a missing checkpoint, is an error "
                     "(upstream exits with status 0)"))
    registry.add(Patch(
        "checkpoint_safety.no_rewrite_of_loaded", f"{CHECKPOINTING}:save_checkpoint", "wrap",
        _skip_rewrite_of_loaded_latest, FEATURE, rebind=("megatron.training.training",),
        why="a job that trained nothing since loading does not rewrite that checkpoint in place"))
    if device.rng_shared_with_host:
        registry.add(Patch(
            "checkpoint_safety.rng_neutral_data_iterators",
            "megatron.training.training:build_train_valid_test_data_iterators", "wrap",
            _keep_host_rng_state, FEATURE,
            why="the DataLoader's seed draw does not shift the dropout stream of a resumed run"))


# ----------------------------------------------------------------------------- atomic tracker


def _msc_enabled() -> bool:
    module = sys.modules.get("megatron.core.msc_utils")
    feature = getattr(module, "MultiStorageClientFeature", None)
    return bool(feature is not None and feature.is_enabled())


def _open_tracker_atomically(wrapped, instance, args, kwargs):
    path = args[0] if args else kwargs.get("file")
    mode = args[1] if len(args) > 1 else kwargs.get("mode", "r")
    if (mode == "w" and isinstance(path, (str, os.PathLike))
            and os.path.basename(os.fspath(path)) == TRACKER and not _msc_enabled()):
        return AtomicTextFile(os.fspath(path))
    return wrapped(*args, **kwargs)


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


# ----------------------------------------------------------------------------- reading it


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
    tracker = args[0] if args else kwargs.get("tracker_filename")
    if isinstance(tracker, (str, os.PathLike)) and not _msc_enabled():
        check_tracker(os.fspath(tracker))
    return wrapped(*args, **kwargs)


# ----------------------------------------------------------------------------- no rewrite


def loaded_latest_unchanged(iteration, save_dir, load_dir, loaded_iteration,
                            start_iteration) -> bool:
    """True when saving ``iteration`` would rewrite, in place, the checkpoint this job loaded
    (and started from) and that the tracker names as the latest: nothing was trained since."""
    if not save_dir or not load_dir or loaded_iteration is None or start_iteration is None:
        return False
    if os.path.realpath(save_dir) != os.path.realpath(load_dir):
        return False
    if not int(iteration) == int(loaded_iteration) == int(start_iteration) or int(iteration) <= 0:
        return False
    tracker = os.path.join(save_dir, TRACKER)
    try:
        with open(tracker, encoding="utf-8") as f:
            named = f.read().strip()
    except OSError:
        return False
    return named == str(int(iteration)) and os.path.isdir(
        os.path.join(save_dir, f"iter_{int(iteration):07d}"))


def _skip_rewrite_of_loaded_latest(wrapped, instance, args, kwargs):
    call = dict(zip(("iteration", "model", "optimizer", "opt_param_scheduler",
                     "num_floating_point_operations_so_far"), args), **kwargs)
    if call.get("non_persistent_ckpt") or call.get("release") or _msc_enabled():
        return wrapped(*args, **kwargs)
    module = sys.modules.get(CHECKPOINTING)
    from megatron.training.global_vars import get_args

    megatron_args = get_args()
    loaded = getattr(module, "get_loaded_iteration", lambda: None)()
    if loaded_latest_unchanged(call.get("iteration"), megatron_args.save, megatron_args.load,
                               loaded, getattr(megatron_args, "iteration", None)):
        if os.environ.get("RANK", "0") == "0":
            print(f"megatron_musa_patch: not saving iteration {call['iteration']} again: it is "
                  f"the checkpoint this job loaded from {megatron_args.save}, nothing was trained "
                  f"since, and rewriting the latest checkpoint in place could leave none complete "
                  f"if interrupted.", flush=True)
        return None
    return wrapped(*args, **kwargs)


# ----------------------------------------------------------------------------- exact resume


def _keep_host_rng_state(wrapped, instance, args, kwargs):
    import torch

    state = torch.get_rng_state()
    try:
        return wrapped(*args, **kwargs)
    finally:
        torch.set_rng_state(state)
