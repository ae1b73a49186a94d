"""One gloo rank (file store ``sys.argv[1]``), a two-linear Tiny in DDP under the distributed
optimizer: the ``step`` of each param group in its state dict, and the keys of the live state,
with no state (``empty``), with moments filled as upstream's tests fill them (``moments``), and
after a step with one parameter's state refilled with moments only (``stepped``). Prints
``<when> <steps> <live keys>``, or ``<when> refused <error>`` where the state dict fails.

Run by tests/features/upstream_fixes/test_distopt_step_counters.py."""

import sys

from tests.features.upstream_fixes.probes.one_rank import Tiny, join_one_rank  # activates
import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.transformer import TransformerConfig


def steps(optimizer, when):
    try:
        groups = optimizer.state_dict()["optimizer"]["param_groups"]
    except (AssertionError, KeyError) as error:
        print(when, "refused", type(error).__name__, error)
        return
    live = [sorted(s) for s in optimizer.optimizer.state.values()]
    print(when, [g["step"] for g in groups], live)


def main(store):
    join_one_rank(store)
    config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
    model = DistributedDataParallel(config, ddp_config, Tiny(config, layers=2))
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=0.1, use_distributed_optimizer=True), [model])
    inner = optimizer.optimizer
    steps(optimizer, "empty")
    first = inner.param_groups[0]["params"][0]
    inner.state[first]["exp_avg"] = torch.rand_like(first)
    inner.state[first]["exp_avg_sq"] = torch.rand_like(first)
    steps(optimizer, "moments")
    for p in model.parameters():
        p.main_grad.fill_(1.0)
    inner.state.clear()
    optimizer.step()
    late = inner.state[inner.param_groups[-1]["params"][-1]]
    late.clear()
    late["exp_avg"] = torch.zeros(1)
    steps(optimizer, "stepped")


if __name__ == "__main__":
    main(sys.argv[1])
