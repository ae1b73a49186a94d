"""One gloo rank (file store ``sys.argv[1]``) saves four sharded tensors with megatron-core's
``torch_dist`` strategy and 2 writer threads (two buckets, two files) to ``<store>.ckpt``, each
bucket's write timed; then loads them back. ``sys.argv[2]``: ``save``, or the file name of a
bucket (``__0_0.distcp``, ``__0_1.distcp``) to take with a directory first, so that this bucket
cannot be written.

Prints ``buckets <n>``, ``overlap <True|False>`` (a bucket's write started before another's
ended), ``loaded <True|False>`` (every tensor back bit for bit), or ``refused <error>``.

Run by tests/features/upstream_fixes/test_writer_threads_together.py."""

import os
import sys
import threading
import time
from pathlib import Path

import megatron_musa_patch  # activates the layer: before megatron is imported
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.dist_checkpointing import ShardedTensor, load, save
from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

#: each bucket's write is held this long: the writes overlap only when they run together
HOLD_S = 0.5


def timed_writes(spans):
    """Upstream's per-bucket writer, each call's (start, end) appended to ``spans``."""
    writer = filesystem_async.FileSystemWriterAsync
    original = writer.__dict__["write_preloaded_data"].__func__

    def write(*args, **kwargs):
        start = time.monotonic()
        time.sleep(HOLD_S)
        try:
            return original(*args, **kwargs)
        finally:
            with lock:
                spans.append((start, time.monotonic()))

    lock = threading.Lock()
    writer.write_preloaded_data = staticmethod(write)


def state(seed):
    generator = torch.Generator().manual_seed(seed)
    return {f"t{i}": ShardedTensor.from_rank_offsets(
        f"t{i}", torch.randn(64, 32 + i, generator=generator)) for i in range(4)}


def main(store, mode):
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    ckpt = Path(store + ".ckpt")
    os.makedirs(ckpt)
    if mode != "save":
        os.makedirs(ckpt / mode)  # opening the bucket's file fails
    spans = []
    timed_writes(spans)
    try:
        save(state(0), ckpt, TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=2))
    except BaseException as error:  # torch's CheckpointException is no Exception
        print("refused", " ".join(str(error).split()))
        return
    print("buckets", len(spans))
    spans.sort()
    print("overlap", any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])))
    saved = state(0)
    loaded = load(state(1), ckpt)
    print("loaded", sorted(loaded) == sorted(saved) and all(
        torch.equal(loaded[key], saved[key].data) for key in saved))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
