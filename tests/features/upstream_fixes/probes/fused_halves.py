"""One gloo rank (file store ``sys.argv[1]``) saves a gated MLP input projection as Megatron's
checkpoint state holds it (its two halves, ``apply_swiglu_sharded_factory``) with megatron-core's
``torch_dist`` strategy to ``<store>.ckpt``, and loads it back into another.

Prints ``view copies <n>`` (the CPU pieces the writer copied while saving), ``file bytes <n>``
(what the save wrote, about the tensor's bytes: not its storage twice), ``loaded <True|False>``
(bit for bit), ``joined in place <True|False>`` (the loaded tensor is the memory it was loaded
into) and ``joins copied <n>`` (the ``torch.cat`` copies of the merge).

Run by tests/features/upstream_fixes/test_fused_halves.py."""

import os
import sys
from pathlib import Path

import megatron_musa_patch  # activates the layer: before megatron is imported
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.dist_checkpointing import ShardedTensor, load, save
from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy
from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

ROWS, COLUMNS = 256, 512


def counted(owner, name, counts, when):
    original = getattr(owner, name)

    def call(*args, **kwargs):
        if when(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
        return original(*args, **kwargs)

    setattr(owner, name, call)


def state(tensor):
    return {"fc1": apply_swiglu_sharded_factory(
        ShardedTensor.from_rank_offsets("fc1", tensor, replica_id=0), ())}


def main(store):
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    ckpt = Path(store + ".ckpt")
    os.makedirs(ckpt)
    saved = torch.randn(2 * ROWS, COLUMNS, generator=torch.Generator().manual_seed(0))
    counts = {}
    counted(torch.Tensor, "clone", counts, lambda self, *a, **k: (
        self.untyped_storage().nbytes() != self.numel() * self.element_size()))
    save(state(saved), ckpt, TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1))
    print("view copies", counts.get("clone", 0))
    print("file bytes", sum(p.stat().st_size for p in ckpt.glob("*.distcp")))
    into = torch.zeros_like(saved)
    counted(torch, "cat", counts, lambda tensors, *a, **k: len(tensors) == 2)
    loaded = load(state(into), ckpt)["fc1"]
    print("loaded", torch.equal(loaded, saved))
    print("joined in place", loaded.data_ptr() == into.data_ptr())
    print("joins copied", counts.get("cat", 0))


if __name__ == "__main__":
    main(sys.argv[1])
