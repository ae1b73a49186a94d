"""``--moe-router-group-score max``: group-limited routing that scores a group by its best
expert (DeepSeek-V2's device-limited routing, ``group_limited_greedy`` in its Hugging Face
config; a part of the MoE balance feature, ``moe_mla_mtp.moe_device_balance``).

megatron-core's ``--moe-router-num-groups`` / ``--moe-router-group-topk`` score a group by the
sum of its top ``topk / group-topk`` experts (DeepSeek-V3's node-limited rule). With ``max``
the ``group-topk`` groups holding the highest single scores are kept, then the top-k experts
among them, so a DeepSeek-V2 checkpoint routes its tokens to the experts it was trained with.

The TransformerConfig gets ``moe_router_group_score``; ``group_limited_topk`` is wrapped while a
``TopKRouter`` routes; the math is ``moe_balance.best_expert_group_topk``.
"""

from __future__ import annotations

from megatron_musa_patch.lib import moe_balance
from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

# innermost of the balance features' wrappers of TopKRouter.routing
FEATURE = feature(
    __name__,
    "--moe-router-group-score max (a group scored by its best expert: DeepSeek-V2)",
    after=("moe_mla_mtp.moe_device_balance.topk_prob_norm",),
    aliases=("moe_device_balance.group_score",))

ROUTER = "megatron.core.transformer.moe.router"
MOE_UTILS = "megatron.core.transformer.moe.moe_utils"
#: upstream's rule (the default) and the best-expert rule
TOPK_SUM, MAX = "topk-sum", "max"

_routing = moe_balance.RoutingConfig("mmp_group_score_config")


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("MoE router (group-limited routing)")
    group.add_argument("--moe-router-group-score", choices=(TOPK_SUM, MAX), default=TOPK_SUM,
                       help="How --moe-router-group-topk ranks the expert groups: topk-sum "
                            "(megatron-core's: the sum of each group's top topk/group-topk "
                            "scores, DeepSeek-V3) or max (its best expert, DeepSeek-V2).")


@hookimpl
def mmp_validate_args(args):
    if getattr(args, "moe_router_group_score", TOPK_SUM) != MAX:
        return
    if not (args.num_experts and args.moe_router_num_groups and args.moe_router_group_topk):
        raise ArgumentError(
            "--moe-router-group-score max ranks the groups of group-limited routing: add "
            "--num-experts, --moe-router-num-groups and --moe-router-group-topk (or drop it).")
    if getattr(args, "moe_router_fusion", False):
        raise ArgumentError("--moe-router-group-score max is applied to megatron-core's unfused "
                            "top-k routing; --moe-router-fusion (TransformerEngine's fused "
                            "router) bypasses it: drop one of them.")


@hookimpl
def mmp_transformer_config(args, config):
    config.moe_router_group_score = getattr(args, "moe_router_group_score", TOPK_SUM)


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch("routing", f"{ROUTER}:TopKRouter.routing", "wrap",
                               _routing.wrap_routing,
                               why="--moe-router-group-score: the routing router's config"))
    registry.add(
        FEATURE.patch(
            "group_topk",
            f"{MOE_UTILS}:group_limited_topk",
            "wrap",
            _group_topk,
            why="--moe-router-group-score max: a group ranked by its best expert",
        )
    )


def _group_topk(wrapped, instance, args, kwargs):
    config = _routing.get()
    if getattr(config, "moe_router_group_score", TOPK_SUM) != MAX:
        return wrapped(*args, **kwargs)
    call = call_arguments(wrapped, args, kwargs)
    return moe_balance.best_expert_group_topk(call["scores"], call["topk"], call["num_groups"],
                                              call["group_topk"])
