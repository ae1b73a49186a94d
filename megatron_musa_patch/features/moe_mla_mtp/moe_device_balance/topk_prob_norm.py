"""``--moe-router-norm-topk-prob``: each token's selected expert probabilities normalised to sum
1 before ``--moe-router-topk-scaling-factor`` (MT-Megatron's flag; a part of the MoE balance
feature, ``moe_mla_mtp.moe_device_balance``).

* With sigmoid scores and top-k > 1 megatron-core already normalises (the same formula):
  nothing changes. MT-Megatron's ``--moe-router-use-sigmoid`` *without* this flag leaves them
  unnormalised -- so does the layer then (the selected sigmoid scores, times the scaling factor).
* With softmax scores and ``--moe-router-pre-softmax`` (the top-k of a softmax over all experts,
  which do not sum to 1) they are normalised here, as DeepSeek's / HF's ``norm_topk_prob`` does;
  MT-Megatron asserts sigmoid for this flag. Softmax over the selected logits already sums to 1.

The TransformerConfig gets ``moe_router_norm_topk_prob``: True (normalise), False (MT's
unnormalised sigmoid), None (upstream's behaviour). ``topk_routing_with_score_function`` is
wrapped while a ``TopKRouter`` routes; the math is ``moe_balance.normalise_topk``.
"""

from __future__ import annotations

import torch

from megatron_musa_patch.lib import moe_balance
from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

# inside the complementary loss's wrapper of TopKRouter.routing (see that module)
FEATURE = feature(
    __name__,
    "--moe-router-norm-topk-prob (and MT's unnormalised sigmoid without it)",
    after=("moe_mla_mtp.moe_device_balance.complementary_seq_aux_loss",),
    aliases=("moe_device_balance.topk_prob_norm",))

ROUTER = "megatron.core.transformer.moe.router"

_routing = moe_balance.RoutingConfig("mmp_topk_norm_config")


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("MoE router (MT-Megatron spellings)")
    group.add_argument("--moe-router-norm-topk-prob", action="store_true",
                       help="Normalise each token's selected expert probabilities to sum 1 "
                            "before --moe-router-topk-scaling-factor.")


def mode(args):
    """True, False (MT-Megatron's sigmoid without the flag) or None (upstream's behaviour)."""
    if getattr(args, "moe_router_norm_topk_prob", False):
        return True
    return False if getattr(args, "moe_router_use_sigmoid", False) else None


@hookimpl
def mmp_validate_args(args):
    if not getattr(args, "moe_router_norm_topk_prob", False):
        return
    if not args.num_experts:
        raise ArgumentError("--moe-router-norm-topk-prob applies to MoE routers: add "
                            "--num-experts.")
    if getattr(args, "moe_router_fusion", False):
        raise ArgumentError("--moe-router-norm-topk-prob is applied to megatron-core's unfused "
                            "top-k routing; --moe-router-fusion (TransformerEngine's fused "
                            "router) bypasses it: drop one of them.")


@hookimpl
def mmp_transformer_config(args, config):
    config.moe_router_norm_topk_prob = mode(args)


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch("routing", f"{ROUTER}:TopKRouter.routing", "wrap",
                               _routing.wrap_routing,
                               why="--moe-router-norm-topk-prob: the routing router's config"))
    registry.add(FEATURE.patch("topk", f"{ROUTER}:topk_routing_with_score_function", "wrap",
                               _topk,
                               why="--moe-router-norm-topk-prob: selected probabilities normalised "
                                   "before the scaling factor"))


def _topk(wrapped, instance, args, kwargs):
    config = _routing.get()
    wanted = getattr(config, "moe_router_norm_topk_prob", None) if config is not None else None
    if wanted is None:
        return wrapped(*args, **kwargs)
    call = call_arguments(wrapped, args, kwargs)
    score, topk, scale = call["score_function"], call["topk"], call["scaling_factor"]
    if call.get("fused"):
        return wrapped(*args, **kwargs)  # refused at validation with the flag
    if wanted:
        normalised_upstream = (score == "sigmoid" and topk > 1) or (
            score == "softmax" and not call["use_pre_softmax"])
        if normalised_upstream:
            return wrapped(*args, **kwargs)
        call["scaling_factor"] = None
        probs, routing_map = wrapped(**call)
        return moe_balance.normalise_topk(probs, scale), routing_map
    if score == "sigmoid" and topk > 1:  # MT-Megatron's sigmoid routing without the flag
        probs, routing_map = wrapped(*args, **kwargs)
        logits = call["logits"]
        raw = torch.sigmoid(logits.float()).type_as(logits)
        raw = raw * scale if scale else raw
        return torch.where(routing_map, raw, torch.zeros_like(raw)), routing_map
    return wrapped(*args, **kwargs)
