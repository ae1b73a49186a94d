"""One gloo rank (file store ``sys.argv[1]``), a one-linear Tiny in DDP, the optimizer built from
the config's defaults (upstream's checkpointing tests do this): prints ``built <kind> <config's
lr> <groups' lr> <defaults' lr>`` for each, then a step before any lr is set, ``step ran`` or
``step refused`` (a TypeError).

Run by tests/features/upstream_fixes/test_optimizer_lr_unset.py."""

import sys

from tests.features.upstream_fixes.probes.one_rank import Tiny, join_one_rank  # activates
import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.transformer import TransformerConfig


def main(store):
    join_one_rank(store)
    config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1)
    model = DistributedDataParallel(config, DistributedDataParallelConfig(), Tiny(config))
    for kind, lr in (("adam", None), ("sgd", None), ("adam", 0.25)):
        optimizer_config = OptimizerConfig(optimizer=kind, lr=lr)
        inner = get_megatron_optimizer(optimizer_config, [model]).optimizer
        print("built", kind, optimizer_config.lr, [g["lr"] for g in inner.param_groups],
              inner.defaults["lr"])
    # the last one built (adam, lr 0.25), its first group's lr unset as the config leaves it
    for p in inner.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    inner.param_groups[0]["lr"] = None
    try:
        inner.step()
        print("step ran")
    except TypeError:
        print("step refused")


if __name__ == "__main__":
    main(sys.argv[1])
