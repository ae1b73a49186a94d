"""destroy_model_parallel releases the groups of its initialisation: initialises and destroys
model parallelism three times on one rank and prints, per round, the process groups there were
after initialising and after destroying, as a Python list of pairs.

Run by tests/device/test_cpu.py (test_destroy_model_parallel_releases_its_groups)."""

import tempfile

import megatron_musa_patch  # activates the layer before megatron loads
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d
from megatron.core import parallel_state as ps


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    dist.init_process_group("nccl", init_method="file://" + tempfile.mktemp(), rank=0,
                            world_size=1)
    counts = []
    for _ in range(3):
        ps.initialize_model_parallel(1, 1)
        made = len(distributed_c10d._world.pg_map)
        dist.all_reduce(torch.ones(1), group=ps.get_tensor_model_parallel_group())
        ps.destroy_model_parallel()
        counts.append((made, len(distributed_c10d._world.pg_map)))
    print(counts)


if __name__ == "__main__":
    main()
