"""One gloo rank (its file store ``sys.argv[1]``): the reduce op megatron-fsdp picks for fp32
gradients scaled by 0.25 (gradient_reduce_div_fusion on), used in a reduce-scatter as its
buffers use it. Prints ``reduced <values>`` or ``refused <first line of the error>``, then
``config fusion <the config's setting afterwards>``.

Run by tests/features/device/test_fsdp_reduce_unfused.py."""

import sys

import megatron_musa_patch  # activates the layer: before megatron is imported
import torch
import torch.distributed as dist

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.distributed.fsdp.src.megatron_fsdp import param_and_grad_buffer as buffers


def main(store):
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)
    config = DistributedDataParallelConfig(gradient_reduce_div_fusion=True)
    grad = torch.arange(8, dtype=torch.float32)
    op = buffers.gradient_reduce_preprocessing(grad, 0.25, config)
    out = torch.empty(8)
    try:
        dist.reduce_scatter_tensor(out, grad, op=op)
        print("reduced", out.tolist())
    except RuntimeError as error:
        print("refused", str(error).splitlines()[0])
    print("config fusion", config.gradient_reduce_div_fusion)


if __name__ == "__main__":
    main(sys.argv[1])
