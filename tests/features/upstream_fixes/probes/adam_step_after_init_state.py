"""One gloo rank (file store ``sys.argv[1]``), a one-linear Tiny in DDP; for fp32, bf16 and the
distributed optimizer: ``init_state_fn`` lays out the state (as checkpointing and upstream's
tests do), then one step with every gradient 1.0. Prints ``<optimizer> stepped <steps>
<moments>``, or ``<optimizer> refused <error>`` where the step fails.

Run by tests/features/upstream_fixes/test_adam_step_after_init_state.py."""

import sys

from tests.features.upstream_fixes.probes.one_rank import Tiny, join_one_rank  # activates
import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.transformer import TransformerConfig


def optimizer(bf16, distributed):
    config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1, bf16=bf16,
                               params_dtype=torch.bfloat16 if bf16 else torch.float32)
    module = Tiny(config)
    if bf16:
        module = module.bfloat16()
    ddp = DistributedDataParallelConfig(use_distributed_optimizer=distributed)
    model = DistributedDataParallel(config, ddp, module)
    config = OptimizerConfig(optimizer="adam", lr=0.1, bf16=bf16, clip_grad=0.0,
                             use_distributed_optimizer=distributed)
    return model, get_megatron_optimizer(config, [model]).chained_optimizers[0]


def init_state_and_step(bf16, distributed):
    model, built = optimizer(bf16, distributed)
    built.init_state_fn(built.optimizer)
    for p in model.parameters():
        p.main_grad.fill_(1.0)
    try:
        built.step()
    except KeyError as error:
        print(type(built).__name__, "refused", type(error).__name__, error)
        return
    states = built.optimizer.state.values()
    steps = sorted({float(s["step"]) for s in states})
    moments = sorted({round(float(s["exp_avg"].flatten()[0]), 4) for s in states})
    print(type(built).__name__, "stepped", steps, moments)


def main(store):
    join_one_rank(store)
    for bf16, distributed in ((False, False), (True, False), (True, True)):
        init_state_and_step(bf16, distributed)


if __name__ == "__main__":
    main(sys.argv[1])
