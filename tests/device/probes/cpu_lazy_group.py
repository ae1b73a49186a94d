"""One of two ranks (``rank store_path``): whether a gloo group connects on first use, as NCCL's
does. Rank 0 makes the group and says so in the store; rank 1 makes it only once rank 0 has
(``lazy``), or after 8 s if rank 0 is still waiting in new_group (``eager``). Each prints how it
made the group and the sum of an all-reduce over it.

Run by tests/device/test_cpu.py (test_groups_connect_on_first_use_as_with_nccl)."""

import datetime
import sys

import megatron_musa_patch  # activates the layer
import torch
import torch.distributed as dist


def make_group(rank, store):
    if rank == 0:
        group = dist.new_group([0, 1])  # eager gloo: waits here until rank 1 makes it too
        store.set("rank0-made-it", "1")
        return "made", group
    try:  # makes the group only once rank 0 has (or after 8 s, so that eager ends too)
        store.wait(["rank0-made-it"], datetime.timedelta(seconds=8))
        how = "lazy"
    except Exception:
        how = "eager"
    return how, dist.new_group([0, 1])


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    rank, store_path = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("nccl", init_method="file://" + store_path, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    how, group = make_group(rank, dist.distributed_c10d._get_default_store())
    x = torch.ones(1) * (rank + 1)
    dist.all_reduce(x, group=group)
    print(how, x.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
