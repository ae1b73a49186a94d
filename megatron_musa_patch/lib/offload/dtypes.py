"""Which storage dtypes the precision-aware optimizer accepts, and why the others are refused.

The optimizer's math runs in fp32; these are the dtypes the state is *stored* in between steps.
Without TransformerEngine there is no per-tensor scaling of the stored state, so a dtype is
accepted only where unscaled storage keeps the values:

* master weights: fp32, or fp16 for a bf16 model (3 more mantissa bits than the weights and a
  range that holds weights). An fp16 or bf16 master for an fp16/fp32 model is no more precise
  than the weights it masters, so small updates would be rounded away.
* first moment (exp_avg): fp32, bf16, fp16 -- it has the magnitude of the gradients.
* second moment (exp_avg_sq): fp32, bf16. fp16 is refused: squared gradients below 6e-8 (fp16's
  smallest subnormal, reached by gradients below 2.4e-4) flush to zero and the update divides by
  eps alone.
* fp8 anywhere: needs TE's scaled fp8 state.
"""

from __future__ import annotations

from typing import List, Optional

import torch

#: config attribute -> the Megatron-LM flag that sets it
FLAGS = {
    "main_params_dtype": "--main-params-dtype",
    "main_grads_dtype": "--main-grads-dtype",
    "exp_avg_dtype": "--exp-avg-dtype",
    "exp_avg_sq_dtype": "--exp-avg-sq-dtype",
}
MOMENT_DTYPES = {
    "exp_avg_dtype": (torch.float32, torch.bfloat16, torch.float16),
    "exp_avg_sq_dtype": (torch.float32, torch.bfloat16),
}
NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
         torch.uint8: "fp8"}


def name(dtype) -> str:
    return NAMES.get(dtype, str(dtype).replace("torch.", ""))


def problems(*, main_params_dtype, main_grads_dtype, exp_avg_dtype, exp_avg_sq_dtype,
             model_dtype: torch.dtype, offload: bool) -> List[str]:
    """One sentence per refused choice, naming the flag and what to use instead."""
    found = []
    for attr, allowed in MOMENT_DTYPES.items():
        dtype = {"exp_avg_dtype": exp_avg_dtype, "exp_avg_sq_dtype": exp_avg_sq_dtype}[attr]
        if dtype not in allowed:
            found.append(f"{FLAGS[attr]} {name(dtype)} ({attr}) is not stored safely without "
                         f"TransformerEngine's scaled state: {_why(attr, dtype)} Use "
                         f"{' or '.join(name(d) for d in allowed)}.")
    master = _master_problem(main_params_dtype, model_dtype, offload)
    if master:
        found.append(master)
    if main_grads_dtype not in (torch.float32, torch.bfloat16):
        found.append(f"--main-grads-dtype {name(main_grads_dtype)} (main_grads_dtype) is not "
                     f"supported: use fp32 or bf16.")
    elif main_grads_dtype == torch.bfloat16 and model_dtype != torch.bfloat16:
        found.append(f"--main-grads-dtype bf16 (main_grads_dtype) keeps the gradients of a "
                     f"--bf16 model in bf16; this model is {name(model_dtype)}: add --bf16 or "
                     f"remove --main-grads-dtype.")
    return found


def _why(attr: str, dtype) -> str:
    if dtype == torch.uint8:
        return "fp8 state needs per-tensor scales."
    if attr == "exp_avg_sq_dtype" and dtype == torch.float16:
        return ("squared gradients below 6e-8 (gradients below 2.4e-4) flush to zero in fp16 "
                "and the update then divides by eps alone.")
    return "this dtype is not supported."


def _master_problem(dtype, model_dtype, offload: bool) -> Optional[str]:
    if dtype == torch.float32:
        return None
    if offload:
        return (f"--main-params-dtype {name(dtype)} (main_params_dtype) with "
                f"--optimizer-cpu-offload: the offloaded optimizer keeps fp32 master weights "
                f"(upstream's param_update_in_fp32); remove --main-params-dtype.")
    if dtype == torch.float16 and model_dtype == torch.bfloat16:
        return None
    return (f"--main-params-dtype {name(dtype)} (main_params_dtype) for a {name(model_dtype)} "
            f"model: master weights must be more precise than the model weights they master, "
            f"or small updates are rounded away. Use fp32 (or fp16 with --bf16).")
