"""Megatron-FSDP reduces its gradients without NCCL's ``PREMUL_SUM`` where the collectives lack it.

With ``gradient_reduce_div_fusion`` (on by default) and gradients that are not bf16, megatron-fsdp's
``gradient_reduce_preprocessing`` picks ``torch.distributed._make_nccl_premul_sum(factor)`` as
the reduce op: NCCL multiplies by the factor as it sums. gloo, the CPU row's collectives, has no
such op, and the reduce-scatter fails (``Cannot use ReduceOp.PREMUL_SUM with Gloo``). Upstream's
other branch scales the gradients itself, then reduces with ``SUM``: the same reduction in two
steps. The record takes that branch on the CPU row by handing upstream a copy of the config with
the fusion off; switch the feature off (``MEGATRON_MUSA_PATCH_DISABLE=device.fsdp_reduce_unfused``) to
keep upstream's choice.
"""

from __future__ import annotations

import copy

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.records import VERIFIED
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.device.rows import CPU

FEATURE = feature(
    __name__,
    "CPU row: megatron-fsdp scales its gradients, then reduces with SUM, instead of NCCL's "
    "PREMUL_SUM, which gloo does not have",
    aliases=("fsdp_reduce_unfused",), kept_out=("device",))


#: where megatron-fsdp picks its gradients' reduce op (every supported release)
FSDP_BUFFERS = "megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer"


@hookimpl
def mmp_register_patches(registry):
    registry.add(
        FEATURE.patch(
            "preprocessing",
            f"{FSDP_BUFFERS}:gradient_reduce_preprocessing",
            "wrap",
            _without_div_fusion,
            devices=frozenset({CPU.name}),
            why="gradient_reduce_div_fusion reduces with NCCL's PREMUL_SUM, which "
            "gloo does not have",
            torch=VERIFIED,
        )
    )


def _without_div_fusion(wrapped, instance, args, kwargs):
    """``gradient_reduce_preprocessing(grad_data, scaling_factor, ddp_config)``."""
    args = list(args)
    if len(args) >= 3:
        args[2] = _fusion_off(args[2])
    elif "ddp_config" in kwargs:
        kwargs = {**kwargs, "ddp_config": _fusion_off(kwargs["ddp_config"])}
    return wrapped(*args, **kwargs)


def _fusion_off(config):
    if not getattr(config, "gradient_reduce_div_fusion", False):
        return config
    config = copy.copy(config)  # the caller's config keeps its setting
    config.gradient_reduce_div_fusion = False
    return config
