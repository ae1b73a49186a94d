"""Offload / precision-aware flag checks: one paragraph naming the flag and the fix.

The Megatron-LM flags (``mmp_validate_args``, before Megatron's own validation, where the dtype
flags are still strings) and the megatron-core OptimizerConfig (attributes) are checked alike;
the config wrapper itself runs in an activated subprocess.
"""

import argparse
import json
import types

import pytest
import torch

from megatron_musa_patch.features.offload import cpu_offload
from megatron_musa_patch.lib.offload import dtypes

from tests.conftest import run_probe, subprocess_env


def args(**overrides):
    base = dict(optimizer_cpu_offload=False, optimizer_offload_fraction=1.0,
                overlap_cpu_optimizer_d2h_h2d=False, use_torch_optimizer_for_cpu_offload=False,
                use_precision_aware_optimizer=False, use_distributed_optimizer=True,
                optimizer="adam", bf16=False, fp16=False, main_grads_dtype="fp32",
                main_params_dtype="fp32", exp_avg_dtype="fp32", exp_avg_sq_dtype="fp32")
    base.update(overrides)
    return argparse.Namespace(**base)


OFFLOAD = dict(optimizer_cpu_offload=True, use_precision_aware_optimizer=True)


def problems(**overrides):
    a = args(**overrides)
    return cpu_offload._flag_problems(a, a.optimizer_cpu_offload, a.use_precision_aware_optimizer)


@pytest.mark.parametrize("overrides", [
    dict(OFFLOAD), dict(OFFLOAD, optimizer_offload_fraction=0.5),
    dict(OFFLOAD, overlap_cpu_optimizer_d2h_h2d=True, bf16=True, exp_avg_dtype="bf16"),
    dict(use_precision_aware_optimizer=True, bf16=True, main_params_dtype="fp16",
         main_grads_dtype="bf16", exp_avg_dtype="fp16", exp_avg_sq_dtype="bf16"),
    dict(),
], ids=["offload", "half", "overlap-bf16-moments", "aware-16-bit", "nothing"])
def test_accepted(overrides):
    assert problems(**overrides) == []


@pytest.mark.parametrize("overrides,expected", [
    (dict(OFFLOAD, use_distributed_optimizer=False),
     "--optimizer-cpu-offload needs --use-distributed-optimizer"),
    (dict(optimizer_cpu_offload=True), "needs --use-precision-aware-optimizer"),
    (dict(OFFLOAD, optimizer_offload_fraction=0.0), "--optimizer-offload-fraction 0.0 is outside"),
    (dict(OFFLOAD, optimizer_offload_fraction=1.5), "--optimizer-offload-fraction 1.5 is outside"),
    (dict(OFFLOAD, optimizer="sgd"), "--optimizer-cpu-offload supports --optimizer adam"),
    (dict(overlap_cpu_optimizer_d2h_h2d=True),
     "--overlap-cpu-optimizer-d2h-h2d has no effect without --optimizer-cpu-offload"),
    (dict(optimizer_offload_fraction=0.5),
     "--optimizer-offload-fraction has no effect without --optimizer-cpu-offload"),
    (dict(exp_avg_dtype="bf16"), "--exp-avg-dtype bf16 needs --use-precision-aware-optimizer"),
    (dict(use_precision_aware_optimizer=True, use_distributed_optimizer=False),
     "--use-precision-aware-optimizer needs --use-distributed-optimizer"),
    (dict(use_precision_aware_optimizer=True, exp_avg_sq_dtype="fp16"),
     "--exp-avg-sq-dtype fp16 (exp_avg_sq_dtype) is not stored safely"),
    (dict(use_precision_aware_optimizer=True, exp_avg_dtype="fp8"),
     "--exp-avg-dtype fp8 (exp_avg_dtype) is not stored safely"),
    (dict(use_precision_aware_optimizer=True, main_params_dtype="fp16"),
     "--main-params-dtype fp16 (main_params_dtype) for a fp32 model"),
    (dict(OFFLOAD, bf16=True, main_params_dtype="fp16"),
     "the offloaded optimizer keeps fp32 master weights"),
    (dict(use_precision_aware_optimizer=True, main_grads_dtype="bf16"),
     "--main-grads-dtype bf16 (main_grads_dtype) keeps the gradients of a --bf16 model"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_refused_with_the_flag_and_the_fix(overrides, expected):
    found = problems(**overrides)
    assert found and expected in found[0], found


def test_dtype_rules_explain_why():
    found = dtypes.problems(main_params_dtype=torch.float32, main_grads_dtype=torch.float32,
                            exp_avg_dtype=torch.float32, exp_avg_sq_dtype=torch.float16,
                            model_dtype=torch.bfloat16, offload=False)
    assert len(found) == 1 and "flush to zero" in found[0] and "Use fp32 or bf16" in found[0]


def test_config_check_names_attributes_for_megatron_core_users():
    config = types.SimpleNamespace(
        optimizer_cpu_offload=True, optimizer_offload_fraction=0.0, use_distributed_optimizer=True,
        use_precision_aware_optimizer=True, decoupled_weight_decay=True, bf16=False, fp16=False,
        main_params_dtype=torch.float32, main_grads_dtype=torch.float32,
        exp_avg_dtype=torch.float32, exp_avg_sq_dtype=torch.float32)
    with pytest.raises(cpu_offload.ArgumentError, match="optimizer_offload_fraction=0.0"):
        cpu_offload._check_config(config)


def test_optimizer_config_without_te_activated():
    proc = run_probe("tests.features.offload.cpu_offload.probes.optimizer_configs",
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert "RESULT" in proc.stdout, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    # upstream raises "requires FusedAdam from TransformerEngine" here
    assert out["aware"] == ["ok", False, True]
    assert out["aware-bf16-moments"] == ["ok", False, True]
    assert out["aware-fp16-sq"][0] == "refused" and "exp_avg_sq_dtype" in out["aware-fp16-sq"][1]
    # megatron-core's default fraction is 0.0: offloading nothing is refused, not silent
    assert out["offload-zero"][0] == "refused"
    assert "optimizer_offload_fraction=0.0" in out["offload-zero"][1]
    assert out["offload-half"] == ["ok", True, True]
    # every patch found its target in the installed megatron-core
    assert len(out["patches"]) == 12 and set(out["patches"].values()) == {"applied"}, out
