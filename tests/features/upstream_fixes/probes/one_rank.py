"""What the optimizer probes of tests/features/upstream_fixes share: the layer (imported first,
so it activates before torch and megatron-core), one gloo rank on a file store with
megatron-core's model-parallel state, and ``Tiny(config, layers=1)``, a MegatronModule of 4x4
linears."""

import megatron_musa_patch  # activates the layer: before megatron is imported
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.module import MegatronModule


def join_one_rank(store):
    """Rank 0 of a one-rank gloo group on the file store ``store`` (the probe's argv[1])."""
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    parallel_state.initialize_model_parallel()


class Tiny(MegatronModule):
    def __init__(self, config, layers=1):
        super().__init__(config)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(layers))
