"""One of four ranks (``store_path rank``) in groups [0, 2] and [1, 3]: torch's autograd
all_to_all works on a subgroup, forward and backward with sizes that differ by sender, as on
NCCL. Prints what torch's own gloo path names as a source, what each rank received, and the
gradients of its inputs.

Run by tests/device/test_cpu.py (test_autograd_all_to_all_works_on_a_subgroup_as_on_nccl)."""

import sys
import types

import megatron_musa_patch  # activates the layer
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as F


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    rank = int(sys.argv[2])
    dist.init_process_group("nccl", init_method="file://" + sys.argv[1], rank=rank,
                            world_size=4)
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group = groups[rank % 2]
    mine = dist.get_rank(group)
    try:  # torch's own gloo path names the sources as global ranks 0 and 1
        F._AlltoAll.forward.__wrapped__(types.SimpleNamespace(), group, [torch.zeros(1)] * 2,
                                        torch.zeros(1), torch.zeros(1))
        print("torch's own: ran")
    except ValueError as error:
        print("torch's own:", str(error).split(" is not")[0])
    # to group rank j: (rank + 1) * 10 + j; each rank sends mine + 1 rows (sizes differ by
    # sender, as in Megatron's dynamic-resolution gather)
    inputs = [torch.full((mine + 1, 2), (rank + 1) * 10.0 + j, requires_grad=True)
              for j in range(2)]
    outputs = [torch.empty(i + 1, 2) for i in range(2)]
    received = F.all_to_all(outputs, inputs, group=group)
    print("received", [t[:, 0].tolist() for t in received])
    sum((t * (2 * mine + i + 1)).sum() for i, t in enumerate(received)).backward()
    print("grads", [t.grad[:, 0].tolist() for t in inputs])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
