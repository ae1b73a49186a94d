"""DeepSeek-V2 device-level balancing: hand-computed values, finite-difference gradients, and the
flag checks."""

import types

import pytest
import torch

from megatron_musa_patch.lib import moe_balance as mb

# 4 tokens, 4 experts, top-2. Devices (D=2): E_0 = {0, 1}, E_1 = {2, 3}.
SCORES = torch.tensor([[0.4, 0.3, 0.2, 0.1],
                       [0.1, 0.2, 0.3, 0.4],
                       [0.5, 0.1, 0.3, 0.1],
                       [0.3, 0.2, 0.4, 0.1]], dtype=torch.float64)
# routing (given, not derived): t0->{0,1}, t1->{0,1}, t2->{0,2}, t3->{1,3}
MAP = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.bool)
COUNTS = MAP.sum(0)  # [3, 3, 1, 1]
# f = N/(K T) c = [1.5, 1.5, 0.5, 0.5]; P = column means = [0.325, 0.2, 0.3, 0.175]


@pytest.mark.parametrize("devices, expected", [
    (2, 1.5 * 0.525 + 0.5 * 0.475),   # f' = [1.5, 0.5], P' = [0.525, 0.475]
    (4, 1.5 * 0.325 + 1.5 * 0.2 + 0.5 * 0.3 + 0.5 * 0.175),  # one expert per device: f, P
    (1, 1.0 * 1.0),                    # f' = mean f = 1, P' = 1
])
def test_device_level_loss_by_hand(devices, expected):
    loss = mb.device_level_balance_loss(SCORES, COUNTS, 4, 2, devices, coeff=0.5)
    assert loss.item() == pytest.approx(0.5 * expected, abs=1e-12)


def test_tokens_sent_per_device_by_hand():
    # t0 -> dev0; t1 -> dev0; t2 -> dev0, dev1; t3 -> dev0, dev1
    assert mb.tokens_per_device(MAP, 2).tolist() == [4, 2]
    assert mb.tokens_per_device(MAP, 4).tolist() == [3, 3, 1, 1]


@pytest.mark.parametrize("max_devices, expected", [
    (2, 1.0 * 0.525 + 0.5 * 0.475),  # f'' = D/(M T) [4, 2] = [1.0, 0.5]
    (1, 2.0 * 0.525 + 1.0 * 0.475),  # group-limited to one device per token: f'' = [2, 1]
])
def test_communication_loss_by_hand(max_devices, expected):
    sent = mb.tokens_per_device(MAP, 2)
    loss = mb.communication_balance_loss(SCORES, sent, 4, 2, max_devices, coeff=2.0)
    assert loss.item() == pytest.approx(2.0 * expected, abs=1e-12)


def test_max_devices_per_token():
    assert mb.max_devices_per_token(topk=6, num_devices=8, num_groups=8, group_topk=3) == 3
    assert mb.max_devices_per_token(topk=2, num_devices=8, num_groups=None, group_topk=None) == 2
    assert mb.max_devices_per_token(topk=6, num_devices=4, num_groups=None, group_topk=None) == 4


def test_gradients_match_finite_differences():
    scores = torch.rand(6, 8, dtype=torch.float64, requires_grad=True)
    routing = torch.zeros(6, 8, dtype=torch.bool)
    routing[torch.arange(6)[:, None], torch.randint(0, 8, (6, 2))] = True
    counts = routing.sum(0)
    sent = mb.tokens_per_device(routing, 4)
    assert torch.autograd.gradcheck(
        lambda s: mb.device_level_balance_loss(s, counts, 6, 2, 4, 0.3), (scores,))
    assert torch.autograd.gradcheck(
        lambda s: mb.communication_balance_loss(s, sent, 6, 4, 2, 0.7), (scores,))


def test_device_level_capacity_keeps_the_best_per_device():
    probs = SCORES * MAP
    # expert capacity ceil(4*2/4*0.5) = 1, so each device takes 2 assignments
    kept_probs, kept = mb.drop_over_device_capacity(probs, MAP, topk=2, num_devices=2,
                                                    capacity_factor=0.5)
    # device 0 candidates: t0e0 .4, t0e1 .3, t1e0 .1, t1e1 .2, t2e0 .5, t3e1 .2 -> t2e0, t0e0
    # device 1 candidates: t2e2 .3, t3e3 .1 -> both
    expected = torch.zeros(4, 4, dtype=torch.bool)
    expected[2, 0] = expected[0, 0] = expected[2, 2] = expected[3, 3] = True
    assert torch.equal(kept, expected)
    assert torch.equal(kept_probs, probs * expected)
    # per expert (upstream) would have kept one token for expert 1; per device it gives its
    # share to expert 0's two best tokens
    assert kept[:, 1].sum() == 0 and kept[:, 0].sum() == 2


def test_device_level_capacity_by_position_keeps_earliest_tokens():
    probs = SCORES * MAP
    _, kept = mb.drop_over_device_capacity(probs, MAP, topk=2, num_devices=2,
                                           capacity_factor=0.5, by="position")
    assert kept[0, 0] and kept[0, 1] and kept[:, :2].sum() == 2


def test_capacity_at_or_above_load_drops_nothing():
    probs = SCORES * MAP
    kept_probs, kept = mb.drop_over_device_capacity(probs, MAP, topk=2, num_devices=2,
                                                    capacity_factor=2.0)
    assert torch.equal(kept, MAP) and torch.equal(kept_probs, probs)


# ----------------------------------------------------------------------------- flag checks


def _args(**over):
    base = dict(moe_device_level_aux_loss_coeff=0.0, moe_comm_aux_loss_coeff=0.0,
                moe_device_level_capacity=False, num_experts=8, expert_model_parallel_size=2,
                moe_router_load_balancing_type="aux_loss", moe_router_num_groups=None,
                moe_expert_capacity_factor=None, moe_pad_expert_input_to_capacity=False)
    base.update(over)
    return types.SimpleNamespace(**base)


@pytest.fixture
def feature():
    from megatron_musa_patch.features.moe_mla_mtp import moe_device_balance

    return moe_device_balance


@pytest.mark.parametrize("over, message", [
    (dict(moe_device_level_capacity=True), "add --moe-expert-capacity-factor"),
    (dict(moe_device_level_capacity=True, moe_expert_capacity_factor=1.0,
          moe_pad_expert_input_to_capacity=True), "--moe-pad-expert-input-to-capacity"),
    (dict(moe_comm_aux_loss_coeff=0.1, moe_router_num_groups=4),
     "--moe-router-num-groups 4 differs from --expert-model-parallel-size 2"),
    (dict(moe_device_level_aux_loss_coeff=0.1, num_experts=None), "add --num-experts"),
    (dict(moe_device_level_aux_loss_coeff=0.1, moe_router_load_balancing_type="sinkhorn"),
     "sinkhorn"),
    (dict(moe_device_level_aux_loss_coeff=0.1, num_experts=6, expert_model_parallel_size=4),
     "not divisible"),
])
def test_bad_combinations_name_the_flags(feature, over, message):
    from megatron_musa_patch.base.errors import ArgumentError

    with pytest.raises(ArgumentError, match=message.replace("-", r"\-")):
        feature.mmp_validate_args(args=_args(**over))


def test_good_combination_passes_and_reaches_the_config(feature):
    args = _args(moe_device_level_aux_loss_coeff=0.05, moe_comm_aux_loss_coeff=0.02,
                 moe_device_level_capacity=True, moe_expert_capacity_factor=1.0,
                 moe_router_num_groups=2)
    feature.mmp_validate_args(args=args)
    from tests.harness.sessions import make_session

    session = make_session(feature)
    config = types.SimpleNamespace()
    feature.mmp_transformer_config(args=args, config=config, session=session)
    assert (config.moe_device_level_aux_loss_coeff, config.moe_comm_aux_loss_coeff,
            config.moe_device_level_capacity) == (0.05, 0.02, True)
    # per run: the session holds the names the MoE log must reduce, nothing outlives it
    assert feature._tracked(session) == [feature.DEVICE_LOSS, feature.COMM_LOSS]
    assert feature._tracked(make_session(feature)) == []
