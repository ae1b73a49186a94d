"""torch.manual_seed(42) then model_parallel_cuda_manual_seed(41): use_cpu_initialization draws
on torch.manual_seed's stream, as on a GPU, and the device generator (dropout's) is where the
device seed put it. Prints ``ok``.

Run by tests/device/test_cpu.py (test_cpu_initialization_draws_from_the_host_generator)."""

import tempfile

import megatron_musa_patch  # activates the layer before megatron loads
import torch
from megatron.core import parallel_state as ps
from megatron.core.tensor_parallel.layers import ColumnParallelLinear
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig


def build(config, device_seed):
    torch.manual_seed(42)
    model_parallel_cuda_manual_seed(device_seed)
    weight = ColumnParallelLinear(16, 8, config=config, init_method=config.init_method,
                                  bias=False).weight.detach().clone()
    return weight, torch.rand(4, device="cuda")


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    store = tempfile.mktemp()
    torch.distributed.init_process_group("nccl", init_method="file://" + store, rank=0,
                                         world_size=1)
    ps.initialize_model_parallel(1, 1)
    config = TransformerConfig(num_layers=1, hidden_size=12, num_attention_heads=4,
                               use_cpu_initialization=True)
    w42, _ = build(config, 42)
    w41, device_draw = build(config, 41)
    expected = torch.empty(8, 16)
    torch.manual_seed(42)
    config.init_method(expected)
    assert torch.equal(w42, w41), "the device seed reached CPU initialisation"
    assert torch.equal(w41, expected), "CPU initialisation is not on torch.manual_seed's stream"
    fresh = torch.rand(4, generator=torch.Generator().manual_seed(41))
    assert torch.equal(device_draw, fresh), "the host draws moved the device generator"
    print("ok")


if __name__ == "__main__":
    main()
