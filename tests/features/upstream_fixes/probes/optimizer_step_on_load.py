"""One gloo rank (file store ``sys.argv[1]``), a one-linear Tiny in DDP; for fp32 and bf16:
optimizer A's moments filled before any step (as upstream's checkpointing tests and
init_state_fn do) and saved, then loaded into optimizer B, which steps. Prints
``<optimizer> loaded <steps> stepped <steps> <moments>``, or ``<optimizer> refused <error>``
where the load fails.

Run by tests/features/upstream_fixes/test_optimizer_step_on_load.py."""

import sys

from tests.features.upstream_fixes.probes.one_rank import Tiny, join_one_rank  # activates
import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.transformer import TransformerConfig


def optimizer(bf16):
    config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1, bf16=bf16,
                               params_dtype=torch.bfloat16 if bf16 else torch.float32)
    module = Tiny(config)
    if bf16:
        module = module.bfloat16()
    model = DistributedDataParallel(config, DistributedDataParallelConfig(), module)
    config = OptimizerConfig(optimizer="adam", lr=0.1, bf16=bf16, clip_grad=0.0)
    built = get_megatron_optimizer(config, [model]).chained_optimizers[0]
    for group in built.optimizer.param_groups:
        for p in group["params"]:
            built.optimizer.state[p]["exp_avg"] = torch.full_like(p, 0.5)
            built.optimizer.state[p]["exp_avg_sq"] = torch.full_like(p, 0.25)
    return model, built


def save_load_step(bf16):
    _, saved = optimizer(bf16)
    state_dict = saved.state_dict()
    model, loaded = optimizer(bf16)
    try:
        loaded.load_state_dict(state_dict)
    except KeyError as error:
        print(type(loaded).__name__, "refused", type(error).__name__, error)
        return
    steps = [float(s["step"]) for s in loaded.optimizer.state.values()]
    for p in model.parameters():
        p.main_grad.fill_(1.0)
    loaded.step()
    after = [float(s["step"]) for s in loaded.optimizer.state.values()]
    moments = {round(float(s["exp_avg"].flatten()[0]), 4)
               for s in loaded.optimizer.state.values()}
    print(type(loaded).__name__, "loaded", steps, "stepped", after, sorted(moments))


def main(store):
    join_one_rank(store)
    for bf16 in (False, True):
        save_load_step(bf16)


if __name__ == "__main__":
    main(sys.argv[1])
