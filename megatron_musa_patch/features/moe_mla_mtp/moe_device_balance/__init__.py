"""DeepSeek-V2 device-level MoE balancing: two auxiliary losses and a device-level capacity.

Flags (carried onto the TransformerConfig under the same names):

* ``--moe-device-level-aux-loss-coeff a2`` -- device-level balance loss;
* ``--moe-comm-aux-loss-coeff a3`` -- communication balance loss;
* ``--moe-device-level-capacity`` -- ``--moe-expert-capacity-factor`` bounds each expert-parallel
  device (the sum of its experts' capacities) instead of each expert.

The math is in ``megatron_musa_patch/lib/moe_balance.py``. Here, ``TopKRouter.routing`` is wrapped:
it marks the router whose routing is under way (for the token-dropping step) and, after upstream
routing, attaches the two losses the way upstream attaches its own (``MoEAuxLossAutoScaler``,
logged through the aux-loss tracker as ``device_level_balancing_loss`` and
``communication_balancing_loss``, per layer with ``--moe-per-layer-logging``). They are added to
whichever ``--moe-router-load-balancing-type`` upstream applies. Counts are reduced over the
router's tensor x context-parallel group, like upstream's ``load_balancing_loss``.
"""

from __future__ import annotations

import contextvars
import functools
from typing import List

import torch

from megatron_musa_patch.lib import moe_balance
from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "DeepSeek-V2 device-level and communication balance losses, device-level capacity",
    aliases=("moe_device_balance",))


DEVICE_LOSS = "device_level_balancing_loss"
COMM_LOSS = "communication_balancing_loss"
ROUTER = "megatron.core.transformer.moe.router"

_routing_router = contextvars.ContextVar("mmp_routing_router", default=None)


def _tracked(session) -> List[str]:
    """The loss names Megatron-LM's training loop must reduce and log in this run (set from the
    flags; every rank gets the same list, which the cross-rank reduction needs)."""
    return session.state_for(f"{FEATURE.name}.tracked", list)


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group("MoE device-level balancing (DeepSeek-V2)")
    group.add_argument("--moe-device-level-aux-loss-coeff", type=float, default=0.0,
                       help="Coefficient of the device-level balance loss (0: off).")
    group.add_argument("--moe-comm-aux-loss-coeff", type=float, default=0.0,
                       help="Coefficient of the communication balance loss (0: off).")
    group.add_argument("--moe-device-level-capacity", action="store_true",
                       help="Apply --moe-expert-capacity-factor per expert-parallel device (the "
                            "sum of its experts' capacities) instead of per expert.")


@hookimpl
def mmp_validate_args(args):
    a2 = args.moe_device_level_aux_loss_coeff
    a3 = args.moe_comm_aux_loss_coeff
    capacity = args.moe_device_level_capacity
    if not (a2 or a3 or capacity):
        return
    names = [n for n, on in (("--moe-device-level-aux-loss-coeff", a2),
                             ("--moe-comm-aux-loss-coeff", a3),
                             ("--moe-device-level-capacity", capacity)) if on]
    if not args.num_experts:
        raise ArgumentError(f"{', '.join(names)} apply to MoE layers: add --num-experts.")
    if a2 < 0 or a3 < 0:
        raise ArgumentError("--moe-device-level-aux-loss-coeff and --moe-comm-aux-loss-coeff "
                            "must be >= 0.")
    ep = args.expert_model_parallel_size
    if args.num_experts % ep:
        raise ArgumentError(f"--num-experts {args.num_experts} is not divisible by "
                            f"--expert-model-parallel-size {ep}.")
    if (a2 or a3) and args.moe_router_load_balancing_type == "sinkhorn":
        raise ArgumentError("the device-level losses do not combine with "
                            "--moe-router-load-balancing-type sinkhorn (no auxiliary losses).")
    groups = args.moe_router_num_groups
    if a3 and groups and groups != ep:
        raise ArgumentError(
            f"--moe-comm-aux-loss-coeff counts the devices a token reaches, so group-limited "
            f"routing must use one group per device: --moe-router-num-groups {groups} differs from "
            f"--expert-model-parallel-size {ep}.")
    if capacity:
        if args.moe_expert_capacity_factor is None:
            raise ArgumentError("--moe-device-level-capacity applies --moe-expert-capacity-factor "
                                "per device: add --moe-expert-capacity-factor.")
        if args.moe_pad_expert_input_to_capacity:
            raise ArgumentError("--moe-device-level-capacity lets one expert take more than its "
                                "own capacity, so --moe-pad-expert-input-to-capacity (per-expert "
                                "padding) cannot hold: remove one of them.")


@hookimpl
def mmp_transformer_config(args, config, session):
    config.moe_device_level_aux_loss_coeff = args.moe_device_level_aux_loss_coeff
    config.moe_comm_aux_loss_coeff = args.moe_comm_aux_loss_coeff
    config.moe_device_level_capacity = args.moe_device_level_capacity
    track(session, [name for name, on in ((DEVICE_LOSS, args.moe_device_level_aux_loss_coeff),
                                          (COMM_LOSS, args.moe_comm_aux_loss_coeff)) if on])


def track(session, names: List[str]) -> None:
    """Make Megatron-LM's MoE logging reduce and print these loss names (every rank alike)."""
    _tracked(session)[:] = names


@hookimpl
def mmp_register_patches(session, registry):
    registry.add(
        FEATURE.patch(
            "routing",
            f"{ROUTER}:TopKRouter.routing",
            "wrap",
            _routing,
            why="device-level / communication losses after upstream routing",
        )
    )
    registry.add(
        FEATURE.patch(
            "token_dropping",
            f"{ROUTER}:apply_router_token_dropping",
            "wrap",
            _token_dropping,
            why="--moe-device-level-capacity: capacity per device, not per expert",
        )
    )
    registry.extend(FEATURE.patches_at(
        "moe_metrics_report", "track_moe_metrics", "wrap",
        functools.partial(_track_moe_metrics, _tracked(session)),
        why="log the two losses next to upstream's"))


def _cfg(config, name, default=0.0):
    return getattr(config, name, default) or default


def _routing(wrapped, instance, args, kwargs):
    token = _routing_router.set(instance)
    try:
        probs, routing_map = wrapped(*args, **kwargs)
    finally:
        _routing_router.reset(token)
    config = instance.config
    a2 = _cfg(config, "moe_device_level_aux_loss_coeff")
    a3 = _cfg(config, "moe_comm_aux_loss_coeff")
    if not (a2 or a3) or not (instance.training and torch.is_grad_enabled()):
        return probs, routing_map
    from megatron.core.transformer.moe.moe_utils import (
        compute_routing_scores_for_aux_loss, get_tokens_per_expert_and_token_count)

    logits = call_arguments(wrapped, args, kwargs)["logits"]
    logits = logits.view(-1, config.num_moe_experts)
    devices = config.expert_model_parallel_size
    group = instance.tp_cp_group
    aux_map, scores = compute_routing_scores_for_aux_loss(
        logits, instance.topk, instance.score_function, fused=False)
    if a2:
        counts, _, total = get_tokens_per_expert_and_token_count(
            routing_map=aux_map, reduce_group=group, topk=instance.topk)
        loss = moe_balance.device_level_balance_loss(
            scores, counts, total, instance.topk, devices, a2)
        probs = instance.attach_and_log_load_balancing_loss(probs, a2, loss, DEVICE_LOSS, group)
    if a3:
        from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

        sent = reduce_from_tensor_model_parallel_region(
            moe_balance.tokens_per_device(routing_map, devices).to(scores.dtype), group)
        total = routing_map.shape[0] * group.size()
        max_devices = moe_balance.max_devices_per_token(
            instance.topk, devices, config.moe_router_num_groups, config.moe_router_group_topk)
        loss = moe_balance.communication_balance_loss(
            scores, sent, total, devices, max_devices, a3)
        probs = instance.attach_and_log_load_balancing_loss(probs, a3, loss, COMM_LOSS, group)
    return probs, routing_map


def _token_dropping(wrapped, instance, args, kwargs):
    router = _routing_router.get()
    if router is None or not getattr(router.config, "moe_device_level_capacity", False):
        return wrapped(*args, **kwargs)
    a = call_arguments(wrapped, args, kwargs)
    return moe_balance.drop_over_device_capacity(
        a["routing_probs"], a["routing_map"], a["router_topk"], router.config.expert_model_parallel_size,
        a["capacity_factor"], by=a["drop_policy"])


def _track_moe_metrics(tracked, wrapped, instance, args, kwargs):
    """Upstream reduces and logs only the loss names it is given (from 0.18 it then clears
    what was recorded): add the two device-level ones to upstream's list."""
    if not tracked:
        return wrapped(*args, **kwargs)
    call = call_arguments(wrapped, args, kwargs)
    names = call.get("track_names")
    if names is None:
        return wrapped(*args, **kwargs)
    names = [names] if isinstance(names, str) else list(names)
    call["track_names"] = names + [n for n in tracked if n not in names]
    return wrapped(**call)
