"""One of two ranks (``store_path rank``): all_gather takes shards of different sizes, as NCCL
does (Megatron-FSDP's uneven shards), where torch's own gloo path refuses them. Prints torch's
own error, then the gathered lists: uneven 1-D, uneven 2-D asynchronously, and even.

Run by tests/device/test_cpu.py (test_all_gather_takes_shards_of_different_sizes_as_nccl_does)."""

import sys

import megatron_musa_patch  # activates the layer
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    rank = int(sys.argv[2])
    dist.init_process_group("nccl", init_method="file://" + sys.argv[1], rank=rank,
                            world_size=2)
    # rank 0 holds 3 elements, rank 1 five (Megatron-FSDP's uneven shards, flattened)
    mine = torch.arange(3.0) if rank == 0 else torch.arange(10.0, 15.0)
    outputs = [torch.full((3,), -1.0), torch.full((5,), -1.0)]
    try:
        distributed_c10d.all_gather.__wrapped__(outputs, mine)
    except RuntimeError as error:
        print("torch's own:", str(error).splitlines()[0])
    dist.all_gather(outputs, mine)
    print("gathered", [o.tolist() for o in outputs])
    # 2-D shards of different rows, asynchronously
    mine = torch.ones(1, 2) * (rank + 1) if rank == 0 else torch.ones(2, 2) * (rank + 1)
    outputs = [torch.zeros(1, 2), torch.zeros(2, 2)]
    work = dist.all_gather(outputs, mine, async_op=True)
    work.wait()
    print("async", [o.tolist() for o in outputs])
    # outputs of the input's shape take torch's own path
    outputs = [torch.zeros(2), torch.zeros(2)]
    dist.all_gather(outputs, torch.full((2,), float(rank)))
    print("even", [o.tolist() for o in outputs])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
