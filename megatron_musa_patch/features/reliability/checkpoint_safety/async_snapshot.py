"""An asynchronous ``torch_dist`` save of host-memory tensors writes the state of its iteration.

With ``--async-save --use-persistent-ckpt-worker`` megatron-core hands the save to a worker
process and lets training go on once the worker has "preloaded" the tensors: on a GPU that is a
copy to host memory, a snapshot taken while the trainer waits. Tensors already in host memory
(the CPU row) are not copied (``tensor.to("cpu")`` returns the tensor itself), and handing them to
the worker moved them into shared memory: the worker then writes the very memory the next
optimizer steps update in place, and the checkpoint can hold a mix of later iterations (a run
resumed from it is not the uninterrupted one). Here the preloading copies a tensor held in shared
memory, as the device-to-host copy does, while the trainer still waits. A synchronous save (its
tensors are not shared) copies nothing.
"""

from __future__ import annotations

import functools

from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl

FEATURE = feature(
    __name__,
    "an async save of host-memory tensors (CPU row) writes a snapshot of its iteration, as the "
    "device-to-host copy makes one on a GPU",
    aliases=("checkpoint_safety.async_snapshot",))


WRITER = "megatron.core.dist_checkpointing.strategies.filesystem_async"


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", f"{WRITER}:FileSystemWriterAsync.get_save_function_and_args", "wrap",
        _with_snapshot_preload,
        why="the async writer's preloading copies host-memory tensors held in shared memory "
            "while the trainer waits, as the device-to-host copy does on a GPU"))


def _with_snapshot_preload(wrapped, instance, args, kwargs):
    save_fn, preload_fn, save_args = wrapped(*args, **kwargs)
    if preload_fn is not None:
        # a module-level function: the request is pickled to the persistent worker
        preload_fn = functools.partial(snapshot_preload, preload_fn)
    return save_fn, preload_fn, save_args


def snapshot_preload(preload_fn):
    """``preload_fn()``'s write buckets with every host-memory tensor in shared memory copied."""
    return [(file_name, key, (bytes_data, [(item, snapshot(tensor)) for item, tensor in tensors]))
            for file_name, key, (bytes_data, tensors) in preload_fn()]


def snapshot(tensor):
    """A private copy of a CPU tensor in shared memory (the trainer's, handed over); any other
    tensor (a device-to-host copy, a synchronous save's own) as it is."""
    if tensor.device.type == "cpu" and tensor.is_shared():
        return tensor.clone()
    return tensor
