"""MT-Megatron's router flags through megatron-core's own TopKRouter (1 CPU rank), against hand
formulas: --moe-router-norm-topk-prob, MT's unnormalised sigmoid (--moe-router-use-sigmoid
without it), --moe-complementary-seq-aux-loss (the sequence loss counted on the routing that
happened: group-limited routing and the expert bias of --moe-router-topk-limited-devices /
--moe-noaux-gamma), the aliases' group-limited routing itself, and --moe-router-group-score max
(DeepSeek-V2's group_limited_greedy)."""

import json

import pytest

from tests.conftest import run_probe, subprocess_env

pytestmark = pytest.mark.ranks


def test_mt_router_pieces_against_hand_formulas():
    proc = run_probe("tests.features.mt_megatron.probes.router",
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"), timeout=600)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(line[len("RESULT "):])
    # --moe-router-norm-topk-prob: softmax top-k normalised before the scaling factor
    assert out["norm_softmax"] < 1e-6 and out["norm_softmax_sums"] == [2.5, 2.5, 2.5]
    assert all(s < 2.5 for s in out["upstream_softmax_sums"])  # upstream does not normalise
    # MT's --moe-router-use-sigmoid without it: the raw selected sigmoid scores
    assert out["mt_sigmoid"] < 1e-6 and out["mt_sigmoid_map_is_topk"]
    assert out["sigmoid_norm_is_upstream"]
    # the complementary loss is the hand formula on the routed map, not on the plain top-k
    comp, up = out["complementary"], out["upstream"]
    assert abs(comp["tracked"] - comp["on_routed"]) < 1e-6 * max(1.0, comp["on_routed"])
    assert abs(comp["on_routed"] - comp["on_plain_topk"]) > 1e-4  # the test can tell them apart
    assert abs(up["tracked"] - up["on_plain_topk"]) < 1e-6 * max(1.0, up["on_plain_topk"])
    assert comp["groups_per_token"] == 1 and up["groups_per_token"] == 1
    assert comp["grad_norm"] > 0 and comp["grad_norm"] != up["grad_norm"]  # the loss is attached
    # --moe-router-group-score max: transformers' group_limited_greedy, not upstream's rule
    assert out["group_max_map"] and out["group_max_probs"] < 1e-6
    assert out["group_sum_differs"] > 0  # the test can tell the two rules apart
