"""DeepSeek-V2's device-level MoE balancing (sections 2.2.2-2.2.4 of its paper), as plain torch.

Experts are spread over ``D`` expert-parallel devices in contiguous blocks (device ``i`` holds
experts ``E_i = [i*N/D, (i+1)*N/D)``, as Megatron places them). With ``T`` tokens, top-``K``
routing, ``s[t, j]`` the routing score of token ``t`` for expert ``j`` and ``c_j`` the number of
tokens routed to expert ``j``:

* expert load fraction ``f_j = N / (K*T) * c_j`` and mean score ``P_j = 1/T * sum_t s[t, j]``
  (upstream's ``switch_load_balancing_loss_func`` uses the same definitions);
* device-level loss ``a2 * sum_i f'_i * P'_i`` with ``f'_i = mean_{j in E_i} f_j`` and
  ``P'_i = sum_{j in E_i} P_j``;
* communication loss ``a3 * sum_i f''_i * P''_i`` with ``f''_i = D / (M*T) * (tokens sent to
  device i)``, ``M`` the number of devices a token may be routed to, ``P''_i = sum_{j in E_i} P_j``;
* device-level capacity: the per-expert capacity summed over a device's experts bounds the
  (token, expert) assignments the device receives; the lowest-scoring ones above it are dropped.

Counts are constants; gradients flow through the scores, as in upstream's load-balancing loss.
Counts and token totals may come from a wider group than the local scores (``global_*``
arguments): each rank's loss is then its share of the global loss, as upstream does.
"""

from __future__ import annotations

import contextvars
import math
from typing import Optional, Tuple

import torch


def _per_device(x: torch.Tensor, num_devices: int) -> torch.Tensor:
    """[..., N] -> [..., D, N/D]"""
    n = x.shape[-1]
    if n % num_devices:
        raise ValueError(f"{n} experts cannot be split evenly over {num_devices} devices")
    return x.reshape(*x.shape[:-1], num_devices, n // num_devices)


def device_level_balance_loss(scores: torch.Tensor, tokens_per_expert: torch.Tensor,
                              num_tokens: int, topk: int, num_devices: int,
                              coeff: float) -> torch.Tensor:
    """``coeff * sum_i f'_i * P'_i``.

    scores: [T_local, N] routing scores of the local tokens; tokens_per_expert: [N] counts over
    the reduction group; num_tokens: tokens in that group (T)."""
    num_experts = scores.shape[-1]
    f = tokens_per_expert.to(scores.dtype) * (num_experts / (topk * num_tokens))
    p = scores.sum(dim=0) / num_tokens
    f_dev = _per_device(f, num_devices).mean(dim=-1)
    p_dev = _per_device(p, num_devices).sum(dim=-1)
    return coeff * torch.sum(f_dev * p_dev)


def tokens_per_device(routing_map: torch.Tensor, num_devices: int) -> torch.Tensor:
    """[T, N] bool -> [D]: how many tokens are sent to each device (at most once per token)."""
    return _per_device(routing_map, num_devices).any(dim=-1).sum(dim=0)


def communication_balance_loss(scores: torch.Tensor, tokens_to_device: torch.Tensor,
                               num_tokens: int, num_devices: int, max_devices: int,
                               coeff: float) -> torch.Tensor:
    """``coeff * sum_i f''_i * P''_i``; tokens_to_device: [D] counts over the reduction group."""
    f = tokens_to_device.to(scores.dtype) * (num_devices / (max_devices * num_tokens))
    p_dev = _per_device(scores.sum(dim=0) / num_tokens, num_devices).sum(dim=-1)
    return coeff * torch.sum(f * p_dev)


def expert_capacity(num_tokens: int, topk: int, num_experts: int, capacity_factor: float) -> int:
    """Upstream's per-expert capacity (``moe_utils.get_capacity``)."""
    return math.ceil((num_tokens * topk / num_experts) * capacity_factor)


def drop_over_device_capacity(probs: torch.Tensor, routing_map: torch.Tensor, topk: int,
                              num_devices: int, capacity_factor: float,
                              by: str = "probs") -> Tuple[torch.Tensor, torch.Tensor]:
    """Keep, per device, at most ``|E_i| * expert capacity`` (token, expert) assignments: the
    highest-scoring ones (``by="probs"``) or the earliest tokens (``by="position"``).

    probs, routing_map: [T, N]. Returns (probs, routing_map) with the dropped entries zeroed."""
    num_tokens, num_experts = routing_map.shape
    per_device = num_experts // num_devices
    capacity = per_device * expert_capacity(num_tokens, topk, num_experts, capacity_factor)
    routed = _per_device(routing_map, num_devices)  # [T, D, E]
    if by == "probs":
        rank_key = _per_device(probs.detach(), num_devices).float()
    elif by == "position":
        order = torch.arange(num_tokens, 0, -1, device=probs.device, dtype=torch.float32)
        rank_key = order[:, None, None].expand(num_tokens, num_devices, per_device)
    else:
        raise ValueError(f"unknown drop policy {by!r}")
    rank_key = rank_key.masked_fill(~routed, float("-inf"))
    # per device, candidates are (token, local expert) pairs
    flat = rank_key.permute(1, 0, 2).reshape(num_devices, num_tokens * per_device)
    k = min(capacity, flat.shape[1])
    keep_idx = torch.topk(flat, k=k, dim=1).indices
    keep = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, keep_idx, True)
    keep = keep.reshape(num_devices, num_tokens, per_device).permute(1, 0, 2)
    keep = keep.reshape(num_tokens, num_experts) & routing_map
    return probs * keep, keep


def max_devices_per_token(topk: int, num_devices: int, num_groups: Optional[int],
                          group_topk: Optional[int]) -> int:
    """M: group-limited routing over D groups allows ``group_topk`` devices, else min(K, D)."""
    if num_groups and group_topk:
        return group_topk
    return min(topk, num_devices)


# ----------------------------------------------------------------------------- DeepSeek-V3 /
# MT-Megatron router pieces


def sequence_balance_loss(scores: torch.Tensor, tokens_per_expert: torch.Tensor,
                          seq_tokens: int, bsz: int, topk: int, coeff: float) -> torch.Tensor:
    """The complementary sequence-wise balance loss (DeepSeek-V3 eq. 17-20, as MT-Megatron
    computes it): ``coeff * mean_b sum_i f[b, i] * P[b, i]`` with
    ``f[b, i] = N / (K * S) * c[b, i]``, ``c`` the (token, expert) assignments of sequence ``b``
    in the routing that happened (after group-limited routing, expert bias and capacity drops),
    and ``P[b, i] = 1/S * sum_t s'[t, b, i]``, ``s'`` the scores normalised per token.

    scores: [S_local * b, N] per-token normalised scores in Megatron's [s, b] order;
    tokens_per_expert: [b, N] counts over the reduction group; seq_tokens: ``S``, a sequence's
    tokens in that group (the local share of the loss is returned, as upstream does)."""
    num_experts = scores.shape[-1]
    per_seq = scores.reshape(-1, bsz, num_experts)  # [S_local, b, N]
    f = tokens_per_expert.to(scores.dtype) * (num_experts / (topk * seq_tokens))
    p = per_seq.sum(dim=0) / seq_tokens
    return coeff * (f * p).sum(dim=-1).mean()


def normalise_topk(probs: torch.Tensor, scaling_factor: Optional[float]) -> torch.Tensor:
    """MT-Megatron's ``--moe-router-norm-topk-prob``: each token's selected probabilities
    ([T, N], zero where not routed) scaled to sum 1, then by ``--moe-router-topk-scaling-factor``
    (normalised first, as MT-Megatron and upstream's sigmoid path do)."""
    probs = probs / (probs.sum(dim=-1, keepdim=True) + 1e-20)
    return probs * scaling_factor if scaling_factor else probs


def best_expert_group_topk(scores: torch.Tensor, topk: int, num_groups: int,
                           group_topk: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2's device-limited routing (its ``group_limited_greedy``): the ``group_topk``
    groups whose *best* expert scores highest, then the top ``topk`` experts inside them.
    scores: [T, N]; returns (the selected scores, their expert indices), each [T, topk]."""
    tokens, experts = scores.shape
    per_group = experts // num_groups
    best = scores.view(tokens, num_groups, per_group).max(dim=-1).values
    chosen = best.topk(group_topk, dim=-1, sorted=False).indices
    keep = torch.zeros_like(best, dtype=torch.bool).scatter_(1, chosen, True)
    masked = scores.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
    values, indices = torch.topk(masked, k=topk, dim=-1)
    return values, indices


class RoutingConfig:
    """The config of the ``TopKRouter`` now routing, for wrappers of the free functions it calls
    (they are handed tensors, not the config): ``wrap_routing`` is the wrapper of
    ``TopKRouter.routing`` that holds it, ``get()`` reads it (None outside routing)."""

    def __init__(self, name: str):
        self._config = contextvars.ContextVar(name, default=None)

    def wrap_routing(self, wrapped, instance, args, kwargs):
        token = self._config.set(instance.config)
        try:
            return wrapped(*args, **kwargs)
        finally:
            self._config.reset(token)

    def get(self):
        return self._config.get()
