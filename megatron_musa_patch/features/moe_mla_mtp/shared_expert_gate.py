"""``--moe-shared-expert-gate`` on every release: the shared expert's output scaled by a sigmoid
gate of the layer's input (Qwen2-MoE's ``shared_expert_gate``).

megatron-core has built the gate since 0.16 (``TransformerConfig.moe_shared_expert_gate``, its
``SharedExpertMLP.gate_weight``); from 0.17 the flag is upstream's (its config's argument
factory), on 0.16 it is this one, with the same name and meaning, carried onto the config.
"""

from __future__ import annotations

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl

FEATURE = feature(
    __name__,
    "--moe-shared-expert-gate on releases without the flag (megatron-core 0.16): the shared "
    "expert scaled by a sigmoid gate, as Qwen2-MoE")

FLAG = "--moe-shared-expert-gate"


@hookimpl
def mmp_add_arguments(parser):
    if FLAG in parser._option_string_actions:  # upstream's own flag (0.17 on)
        return
    group = parser.add_argument_group("MoE shared expert")
    group.add_argument(FLAG, action="store_true",
                       help="Scale the shared expert's output by a sigmoid gate of the layer's "
                            "input (Qwen2-MoE; megatron-core's own flag from 0.17).")


@hookimpl
def mmp_validate_args(args):
    if getattr(args, "moe_shared_expert_gate", False) and not getattr(
            args, "moe_shared_expert_intermediate_size", None):
        raise ArgumentError(f"{FLAG} gates the shared expert: add "
                            f"--moe-shared-expert-intermediate-size (or drop it).")


@hookimpl
def mmp_transformer_config(args, config):
    config.moe_shared_expert_gate = bool(getattr(args, "moe_shared_expert_gate", False))
