"""upstream_fixes.optimizer_step_on_load: without Apex/TE, megatron-core's non-distributed
optimizers (FP32Optimizer, Float16OptimizerWithFloat16Params) load moments saved before any step
into torch's Adam, at step 0, and a step then runs from there."""

import pytest

from tests.conftest import printed_lines, run_on_one_cpu_rank
from tests.features.upstream_fixes.one_rank_probes import PRELUDE, apex_or_te_installed

#: one gloo rank, a one-linear MegatronModule in DDP; for fp32 and bf16: optimizer A's moments
#: filled before any step (as upstream's checkpointing tests and init_state_fn do) and saved, then
#: loaded into optimizer B, which steps
PROBE = PRELUDE + """
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


for bf16 in (False, True):
    _, saved = optimizer(bf16)
    state_dict = saved.state_dict()
    model, loaded = optimizer(bf16)
    try:
        loaded.load_state_dict(state_dict)
    except KeyError as error:
        print(type(loaded).__name__, "refused", type(error).__name__, error)
        continue
    steps = [float(s["step"]) for s in loaded.optimizer.state.values()]
    for p in model.parameters():
        p.main_grad.fill_(1.0)
    loaded.step()
    after = [float(s["step"]) for s in loaded.optimizer.state.values()]
    moments = {round(float(s["exp_avg"].flatten()[0]), 4) for s in loaded.optimizer.state.values()}
    print(type(loaded).__name__, "loaded", steps, "stepped", after, sorted(moments))
"""


pytestmark = pytest.mark.skipif(apex_or_te_installed(),
                                reason="Apex or TE is installed: megatron-core uses FusedAdam")


def _results(proc):
    return printed_lines(proc, ("FP32Optimizer", "Float16OptimizerWithFloat16Params"))


def test_moments_saved_before_any_step_load_at_step_0_and_step_on(tmp_path):
    # two parameters (weight, bias) each; exp_avg after one step: 0.9 * 0.5 + 0.1 * 1.0
    assert _results(run_on_one_cpu_rank(PROBE, tmp_path)) == [
        "FP32Optimizer loaded [0.0, 0.0] stepped [1.0, 1.0] [0.55]",
        "Float16OptimizerWithFloat16Params loaded [0.0, 0.0] stepped [1.0, 1.0] [0.55]",
    ]


def test_without_the_fix_torch_adam_refuses_them(tmp_path):
    proc = run_on_one_cpu_rank(PROBE, tmp_path,
                               MEGATRON_MUSA_PATCH_DISABLE="upstream_fixes.optimizer_step_on_load")
    assert _results(proc) == ["FP32Optimizer refused KeyError 'step'",
                              "Float16OptimizerWithFloat16Params refused KeyError 'step'"]
