"""One gloo rank (file store ``sys.argv[1]``) saves two sharded tensors (the second under the
prefix, in files of its own) to ``<store>.ckpt``, removes the prefixed one with
``remove_sharded_tensors``, then reads what the checkpoint still holds. Prints ``before <keys>``,
``refused <error>`` where the removal fails, and ``after <keys> <prefixed files>``.

Run by tests/features/upstream_fixes/test_writer_metadata_path.py."""

import os
import sys
from pathlib import Path

import megatron_musa_patch  # activates the layer: before megatron is imported
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.dist_checkpointing import ShardedTensor, remove_sharded_tensors, save
from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy
from torch.distributed.checkpoint import FileSystemReader


def main(store):
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    ckpt = Path(store + ".ckpt")  # a Path: upstream joins it with /
    os.makedirs(ckpt)
    state_dict = {"a": ShardedTensor.from_rank_offsets("keyA", torch.ones(2, 4)),
                  "b": ShardedTensor.from_rank_offsets("prefix_b", torch.ones(3, 5))}
    save(state_dict, ckpt,
         TorchDistSaveShardedStrategy("torch_dist", 1, separation_hint="prefix"))
    print("before", sorted(FileSystemReader(ckpt).read_metadata().state_dict_metadata))
    try:
        remove_sharded_tensors(ckpt, key_prefix="prefix")
    except AttributeError as error:
        print("refused", error)
    print("after", sorted(FileSystemReader(ckpt).read_metadata().state_dict_metadata),
          sorted(f for f in os.listdir(ckpt) if f.startswith("prefix")))


if __name__ == "__main__":
    main(sys.argv[1])
