"""``--moe-complementary-seq-aux-loss``: DeepSeek-V3's complementary sequence-wise balance loss,
as MT-Megatron computes it (a part of the MoE balance feature, ``moe_mla_mtp.moe_device_balance``).

With ``--moe-router-load-balancing-type seq_aux_loss`` upstream computes the per-sequence loss
from per-token normalised scores, but counts each expert's load from a plain top-k of those
scores. MT-Megatron (and DeepSeek's routing) counts the routing that actually happened: after
group-limited routing (``--moe-router-group-topk`` / ``--moe-router-topk-limited-devices``),
the aux-loss-free expert bias (``--moe-router-enable-expert-bias`` / ``--moe-noaux-gamma``) and
capacity drops. With this flag, upstream's ``seq_load_balancing_loss`` term is replaced by that
one (same name in the log, same coefficient ``--moe-aux-loss-coeff``), attached the way upstream
attaches it; the formula is ``moe_balance.sequence_balance_loss``.

Like MT-Megatron it goes without the device-level and communication losses (DeepSeek-V3 uses
this loss alone).
"""

from __future__ import annotations

import contextvars

import torch

from megatron_musa_patch.lib import moe_balance
from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

# the balance features wrap TopKRouter.routing in a chain: the device-level losses outermost,
# then this loss, then the top-k normalisation, then the group score
FEATURE = feature(
    __name__,
    "--moe-complementary-seq-aux-loss (DeepSeek-V3's loss on the routing that happened)",
    after=("moe_mla_mtp.moe_device_balance",),
    aliases=("moe_device_balance.complementary_seq_aux_loss",))

ROUTER = "megatron.core.transformer.moe.router:TopKRouter."
LOSS_NAME = "seq_load_balancing_loss"

#: the router whose upstream seq_aux_loss is replaced during its routing
_replacing = contextvars.ContextVar("mmp_complementary_router", default=None)


def _types(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("MoE balance (MT-Megatron spellings)")
    group.add_argument("--moe-complementary-seq-aux-loss", action="store_true",
                       help="With --moe-router-load-balancing-type seq_aux_loss: count each "
                            "expert's load from the routing that happened (group limits, expert "
                            "bias, capacity drops) instead of a plain top-k (DeepSeek-V3).")


@hookimpl
def mmp_validate_args(args):
    if not getattr(args, "moe_complementary_seq_aux_loss", False):
        return
    flag = "--moe-complementary-seq-aux-loss"
    if not args.num_experts:
        raise ArgumentError(f"{flag} applies to MoE layers: add --num-experts.")
    if "seq_aux_loss" not in _types(args.moe_router_load_balancing_type):
        raise ArgumentError(
            f"{flag} is a form of the sequence-wise balance loss: add "
            f"--moe-router-load-balancing-type seq_aux_loss (now "
            f"{' '.join(_types(args.moe_router_load_balancing_type))}), or drop {flag}.")
    others = [name for name, attr in (("--moe-device-level-aux-loss-coeff",
                                       "moe_device_level_aux_loss_coeff"),
                                      ("--moe-comm-aux-loss-coeff", "moe_comm_aux_loss_coeff"))
              if getattr(args, attr, 0)]
    if others:
        raise ArgumentError(
            f"{flag} is DeepSeek-V3's loss, used without the device-level and communication "
            f"losses (MT-Megatron asserts it): drop {' and '.join(others)}, or drop {flag}.")


@hookimpl
def mmp_transformer_config(args, config):
    config.moe_complementary_seq_aux_loss = bool(getattr(args, "moe_complementary_seq_aux_loss",
                                                         False))


@hookimpl
def mmp_register_patches(registry):
    registry.add(
        FEATURE.patch(
            "routing",
            ROUTER + "routing",
            "wrap",
            _routing,
            why="--moe-complementary-seq-aux-loss: the sequence loss from the routed "
            "map, attached after upstream routing",
        )
    )
    registry.add(
        FEATURE.patch(
            "upstream_term",
            ROUTER + "_apply_seq_aux_loss",
            "wrap",
            _upstream_term,
            why="--moe-complementary-seq-aux-loss: upstream's plain top-k term left out",
        )
    )


def _active(router) -> bool:
    return (getattr(router.config, "moe_complementary_seq_aux_loss", False) and router.training
            and torch.is_grad_enabled() and router.get_aux_loss_coeff("seq_aux_loss") > 0)


def _upstream_term(wrapped, instance, args, kwargs):
    if _replacing.get() is instance:
        return call_arguments(wrapped, args, kwargs)["probs"]
    return wrapped(*args, **kwargs)


def _routing(wrapped, instance, args, kwargs):
    if not _active(instance):
        return wrapped(*args, **kwargs)
    token = _replacing.set(instance)
    try:
        probs, routing_map = wrapped(*args, **kwargs)
    finally:
        _replacing.reset(token)
    from megatron.core.transformer.moe.moe_utils import (
        compute_routing_scores_for_aux_loss, get_tokens_per_expert_and_token_count)

    call = call_arguments(wrapped, args, kwargs)
    logits, padding_mask = call["logits"], call.get("padding_mask")
    seq_length, bsz = logits.shape[:2]
    experts = instance.config.num_moe_experts
    if padding_mask is not None:
        padding_mask = padding_mask.reshape(-1)
    _, scores = compute_routing_scores_for_aux_loss(
        logits.reshape(-1, experts), instance.topk, instance.score_function, fused=False,
        padding_mask=padding_mask)
    routed = routing_map.reshape(seq_length, -1)  # [s, b * N]: sequence b's counts per expert
    if padding_mask is not None:
        routed = routed * (~padding_mask).reshape(seq_length, bsz, 1).expand(
            -1, -1, experts).reshape(seq_length, -1)
    counts, local_tokens, total_tokens = get_tokens_per_expert_and_token_count(
        routing_map=routed, reduce_group=instance.tp_cp_group, topk=instance.topk * bsz,
        with_padding_mask=padding_mask is not None)
    coeff = instance.get_aux_loss_coeff("seq_aux_loss")
    loss = moe_balance.sequence_balance_loss(scores, counts.reshape(bsz, experts), total_tokens,
                                             bsz, instance.topk, coeff)
    probs = instance.attach_and_log_load_balancing_loss(
        probs, coeff, loss, LOSS_NAME, instance.tp_cp_group, valid_token_count=local_tokens)
    return probs, routing_map
