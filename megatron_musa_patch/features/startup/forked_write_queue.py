"""The distributed checkpoint writer's results queue is served by a process forked before the
process groups exist, not spawned at the first save.

megatron-core's ``torch_dist`` writer (``FileSystemWriterAsync``, behind every ``torch_dist``
save, synchronous or ``--async-save``) hands the rank its results through a ``multiprocessing``
Manager queue that it creates at the rank's first save, with the ``spawn`` context. A spawned
process imports the rank's main module again (``pretrain_gpt.py``: torch and megatron-core whole)
before it answers, and the save waits for it: every rank pays one more start-up at the first save
of every attempt (docs/benchmarks.md, start-up: ``benchmarks/bench_first_save.py``). Here a rank
that will save in a
distributed format creates that queue as Megatron starts to initialise torch.distributed, with
the ``fork`` context (as 0.19's own persistent async worker does,
``get_write_results_queue(mp_mode="fork")``): the manager is up in milliseconds with what the
rank has imported. Forked before the first process group, it holds none of their sockets, so a
rank that dies still closes its connections at once; and it ends with its rank
(``PR_SET_PDEATHSIG`` on Linux), where a spawned one can outlive a killed rank.
"""

from __future__ import annotations

import multiprocessing
import os
import signal

from megatron_musa_patch.base.errors import PatchError
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream import tables
from megatron_musa_patch.upstream.args import args_read_by

FEATURE = feature(
    __name__,
    "the torch_dist writer's results queue is served by a process forked before the process "
    "groups exist: no spawned start-up at each rank's first checkpoint save",
    aliases=("forked_write_queue",))


INITIALIZE = "megatron.training.initialize"
WRITER = "megatron.core.dist_checkpointing.strategies.filesystem_async"
#: where the writer keeps its queue (created by its first save when still None)
QUEUE = "_results_queue"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "initialize_distributed", f"{INITIALIZE}:_initialize_distributed",
        "wrap", _before_process_groups,
        why="a rank that saves torch_dist checkpoints forks the writer's results manager before "
            "its process groups exist, instead of spawning one at its first save"))


def _before_process_groups(wrapped, instance, args, kwargs):
    if saves_distributed(args_read_by(INITIALIZE)):
        install_forked_queue()
    return wrapped(*args, **kwargs)


def saves_distributed(args) -> bool:
    """The run writes checkpoints through megatron-core's distributed writer: it saves
    (``--save``, or non-persistent global checkpoints) in a format other than ``torch``."""
    saves = getattr(args, "save", None) or getattr(args, "non_persistent_global_ckpt_dir", None)
    return bool(saves) and getattr(args, "ckpt_format", "torch_dist") != "torch"


def install_forked_queue() -> None:
    """The writer's queue, created now by a forked manager (once a process; a queue already
    there, such as one the async worker made, stays)."""
    import importlib

    writer = importlib.import_module(WRITER)
    if not hasattr(writer, QUEUE):
        raise PatchError(
            f"feature {FEATURE.name}: {WRITER} has no {QUEUE} (this "
            f"megatron-core keeps the checkpoint writer's results queue elsewhere; the feature "
            f"was verified on megatron-core {tables.MEGATRON_VERIFIED}). Switch it off with "
            f"MEGATRON_MUSA_PATCH_DISABLE={FEATURE.name}.")
    if getattr(writer, QUEUE) is None:
        setattr(writer, QUEUE, forked_queue())


def forked_queue():
    """A Manager queue whose server is a fork of this process that ends when it does."""
    from multiprocessing.managers import SyncManager

    manager = SyncManager(ctx=multiprocessing.get_context("fork"))
    manager.start(initializer=_end_with, initargs=(os.getpid(),))
    return manager.Queue()  # the proxy holds the manager, which shuts it down at a normal exit


def _end_with(parent: int) -> None:
    """In the manager: the kernel ends it when ``parent`` dies (SIGKILL included), which a
    normal exit's shutdown does not cover. SIGKILL, so that no handler the rank had registered
    runs in it (a SIGTERM stack dump would go to the rank's hang report); it holds nothing to
    flush. Linux only; elsewhere it lives on as a spawned one does."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # died before the request took hold
        os._exit(0)
