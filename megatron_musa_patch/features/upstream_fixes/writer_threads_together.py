"""A rank's ``torch_dist`` writer threads write their buckets alongside the last one, not after it.

From 0.17, megatron-core's ``FileSystemWriterAsync`` writes a rank's part of a checkpoint with
threads (0.16: forked processes): one file ("bucket") a thread, ``thread_count`` of them. Its
``write_preloaded_data_multithread`` makes a thread for every bucket but the last, writes the
last one itself, and only then starts the threads: the buckets are written one after another, so a
save with ``thread_count`` 2 (``--async-save --dist-ckpt-workers 2``; a strategy with a
``separation_hint``; a program's own strategy) takes as long as with 1, plus the split. Here every
thread starts before the last bucket is written, each bucket by upstream's own
``write_preloaded_data``; the results reach the save as upstream's do (a dict of each bucket's
write results, or one exception naming the bucket that failed). What it saves: docs/benchmarks.md,
checkpoint conversion (``benchmarks/bench_checkpoint_import.py --without
upstream_fixes.writer_threads_together``).
"""

from __future__ import annotations

import gc
import queue
import threading

from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl

FEATURE = feature(
    __name__,
    "a rank's torch_dist writer threads write their buckets at the same time, not one after "
    "another (megatron-core 0.17 on)")
WRITER = "megatron.core.dist_checkpointing.strategies.filesystem_async:FileSystemWriterAsync"

#: the threaded writer arrives in 0.17, whose method is the same as 0.18's and 0.19's
STARTS = ">=0.17.1"


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", f"{WRITER}.write_preloaded_data_multithread", "replace",
        staticmethod(write_buckets_together), megatron=STARTS,
        starts="megatron-core 0.16 writes the buckets in forked processes, started together",
        why="the writer starts its threads only after writing the last bucket itself"))


def write_buckets_together(transform_list, use_msc, rank, write_buckets, global_results_queue):
    """Upstream's signature and contract: each bucket written (and fsynced) by upstream's
    ``write_preloaded_data``, the first ones in threads started now, the last in this thread
    meanwhile; ``global_results_queue`` gets ``{bucket index: write results}``, or an exception
    when a bucket failed. The collector is off while it runs, as upstream has it: a collection
    during the write can free tensors another process shares."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    collecting = gc.isenabled()
    gc.disable()
    try:
        global_results_queue.put(_write_all(FileSystemWriterAsync.write_preloaded_data,
                                            transform_list, use_msc, write_buckets))
    finally:
        if collecting:
            gc.enable()


def _write_all(write_one, transform_list, use_msc, write_buckets):
    """Each of ``write_buckets`` written by ``write_one`` (upstream's ``write_preloaded_data``),
    all at once; their results by bucket, or the first failure."""
    if not write_buckets:  # upstream's writer does not call it then; nothing to write
        return {}
    outputs: queue.Queue = queue.Queue()  # (bucket index, write results or exception)
    extra = {"use_msc": True} if use_msc else {}

    def write(index):
        try:  # upstream's writer puts its own output, failures included; not its call's
            write_one(transform_list, local_proc_idx=index, write_bucket=write_buckets[index],
                      results_queue=outputs, count_queue=None, use_fsync=True, **extra)
        except Exception as error:
            outputs.put((index, error))

    threads = [threading.Thread(target=write, args=(index,), daemon=True,
                                name=f"torch_dist writer {index}")
               for index in range(len(write_buckets) - 1)]
    for thread in threads:
        thread.start()
    write(len(write_buckets) - 1)
    for thread in threads:  # no bucket is left being written when the save reports
        thread.join()
    results = {}
    while not outputs.empty():
        index, output = outputs.get_nowait()
        results[index] = output
    for index in range(len(write_buckets)):
        output = results.get(index)
        if not isinstance(output, list):
            why = "it reported no result" if output is None else repr(output)
            return RuntimeError(f"torch_dist writer: bucket {index} of {len(write_buckets)} "
                                f"({write_buckets[index][1]}) failed: {why}")
    return results
