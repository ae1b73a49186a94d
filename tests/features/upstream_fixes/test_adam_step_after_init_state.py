"""upstream_fixes.adam_step_after_init_state: without Apex/TE, megatron-core's optimizers step
torch's Adam over moments that their own ``init_state_fn`` filled before any step, as a fresh
state (step 0), instead of stopping at a missing ``step``."""

import pytest

from tests.conftest import printed_lines, run_on_one_cpu_rank
from tests.features.upstream_fixes.one_rank_probes import PRELUDE, apex_or_te_installed

#: one gloo rank, a one-linear MegatronModule in DDP; for fp32, bf16 and the distributed
#: optimizer: init_state_fn lays out the state (as checkpointing and upstream's tests do), then
#: one step with every gradient 1.0
PROBE = PRELUDE + """
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


for bf16, distributed in ((False, False), (True, False), (True, True)):
    model, built = optimizer(bf16, distributed)
    built.init_state_fn(built.optimizer)
    for p in model.parameters():
        p.main_grad.fill_(1.0)
    try:
        built.step()
    except KeyError as error:
        print(type(built).__name__, "refused", type(error).__name__, error)
        continue
    states = built.optimizer.state.values()
    steps = sorted({float(s["step"]) for s in states})
    moments = sorted({round(float(s["exp_avg"].flatten()[0]), 4) for s in states})
    print(type(built).__name__, "stepped", steps, moments)
"""

pytestmark = pytest.mark.skipif(apex_or_te_installed(),
                                reason="Apex or TE is installed: megatron-core uses FusedAdam")

OPTIMIZERS = ("FP32Optimizer", "Float16OptimizerWithFloat16Params", "DistributedOptimizer")


def _results(proc):
    return printed_lines(proc, OPTIMIZERS)


def test_moments_laid_out_by_init_state_fn_step_as_a_fresh_state(tmp_path):
    # exp_avg after one step from zeros with gradient 1.0: 0.9 * 0 + 0.1 * 1.0
    assert _results(run_on_one_cpu_rank(PROBE, tmp_path)) == [
        "FP32Optimizer stepped [1.0] [0.1]",
        "Float16OptimizerWithFloat16Params stepped [1.0] [0.1]",
        "DistributedOptimizer stepped [1.0] [0.1]",
    ]


def test_without_the_fix_torch_adam_refuses_to_step_them(tmp_path):
    proc = run_on_one_cpu_rank(
        PROBE, tmp_path, MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.adam_step_after_init_state")
    assert _results(proc) == [f"{name} refused KeyError 'step'" for name in OPTIMIZERS]
