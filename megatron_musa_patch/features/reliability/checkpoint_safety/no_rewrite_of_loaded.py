"""A job that trained nothing since loading does not rewrite that checkpoint in place.

A job restarted after it had finished loads the latest checkpoint, trains nothing, and then
saves the same iteration again over the only complete checkpoint (when the last iteration is
not a multiple of ``--save-interval``): a crash during that rewrite would leave the tracker
naming a half-written checkpoint. Such a save is skipped (the state is the one on disk).
"""

from __future__ import annotations

import functools
import os
import sys

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.args import args_read_by
from megatron_musa_patch.upstream.checkpoint_files import TRACKER

from .common import CHECKPOINTING, msc_enabled
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "no in-place rewrite of the loaded latest checkpoint by a job that trained nothing",
    aliases=("checkpoint_safety.no_rewrite_of_loaded",))


@hookimpl
def mmp_register_patches(session, registry):
    registry.add(FEATURE.patch(
        "", f"{CHECKPOINTING}:save_checkpoint", "wrap",
        functools.partial(_skip_rewrite_of_loaded_latest, session),
        rebind=("megatron.training.training",),
        why="a job that trained nothing since loading does not rewrite that checkpoint in place"))


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


def _skip_rewrite_of_loaded_latest(session, wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    if call.get("non_persistent_ckpt") or call.get("release") or msc_enabled():
        return wrapped(*args, **kwargs)
    module = sys.modules.get(CHECKPOINTING)
    # upstream's tests give save_checkpoint a SimpleNamespace without `load`
    megatron_args = args_read_by(CHECKPOINTING)
    loaded = getattr(module, "get_loaded_iteration", lambda: None)()
    save_dir, load_dir = getattr(megatron_args, "save", None), getattr(megatron_args, "load", None)
    if loaded_latest_unchanged(call.get("iteration"), save_dir, load_dir, loaded,
                               getattr(megatron_args, "iteration", None)):
        if session.is_rank_zero():
            print(f"megatron_musa_patch: not saving iteration {call['iteration']} again: it is "
                  f"the checkpoint this job loaded from {save_dir}, nothing was trained "
                  f"since, and rewriting the latest checkpoint in place could leave none complete "
                  f"if interrupted.", flush=True)
        return None
    return wrapped(*args, **kwargs)
