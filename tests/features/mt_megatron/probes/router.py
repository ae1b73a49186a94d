"""MT-Megatron's router flags through megatron-core's own TopKRouter on one CPU rank, each
measured against a hand formula; prints one ``RESULT {json}`` line.

Run by tests/features/mt_megatron/test_router.py."""

import json

import megatron_musa_patch  # activates the layer: before megatron is imported
import torch

from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.transformer_config import TransformerConfig

from tests.features.recompute import recompute_layer as rl

S, B, E, K = 6, 2, 8, 2


def router(**kw):
    mt = {k: kw.pop(k) for k in ("moe_router_norm_topk_prob", "moe_complementary_seq_aux_loss")
          if k in kw}
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                               num_moe_experts=E, moe_router_topk=K, use_cpu_initialization=True,
                               moe_router_dtype="fp32", **kw)
    for k, v in mt.items():
        setattr(config, k, v)  # what the plugins' mmp_transformer_config sets
    r = TopKRouter(config, pg_collection=ProcessGroupCollection.use_mpu_process_groups())
    r.set_layer_number(1)
    return r.train()


def norm_topk_prob(logits, flat, out):
    """--moe-router-norm-topk-prob with softmax top-k (pre-softmax): normalised, then scaled."""
    r = router(moe_router_pre_softmax=True, moe_router_topk_scaling_factor=2.5,
               moe_router_norm_topk_prob=True)
    probs, rmap = r.routing(logits)
    soft = torch.softmax(flat, dim=-1)
    top = soft.topk(K, dim=1)
    want = torch.zeros_like(soft).scatter(
        1, top.indices, top.values / top.values.sum(1, keepdim=True) * 2.5)
    out["norm_softmax"] = float((probs.detach() - want).abs().max())
    out["norm_softmax_sums"] = [round(float(x), 5) for x in probs.detach().sum(1)[:3]]
    plain, _ = router(moe_router_pre_softmax=True,
                      moe_router_topk_scaling_factor=2.5).routing(logits)
    out["upstream_softmax_sums"] = [round(float(x), 5) for x in plain.detach().sum(1)[:3]]


def mt_sigmoid(logits, flat, out):
    """MT's sigmoid routing without the flag: the selected sigmoid scores, not normalised; with
    the flag (or upstream's spelling): megatron-core's normalised sigmoid, unchanged."""
    r = router(moe_router_score_function="sigmoid", moe_router_pre_softmax=True,
               moe_router_topk_scaling_factor=2.5, moe_router_norm_topk_prob=False)
    probs, rmap = r.routing(logits)
    sig = torch.sigmoid(flat)
    want = torch.where(rmap, sig * 2.5, torch.zeros_like(sig))
    out["mt_sigmoid"] = float((probs.detach() - want).abs().max())
    out["mt_sigmoid_map_is_topk"] = bool(torch.equal(
        rmap, torch.zeros_like(rmap).scatter(1, sig.topk(K, dim=1).indices, True)))
    normed, _ = router(moe_router_score_function="sigmoid", moe_router_topk_scaling_factor=2.5,
                       moe_router_norm_topk_prob=True).routing(logits)
    upstream, _ = router(moe_router_score_function="sigmoid",
                         moe_router_topk_scaling_factor=2.5).routing(logits)
    out["sigmoid_norm_is_upstream"] = bool(torch.equal(normed, upstream))


def seq_loss(routed, scores, coeff):
    """DeepSeek-V3 eq. 17-20 with loops: coeff * mean_b sum_i f_bi P_bi."""
    total = 0.0
    for b in range(B):
        rows = [t * B + b for t in range(S)]
        for i in range(E):
            f = E / (K * S) * sum(float(routed[j, i]) for j in rows)
            p = sum(float(scores[j, i]) for j in rows) / S
            total += f * p
    return coeff * total / B


def tracked_seq_loss():
    tracker = moe_utils.get_moe_layer_wise_logging_tracker()
    value = float(tracker["seq_load_balancing_loss"]["values"][0])
    moe_utils.clear_aux_losses_tracker()
    return value


def complementary_seq_aux_loss(logits, flat, out):
    """--moe-complementary-seq-aux-loss with group-limited routing (--moe-router-topk-limited-
    devices 1, --moe-router-num-node-group 4) and the expert bias of --moe-noaux-gamma (a bias
    that moves the routing away from the plain top-k)."""
    common = dict(moe_router_score_function="sigmoid", moe_router_num_groups=4,
                  moe_router_group_topk=1, moe_router_enable_expert_bias=True,
                  moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff=3e-3)
    scores = torch.sigmoid(flat)
    scores = scores / (scores.sum(-1, keepdim=True) + 1e-20)
    plain_map = torch.zeros(S * B, E, dtype=torch.bool).scatter(
        1, scores.topk(K, dim=1).indices, True)
    for name, flag in (("complementary", True), ("upstream", False)):
        r = router(moe_complementary_seq_aux_loss=flag, **common)
        r.expert_bias.copy_(torch.tensor([0.0, 0.3, 0.0, -0.2, 0.1, 0.0, 0.4, 0.0]))
        moe_utils.clear_aux_losses_tracker()
        probs, rmap = r.routing(logits)
        got = tracked_seq_loss()  # the tracker holds loss / coeff
        out[name] = {"tracked": got, "on_routed": seq_loss(rmap, scores, 1.0),
                     "on_plain_topk": seq_loss(plain_map, scores, 1.0)}
        # the group limit: each token's experts in one group of 2
        out[name]["groups_per_token"] = int(rmap.reshape(-1, 4, 2).any(-1).sum(-1).max())
        probs.sum().backward()  # the loss is attached: gradients reach the logits
        out[name]["grad_norm"] = float(logits.grad.norm())
        logits.grad = None


def group_score_max(logits, flat, out):
    """--moe-router-group-score max (DeepSeek-V2's group_limited_greedy, as transformers
    computes it): the group of each token's best expert kept, then the top k inside it;
    upstream's rule (the sum of a group's top k/group-topk = both its experts) keeps other
    groups for some tokens."""
    grouped = dict(moe_router_pre_softmax=True, moe_router_num_groups=4, moe_router_group_topk=1)
    r = router(**grouped)
    r.config.moe_router_group_score = "max"
    probs, rmap = r.routing(logits)
    soft = torch.softmax(flat, dim=-1)
    best = soft.view(-1, 4, 2).max(dim=-1).values
    keep = torch.zeros_like(best).scatter(1, best.topk(1, dim=-1).indices, 1).bool()
    tmp = soft.masked_fill(~keep.unsqueeze(-1).expand(-1, 4, 2).reshape(-1, E), 0.0)
    top = tmp.topk(K, dim=-1)
    want_map = torch.zeros_like(rmap).scatter(1, top.indices, True)
    out["group_max_map"] = bool(torch.equal(rmap, want_map))
    out["group_max_probs"] = float((probs.detach() - torch.zeros_like(soft).scatter(
        1, top.indices, top.values)).abs().max())
    _, upstream_map = router(**grouped).routing(logits)
    out["group_sum_differs"] = int((upstream_map != want_map).any(-1).sum())


def main():
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    rl.init_single_rank()
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(S, B, E, generator=gen).requires_grad_()
    flat = logits.detach().reshape(-1, E)
    out = {}
    for check in (norm_topk_prob, mt_sigmoid, complementary_seq_aux_loss, group_score_max):
        check(logits, flat, out)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
