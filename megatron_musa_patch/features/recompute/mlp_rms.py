"""MT-Megatron's ``--mlp-rms-recompute`` (a part of the ``recompute`` feature).

On MoE layers the pre-MLP RMSNorm's output and the shared expert are not kept for backward but
recomputed: the norm output is released and recomputed from the layer's MLP input, the shared
expert checkpointed (its fc2 skipped with ``--recompute-variance``; a shared expert overlapped
with the token dispatch keeps the overlap, its activations are released). The router and the
token dispatch run once. That is MT-Megatron's region (norm, router gating, shared expert); the
router's input is the released norm output. On dense layers, as in MT-Megatron, the flag acts
only with ``--mlp-recompute``, which recomputes the whole block anyway; a model without MoE
layers and without ``--mlp-recompute`` is refused (the flag would do nothing).

Carried onto the TransformerConfig as ``mlp_rms_recompute``; the logic is in
``megatron_musa_patch/lib/recompute/rms.py``.
"""

from __future__ import annotations

import functools

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.lib.recompute import rms, rules
from megatron_musa_patch.core.feature import feature
from . import requirement

# after recompute: its wrappers of the MLP paths sit inside recompute's
FEATURE = feature(
    __name__,
    "--mlp-rms-recompute (MT-Megatron's pre-MLP RMSNorm + shared expert recompute)",
    after=("recompute",))

FLAGS = ("mlp_rms_recompute",)
_SHARED = "megatron.core.transformer.moe.shared_experts:SharedExpertMLP."


@hookimpl
def mmp_register_patches(session, registry):
    def bound(impl):
        return functools.partial(impl, requirement(session))

    registry.extend(
        [
            FEATURE.patch(
                "pre_mlp_norm",
                "megatron.core.transformer.transformer_layer:TransformerLayer._forward_mlp",
                "wrap",
                bound(rms.pre_mlp_norm),
                why="--mlp-rms-recompute: a MoE layer's pre-MLP norm output released, "
                "recomputed in backward",
            ),
            FEATURE.patch(
                "shared_experts",
                "megatron.core.transformer.mlp:MLP.forward",
                "wrap",
                bound(rms.shared_expert),
                why="--mlp-rms-recompute: the shared expert checkpointed",
            ),
            FEATURE.patch(
                "overlapped_shared_expert_fc1",
                _SHARED + "linear_fc1_forward_and_act",
                "wrap",
                bound(rms.overlapped_shared_fc1),
                why="--mlp-rms-recompute with --moe-shared-expert-overlap: overlap kept",
            ),
            FEATURE.patch(
                "overlapped_shared_expert_fc2",
                _SHARED + "linear_fc2_forward",
                "wrap",
                bound(rms.overlapped_shared_fc2),
                why="--mlp-rms-recompute with --moe-shared-expert-overlap: the shared expert's "
                "fc1 output and activation released, recomputed before fc2's backward",
            ),
        ]
    )


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group(
        title="recompute: pre-MLP RMSNorm", description="MT-Megatron spelling (megatron_musa_patch)")
    group.add_argument("--mlp-rms-recompute", action="store_true",
                       help="On MoE layers, do not keep the pre-MLP RMSNorm output and the "
                            "shared expert's activations; recompute them in backward.")


@hookimpl
def mmp_validate_args(args):
    found = [m for m in rules.problems(args) if "--mlp-rms-recompute" in m]
    if found:
        raise ArgumentError(found[0])


@hookimpl
def mmp_transformer_config(args, config):
    config.mlp_rms_recompute = bool(getattr(args, "mlp_rms_recompute", False))
