"""``--gradient-accumulation-fusion`` (default on): a stand-in for Apex's
``fused_weight_gradient_mlp_cuda`` (``ops.grad_accum``: the weight gradient GEMM accumulates into
``main_grad``). Upstream raises in ``ColumnParallelLinear`` without Apex."""

from __future__ import annotations

from megatron_musa_patch.upstream.conditions import importable, missing, te_installed
from megatron_musa_patch.core.flag_needs import FlagNeed
from megatron_musa_patch.core.hookspecs import hookimpl
from .spec import local_spec
from megatron_musa_patch.core.feature import feature


MODULE = "fused_weight_gradient_mlp_cuda"

FEATURE = feature(
    __name__,
    "--gradient-accumulation-fusion without Apex (ops.grad_accum)",
    flag_needs=(FlagNeed(
        "--gradient-accumulation-fusion",
        when=lambda args: getattr(args, "gradient_accumulation_fusion", False)
        and not importable(MODULE) and not (te_installed() and not local_spec(args)),
        because=f"on by default; upstream needs Apex's {MODULE} for it",
        instead="add --no-gradient-accumulation-fusion"),))


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", f"{MODULE}:*", "module", _fill, condition=lambda: missing(MODULE),
        why="--gradient-accumulation-fusion: weight gradients accumulate into main_grad"))


def _fill(module):
    from megatron_musa_patch.lib.ops import grad_accum

    module.__doc__ = "megatron_musa_patch stand-in for Apex's gradient-accumulation fusion"
    module.wgrad_gemm_accum_fp32 = grad_accum.wgrad_gemm_accum_fp32
    module.wgrad_gemm_accum_fp16 = grad_accum.wgrad_gemm_accum_fp16
