"""features/reliability/checkpoint_safety/async_snapshot.py: the async writer's preloading copies a
host-memory tensor held in shared memory (the trainer's, handed to the persistent worker), so
what is written is the iteration's state whatever the trainer does next; a synchronous save's
tensors (not shared) and a device-to-host copy are passed through."""

import functools

import torch

from megatron_musa_patch.features.reliability.checkpoint_safety.async_snapshot import (
    _with_snapshot_preload, snapshot_preload)


def buckets(*tensors):
    tensor_data = [(f"item{i}", t) for i, t in enumerate(tensors)]
    return [("/ckpt/__0_0.distcp", "__0_0.distcp", ([("bytes item", b"io")], tensor_data))]


def upstream_preload(write_buckets):
    """megatron-core's preload_tensors on host-memory tensors: ``tensor.to("cpu")``, itself."""
    return [(f, k, (b, [(item, t.to("cpu")) for item, t in ts])) for f, k, (b, ts) in write_buckets]


def test_a_shared_tensor_is_written_as_it_was_when_preloaded():
    trainer = torch.arange(6, dtype=torch.float32).share_memory_()
    preloaded = snapshot_preload(functools.partial(upstream_preload, buckets(trainer)))
    (_, _, (bytes_data, [(item, written)])), = preloaded
    trainer.add_(100)  # the next optimizer step, in place, while the worker writes
    assert item == "item0" and bytes_data == [("bytes item", b"io")]
    assert written.tolist() == [0, 1, 2, 3, 4, 5]
    # without the copy the worker writes what the trainer holds now
    (_, _, (_, [(_, upstream)])), = upstream_preload(buckets(trainer))
    assert upstream.tolist() == trainer.tolist() == [100, 101, 102, 103, 104, 105]


def test_a_synchronous_saves_tensors_are_not_copied():
    own = torch.ones(3)
    preloaded = snapshot_preload(functools.partial(upstream_preload, buckets(own)))
    (_, _, (_, [(_, written)])), = preloaded
    assert written is own


def test_the_writers_functions_keep_their_shape_and_a_rank_with_nothing_to_write():
    def get_save_function_and_args():
        return "save_fn", functools.partial(upstream_preload, buckets(torch.zeros(1))), ["rank"]

    save_fn, preload_fn, args = _with_snapshot_preload(get_save_function_and_args, None, (), {})
    assert (save_fn, args) == ("save_fn", ["rank"])
    assert preload_fn.func is snapshot_preload and len(preload_fn()) == 1
    nothing = _with_snapshot_preload(lambda: (None, None, []), None, (), {})
    assert nothing == (None, None, [])
