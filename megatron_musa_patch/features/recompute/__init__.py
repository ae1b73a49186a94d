"""Fine-grained recompute: ``--attn-recompute``, ``--mlp-recompute``, ``--recompute-variance``.

* ``--attn-recompute``: every transformer layer's attention block (input norm, QKV, RoPE, core
  attention, output projection, bias-dropout-add) keeps only its input; the rest is recomputed
  in backward.
* ``--mlp-recompute``: the same for the MLP block (pre-MLP norm, fc1, activation, fc2,
  bias-dropout-add); on MoE layers the expert computation and the shared experts are
  recomputed (and the pre-MLP norm output), not the router or the token dispatch.
* ``--recompute-variance``: in a recomputed block the recompute stops at the input of the
  block's last linear layer (``linear_proj`` / ``linear_fc2``), whose backward is applied from
  the saved output gradient without re-running its forward; in a block that is not recomputed,
  the norm output is not kept but recomputed from the block input.

Also: the grouped experts' fc2 GEMM skipped in the variance recompute (``GroupedMLP``), a shared
expert overlapped with the token dispatch (``--moe-shared-expert-overlap``) recomputed without
losing the overlap, and upstream's ``--recompute-granularity full --recompute-method block
--recompute-num-layers 0`` (no layer fully recomputed) accepted beside the flags. The RMSNorm
variants of MT-Megatron are parts of this feature (``recompute.mla_rms``, ``recompute.mlp_rms``).

Checkpoints are Megatron's own (``tensor_parallel.checkpoint``, ``CheckpointWithoutOutput``),
which restore the CPU, device and RNG-tracker states, so dropout matches bit for bit. The flags
are carried onto the TransformerConfig (``attn_recompute``, ``mlp_recompute``,
``recompute_variance``) and read when a layer runs; a megatron-core user sets those attributes.
The logic lives in ``megatron_musa_patch.lib.recompute``.
"""

from __future__ import annotations

import functools

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.lib.recompute import grouped, rules, wrappers
from megatron_musa_patch.core.feature import feature

# after expert_bias_out_of_place: the recompute wrapper of MLP.forward sits inside the fix's
FEATURE = feature(
    __name__,
    "--attn-recompute, --mlp-recompute, --recompute-variance",
    after=("upstream_fixes.expert_bias_out_of_place",))


_LAYER = "megatron.core.transformer.transformer_layer:TransformerLayer."
_EXPERTS = "megatron.core.transformer.moe.experts:"
_LAYERS = "megatron.core.tensor_parallel.layers:"
_SHARED = "megatron.core.transformer.moe.shared_experts:SharedExpertMLP."


#: the feature that serves each of the recompute flags (lib.recompute asks through ``require``)
SERVED_BY = {**{name: FEATURE.name for name in rules.FLAGS}, "q_rms_recompute": "recompute.mla_rms",
             "mla_rms_recompute": "recompute.mla_rms", "mlp_rms_recompute": "recompute.mlp_rms"}


def requirement(session):
    """``require(flag)`` for lib.recompute's wrappers: the session's paragraph where the flag's
    feature is off or broken."""
    def require(flag: str) -> None:
        session.require(SERVED_BY[flag], rules.ALL_FLAGS[flag])

    return require


@hookimpl
def mmp_register_patches(session, registry):
    def bound(wrapper):
        return functools.partial(wrapper, requirement(session))

    registry.extend(
        [
            FEATURE.patch(
                "attention_block",
                _LAYER + "_forward_attention",
                "wrap",
                bound(wrappers.forward_attention),
                why="--attn-recompute checkpoints the attention block; variance: norm recompute",
            ),
            FEATURE.patch(
                "mlp_block",
                _LAYER + "_forward_mlp",
                "wrap",
                bound(wrappers.forward_mlp),
                why="--mlp-recompute checkpoints the MLP block; variance: norm recompute",
            ),
            FEATURE.patch(
                "sequential_experts",
                _EXPERTS + "SequentialMLP.forward",
                "wrap",
                bound(wrappers.experts_forward),
                why="--mlp-recompute checkpoints the expert computation (not the dispatch)",
            ),
            *FEATURE.patches_at(
                "grouped_mlp_forward",
                "grouped_experts",
                "wrap",
                bound(wrappers.experts_forward),
                why="--mlp-recompute checkpoints the expert computation (not the dispatch)",
            ),
            FEATURE.patch(
                "te_grouped_experts",
                _EXPERTS + "TEGroupedMLP.forward",
                "wrap",
                bound(wrappers.experts_forward),
                why="--mlp-recompute checkpoints the expert computation (not the dispatch)",
            ),
            FEATURE.patch(
                "shared_experts",
                "megatron.core.transformer.mlp:MLP.forward",
                "wrap",
                bound(wrappers.shared_experts_forward),
                why="--mlp-recompute checkpoints the shared experts (their MLP, not the gate)",
            ),
            *FEATURE.patches_at(
                "grouped_mlp_gemm_module",
                "grouped_experts_fc2",
                "attribute",
                grouped.GroupedGemmModule(),
                why="--recompute-variance: GroupedMLP's fc2 GEMM skipped in the "
                "recompute, its backward applied from the saved output gradient",
            ),
            FEATURE.patch(
                "overlapped_shared_expert_fc1",
                _SHARED + "linear_fc1_forward_and_act",
                "wrap",
                bound(wrappers.overlapped_shared_fc1),
                why="--mlp-recompute with --moe-shared-expert-overlap: the shared expert still "
                "runs inside the token dispatch (the overlap is kept); its fc1 input is kept",
            ),
            FEATURE.patch(
                "overlapped_shared_expert_fc2",
                _SHARED + "linear_fc2_forward",
                "wrap",
                bound(wrappers.overlapped_shared_fc2),
                why="--mlp-recompute with --moe-shared-expert-overlap: the overlapped shared "
                "expert's fc1 output and activation are released and recomputed from its fc1 "
                "input before fc2's backward (not kept, as under --mlp-recompute's checkpoint)",
            ),
            FEATURE.patch(
                "deferred_linear",
                _LAYERS + "RowParallelLinear._forward_impl",
                "wrap",
                wrappers.row_parallel_forward_impl,
                why="--recompute-variance: the block's last linear skips its forward in recompute",
            ),
            FEATURE.patch(
                "deferred_reduce",
                _LAYERS + "reduce_from_tensor_model_parallel_region",
                "wrap",
                wrappers.reduce_passes_deferred,
                why="--recompute-variance: no all-reduce of a skipped linear's placeholder",
            ),
        ]
    )


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group(title="recompute",
                                      description="fine-grained recompute (megatron_musa_patch)")
    group.add_argument("--attn-recompute", action="store_true",
                       help="Recompute each layer's attention block (input norm, QKV, RoPE, "
                            "core attention, output projection) in backward; keep only its "
                            "input.")
    group.add_argument("--mlp-recompute", action="store_true",
                       help="Recompute each layer's MLP block (pre-MLP norm, fc1, activation, "
                            "fc2) in backward; on MoE layers the experts and shared experts, "
                            "not the token dispatch.")
    group.add_argument("--recompute-variance", action="store_true",
                       help="Cheaper recompute: with --attn-recompute/--mlp-recompute do not "
                            "re-run the block's last linear layer (its backward runs from the "
                            "saved output gradient); in blocks not recomputed, recompute the "
                            "norm output from the block input instead of keeping it.")
    return parser


@hookimpl
def mmp_validate_args(args):
    found = rules.upstream_problems(args) + rules.problems(args)
    if found:
        raise ArgumentError(found[0])


@hookimpl
def mmp_transformer_config(args, config):
    for name in rules.FLAGS:
        setattr(config, name, bool(getattr(args, name, False)))
