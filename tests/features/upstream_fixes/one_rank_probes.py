"""What the optimizer probes (run by ``run_on_one_cpu_rank``) share."""

#: the start of a probe: the layer, one gloo rank on the file store ``sys.argv[1]``, megatron-core's
#: model-parallel state, and ``Tiny(config, layers=1)``, a MegatronModule of 4x4 linears
PRELUDE = """
import sys
import megatron_musa_patch
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import MegatronModule

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
parallel_state.initialize_model_parallel()


class Tiny(MegatronModule):
    def __init__(self, config, layers=1):
        super().__init__(config)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(layers))
"""


def apex_or_te_installed():
    """With either, megatron-core builds FusedAdam, which keeps lr and step in its groups."""
    from megatron_musa_patch.upstream.conditions import importable

    return importable("transformer_engine") or importable("apex")
