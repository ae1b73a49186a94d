"""MT-Megatron's flags and switches (issue 19): each flag's meaning, its refusal when its feature is
switched off, and its misuse (docs/bad_inputs.md). No Megatron import: argument namespaces with
upstream's defaults, the plugins' hooks called directly. The routing math is checked against
megatron-core's router in tests/features/mt_megatron/test_router.py."""

import argparse
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from megatron_musa_patch.lib import moe_balance
from megatron_musa_patch.base.errors import ArgumentError, FeatureUnavailableError
from megatron_musa_patch.features import megatron_args, recompute
from megatron_musa_patch.features.device import te_absent
from megatron_musa_patch.features.moe_mla_mtp.moe_device_balance import (complementary_seq_aux_loss as moe_balance_complementary,
                                                             group_score as moe_balance_group_score,
                                                             topk_prob_norm as moe_balance_topk_norm)
from megatron_musa_patch.features.recompute import (mla_rms as recompute_mla_rms,
                                                    mlp_rms as recompute_mlp_rms)
from megatron_musa_patch.features.mt_megatron import (env_switches, router_flags,
                                                      tp_only_amax_red, virtual_pipeline,
                                                      wait_after_ckpt)
from megatron_musa_patch.core.settings import Settings

from tests.harness.sessions import make_session

PLUGINS = (recompute, recompute_mla_rms, recompute_mlp_rms, moe_balance_complementary,
           moe_balance_topk_norm, moe_balance_group_score, router_flags, wait_after_ckpt, tp_only_amax_red,
           virtual_pipeline, env_switches, te_absent)


def margs(**kw):
    """Megatron-LM's args for a MoE model, upstream defaults where the tests do not care."""
    base = dict(num_experts=8, expert_model_parallel_size=2, moe_router_pre_softmax=False,
                moe_router_score_function="softmax", moe_router_num_groups=None,
                moe_router_group_topk=None, moe_router_enable_expert_bias=False,
                moe_router_bias_update_rate=1e-3, moe_router_load_balancing_type="aux_loss",
                moe_device_level_aux_loss_coeff=0.0, moe_comm_aux_loss_coeff=0.0,
                moe_router_use_sigmoid=False, moe_router_norm_topk_prob=False,
                moe_router_topk_limited_devices=None, moe_router_num_node_group=None,
                moe_noaux_gamma=None, moe_router_fusion=False, fp8=None, fp4=None,
                tp_only_amax_red=False, wait_after_ckpt=0.0, transformer_impl="local",
                tp_comm_overlap=False, moe_complementary_seq_aux_loss=False)
    base.update(kw)
    return SimpleNamespace(**base)


def route(**kw):
    args = margs(**kw)
    router_flags.mmp_validate_args(args=args, session=make_session(*PLUGINS))
    return args


# ----------------------------------------------------------------------------- router aliases


def test_sigmoid_spelling_is_upstreams_score_function():
    args = route(moe_router_use_sigmoid=True, moe_router_pre_softmax=True,
                 moe_router_norm_topk_prob=True)
    assert args.moe_router_score_function == "sigmoid"
    assert route(moe_router_use_sigmoid=True, moe_router_pre_softmax=True,
                 moe_router_score_function="sigmoid").moe_router_score_function == "sigmoid"
    # MT applies it only with --moe-router-pre-softmax
    with pytest.raises(ArgumentError, match="only together with --moe-router-pre-softmax"):
        route(moe_router_use_sigmoid=True)


def test_device_limited_routing_is_upstreams_group_limited_routing():
    args = route(moe_router_topk_limited_devices=2, expert_model_parallel_size=4)
    assert (args.moe_router_group_topk, args.moe_router_num_groups) == (2, 4)  # groups = EP
    # consumed: megatron-core's deprecated config field of that name must not be set beside
    assert args.moe_router_topk_limited_devices is None
    args = route(moe_router_topk_limited_devices=2, moe_router_num_node_group=4,
                 expert_model_parallel_size=1)
    assert (args.moe_router_group_topk, args.moe_router_num_groups) == (2, 4)  # node groups
    assert route(moe_router_num_node_group=4).moe_router_num_groups == 4
    with pytest.raises(ArgumentError, match=r"--moe-router-topk-limited-devices 3 is more than "
                                            r"the 2 expert groups"):
        route(moe_router_topk_limited_devices=3)


def test_noaux_gamma_is_upstreams_expert_bias():
    args = route(moe_noaux_gamma=2e-3, moe_router_use_sigmoid=True, moe_router_pre_softmax=True,
                 moe_router_norm_topk_prob=True)
    assert args.moe_router_enable_expert_bias and args.moe_router_bias_update_rate == 2e-3
    with pytest.raises(ArgumentError, match="with sigmoid routing scores only"):
        route(moe_noaux_gamma=1e-3)


@pytest.mark.parametrize("mt, upstream, names", [
    (dict(moe_router_topk_limited_devices=2), dict(moe_router_group_topk=1),
     ("--moe-router-topk-limited-devices 2", "--moe-router-group-topk 1")),
    (dict(moe_router_num_node_group=4), dict(moe_router_num_groups=2),
     ("--moe-router-num-node-group 4", "--moe-router-num-groups 2")),
    (dict(moe_router_topk_limited_devices=1), dict(moe_router_num_groups=4),
     ("--moe-router-topk-limited-devices (groups = --expert-model-parallel-size) 2",
      "--moe-router-num-groups 4")),
    (dict(moe_noaux_gamma=2e-3, moe_router_score_function="sigmoid"),
     dict(moe_router_bias_update_rate=5e-3),
     ("--moe-noaux-gamma 0.002", "--moe-router-bias-update-rate 0.005")),
])
def test_both_spellings_with_different_values_name_both(mt, upstream, names):
    with pytest.raises(ArgumentError) as caught:
        route(**mt, **upstream)
    text = str(caught.value)
    assert all(n in text for n in names) and "keep one of them" in text, text
    route(**mt, **{k: v for k, v in _agreeing(mt, upstream).items()})  # the same value is fine


def _agreeing(mt, upstream):
    same = {"moe_router_group_topk": mt.get("moe_router_topk_limited_devices"),
            "moe_router_num_groups": mt.get("moe_router_num_node_group") or 2,
            "moe_router_bias_update_rate": mt.get("moe_noaux_gamma")}
    return {k: same[k] for k in upstream}


def test_router_flags_without_experts_or_with_nonsense_values():
    with pytest.raises(ArgumentError, match="configure the MoE router: add --num-experts"):
        route(num_experts=None, moe_router_topk_limited_devices=2)
    with pytest.raises(ArgumentError, match="--moe-router-topk-limited-devices 0: give at least"):
        route(moe_router_topk_limited_devices=0)
    with pytest.raises(ArgumentError, match="must be > 0"):
        route(moe_noaux_gamma=-1.0, moe_router_score_function="sigmoid")
    with pytest.raises(ArgumentError, match="--moe-router-score-function sqrtsoftplus"):
        route(moe_router_use_sigmoid=True, moe_router_pre_softmax=True,
              moe_router_score_function="sqrtsoftplus")


def test_unnormalised_sigmoid_needs_the_topk_norm_plugin():
    session = make_session(*PLUGINS, disable=("moe_mla_mtp.moe_device_balance.topk_prob_norm",))
    args = margs(moe_router_use_sigmoid=True, moe_router_pre_softmax=True)
    with pytest.raises(FeatureUnavailableError, match="--moe-router-use-sigmoid needs the "
                                                      "feature 'moe_mla_mtp.moe_device_balance.topk_prob_norm'"):
        router_flags.mmp_validate_args(args=args, session=session)
    args.moe_router_norm_topk_prob = True  # normalised: upstream's own sigmoid routing
    router_flags.mmp_validate_args(args=args, session=session)


# ----------------------------------------------------------------------------- top-k norm, loss


def test_topk_prob_norm_mode_and_formula():
    assert moe_balance_topk_norm.mode(margs(moe_router_norm_topk_prob=True)) is True
    assert moe_balance_topk_norm.mode(margs(moe_router_use_sigmoid=True)) is False
    assert moe_balance_topk_norm.mode(margs()) is None
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.1], [0.2, 0.0, 0.2, 0.0]])
    got = moe_balance.normalise_topk(probs, 2.5)
    want = torch.tensor([[0.0, 0.75, 0.0, 0.25], [0.5, 0.0, 0.5, 0.0]]) * 2.5
    torch.testing.assert_close(got, want)
    with pytest.raises(ArgumentError, match="--moe-router-fusion"):
        moe_balance_topk_norm.mmp_validate_args(args=margs(moe_router_norm_topk_prob=True,
                                                           moe_router_fusion=True))


def test_group_score_max_is_the_best_expert_rule_and_its_misuse_is_refused():
    scores = torch.tensor([[0.30, 0.00, 0.20, 0.20, 0.10, 0.20],   # groups of 2: best 0.3 | 0.2
                           [0.05, 0.05, 0.40, 0.00, 0.25, 0.25]])  # sum 0.4 | 0.5 (group 3)
    values, indices = moe_balance.best_expert_group_topk(scores, topk=2, num_groups=3,
                                                         group_topk=1)
    assert indices.tolist() == [[0, 1], [2, 3]]  # upstream's top-2 sum keeps groups 2 and 3
    torch.testing.assert_close(values, torch.tensor([[0.30, 0.00], [0.40, 0.00]]))
    plain = margs(moe_router_group_score="max")
    with pytest.raises(ArgumentError, match="add --num-experts, --moe-router-num-groups and "
                                            "--moe-router-group-topk"):
        moe_balance_group_score.mmp_validate_args(args=plain)
    grouped = dict(moe_router_group_score="max", moe_router_num_groups=4,
                   moe_router_group_topk=2)
    moe_balance_group_score.mmp_validate_args(args=margs(**grouped))  # fine
    with pytest.raises(ArgumentError, match="--moe-router-fusion"):
        moe_balance_group_score.mmp_validate_args(args=margs(**grouped, moe_router_fusion=True))
    moe_balance_group_score.mmp_validate_args(args=margs(moe_router_group_score="topk-sum"))


def hand_sequence_loss(scores, routed, seq, bsz, topk, coeff):
    """DeepSeek-V3 eq. 17-20 written out with loops: alpha * mean_b sum_i f_bi * P_bi."""
    experts = scores.shape[-1]
    total = 0.0
    for b in range(bsz):
        for i in range(experts):
            rows = [t * bsz + b for t in range(seq)]  # Megatron's [s, b] token order
            f = experts / (topk * seq) * sum(float(routed[r, i]) for r in rows)
            p = sum(float(scores[r, i]) for r in rows) / seq
            total += f * p
    return coeff * total / bsz


def test_complementary_sequence_loss_is_deepseek_v3s_formula():
    gen = torch.Generator().manual_seed(3)
    seq, bsz, experts, topk = 7, 3, 6, 2
    scores = torch.softmax(torch.randn(seq * bsz, experts, generator=gen), dim=-1)
    # a routed map that is not the plain top-k of the scores (group limits, bias, drops)
    routed = torch.zeros(seq * bsz, experts, dtype=torch.bool)
    picks = torch.randint(0, experts, (seq * bsz, topk), generator=gen)
    routed.scatter_(1, picks, True)
    counts = routed.reshape(seq, bsz, experts).sum(0)
    got = moe_balance.sequence_balance_loss(scores, counts, seq, bsz, topk, 3e-3)
    assert abs(float(got) - hand_sequence_loss(scores, routed, seq, bsz, topk, 3e-3)) < 1e-9
    # and it is not the loss of the plain top-k map (what upstream's seq_aux_loss counts)
    plain = torch.zeros_like(routed).scatter_(1, scores.topk(topk, dim=1).indices, True)
    assert abs(float(got) - hand_sequence_loss(scores, plain, seq, bsz, topk, 3e-3)) > 1e-6


@pytest.mark.parametrize("kw, match", [
    (dict(moe_router_load_balancing_type=["aux_loss"]),
     "add --moe-router-load-balancing-type seq_aux_loss"),
    (dict(moe_device_level_aux_loss_coeff=0.05), "drop --moe-device-level-aux-loss-coeff"),
    (dict(num_experts=None), "add --num-experts"),
])
def test_complementary_loss_misuse(kw, match):
    args = margs(**{"moe_complementary_seq_aux_loss": True,
                    "moe_router_load_balancing_type": ["seq_aux_loss"], **kw})
    with pytest.raises(ArgumentError, match=match):
        moe_balance_complementary.mmp_validate_args(args=args)
    moe_balance_complementary.mmp_validate_args(args=margs(
        moe_complementary_seq_aux_loss=True, moe_router_load_balancing_type=["seq_aux_loss"]))


# ----------------------------------------------------------------------------- other flags


def test_wait_after_ckpt_waits_after_each_save(capsys):
    waited, saved = [], []
    after = wait_after_ckpt.after_save
    def save_checkpoint(iteration, model, optimizer=None):  # upstream's leading parameters
        saved.append(iteration)
        return "done"

    for seconds in (0.0, 2.5):
        result = after(waited.append, save_checkpoint, None, (7, "model"), {},
                       get_args=lambda: SimpleNamespace(wait_after_ckpt=seconds))
        assert result == "done"
    assert saved == [7, 7] and waited == [2.5]  # 0: no wait
    assert "waited 2.5 s after saving the checkpoint of iteration 7" in capsys.readouterr().out
    with pytest.raises(ArgumentError, match="--wait-after-ckpt -1: give the seconds"):
        wait_after_ckpt.mmp_validate_args(args=margs(wait_after_ckpt=-1.0))


def test_wait_after_ckpt_reads_the_args_save_checkpoint_reads(monkeypatch):
    # upstream's checkpointing tests patch megatron.training.checkpointing.get_args with a mock;
    # the global args are then unset
    waited = []
    module = types.ModuleType(wait_after_ckpt.CHECKPOINTING)
    module.get_args = lambda: SimpleNamespace(wait_after_ckpt=1.5)
    monkeypatch.setitem(sys.modules, wait_after_ckpt.CHECKPOINTING, module)
    assert wait_after_ckpt.after_save(waited.append, lambda iteration: None, None, (3,), {}) \
        is None
    assert waited == [1.5]
    monkeypatch.setattr(module, "get_args", lambda: SimpleNamespace())  # a mock without the flag
    wait_after_ckpt.after_save(waited.append, lambda iteration: None, None, (3,), {})
    assert waited == [1.5]


def test_tp_only_amax_red_needs_fp8():
    with pytest.raises(ArgumentError, match="trains without FP8 .* Remove --tp-only-amax-red"):
        tp_only_amax_red.mmp_validate_args(args=margs(tp_only_amax_red=True))
    args = margs(tp_only_amax_red=True, fp8="hybrid")
    tp_only_amax_red.mmp_validate_args(args=args)
    config = SimpleNamespace(tp_only_amax_red=False)
    tp_only_amax_red.mmp_transformer_config(args=args, config=config)
    assert config.tp_only_amax_red is True


def test_transformer_engine_impl_without_te_is_one_paragraph(monkeypatch, capsys):
    monkeypatch.setattr(te_absent, "te_installed", lambda: False)
    session = make_session(*PLUGINS)
    with pytest.raises(ArgumentError) as caught:
        te_absent.mmp_validate_args(args=margs(transformer_impl="transformer_engine"),
                                    session=session, device=session.device)
    text = str(caught.value)
    assert "--transformer-impl transformer_engine (upstream's default" in text
    assert "Add --transformer-impl local" in text and "on cpu" in text
    args = margs(tp_comm_overlap=True)
    te_absent.mmp_validate_args(args=args, session=session, device=session.device)
    assert args.tp_comm_overlap is False  # dropped (upstream would stop in initialize)
    assert "--tp-comm-overlap overlaps tensor-parallel" in capsys.readouterr().err
    monkeypatch.setattr(te_absent, "te_installed", lambda: True)  # with TE: upstream's business
    te_absent.mmp_validate_args(args=margs(transformer_impl="transformer_engine"),
                                session=session, device=session.device)


def test_mt_environment_switches_are_honoured_or_named_once(capsys):
    env = (("ENABLE_ZERO_BUBBLE", "1"), ("USE_EPX", "0"), ("USE_RECOMPUTE_VARIANCE", "1"),
           ("ENABLE_PROFILER", "1"), ("ACCELERATOR_BACKEND", "musa"), ("USE_MUSA_MOE", "1"))
    session = make_session(*PLUGINS, settings=Settings(mt_env=env))
    found = {v.name: v for v in env_switches.verdicts(session.settings, margs(), "cpu")}
    assert set(found) == {name for name, _ in env}
    assert not found["ENABLE_PROFILER"].honoured and found["USE_EPX"].honoured  # 0 = off
    assert found["ENABLE_ZERO_BUBBLE"].honoured
    assert "--enable-zero-bubble" in found["ENABLE_ZERO_BUBBLE"].text
    assert found["USE_RECOMPUTE_VARIANCE"].honoured and found["USE_MUSA_MOE"].honoured
    assert "--use-pytorch-profiler" in found["ENABLE_PROFILER"].text
    assert "MEGATRON_MUSA_PATCH_DEVICE=musa to insist" in found["ACCELERATOR_BACKEND"].text
    for _ in range(2):  # one warning, however often arguments are validated
        env_switches.mmp_validate_args(args=margs(), session=session, device=session.device)
    err = capsys.readouterr().err
    assert err.count("megatron_musa_patch: warning: MT-Megatron environment switches") == 1
    assert "ENABLE_PROFILER=1" in err
    assert "USE_EPX" not in err and "USE_MUSA_MOE" not in err  # honoured ones are not named
    assert "ENABLE_ZERO_BUBBLE" not in err
    # USE_RECOMPUTE_VARIANCE=0 with the flags: MT would ignore them, here they apply
    off = env_switches.verdicts(Settings(mt_env=(("USE_RECOMPUTE_VARIANCE", "0"),)),
                                margs(attn_recompute=True), "cpu")
    assert not off[0].honoured and "applies them" in off[0].text
    quiet = make_session(*PLUGINS, settings=Settings(mt_env=env,
                                                     disable=("mt_megatron.env_switches",)))
    env_switches.mmp_validate_args(args=margs(), session=quiet, device=quiet.device)
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- RMSNorm recompute


def rms(**kw):
    base = dict(attn_recompute=False, mlp_recompute=False, recompute_variance=False,
                q_rms_recompute=False, mla_rms_recompute=False, mlp_rms_recompute=False,
                recompute_granularity=None, recompute_modules=None, recompute_activations=False,
                fp8=None, fp4=None, cuda_graph_impl="none", transformer_impl="local",
                num_experts=8, moe_grouped_gemm=False, multi_latent_attention=True,
                qk_layernorm=True)
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.mark.parametrize("plugin, kw, match", [
    (recompute_mla_rms, dict(q_rms_recompute=True, multi_latent_attention=False),
     "add --multi-latent-attention, or drop --q-rms-recompute"),
    (recompute_mla_rms, dict(q_rms_recompute=True, qk_layernorm=False), "add --qk-layernorm"),
    (recompute_mla_rms, dict(q_rms_recompute=True, recompute_granularity="selective",
                             recompute_modules=["mla_up_proj"]),
     "--recompute-modules mla_up_proj .* twice"),
    (recompute_mla_rms, dict(mla_rms_recompute=True), "Add --attn-recompute"),
    (recompute_mlp_rms, dict(mlp_rms_recompute=True, num_experts=None),
     "this model has no MoE layers. Add --mlp-recompute"),
    (recompute_mlp_rms, dict(mlp_rms_recompute=True, recompute_granularity="selective",
                             recompute_modules=["shared_experts"]), "twice"),
    (recompute_mlp_rms, dict(mlp_rms_recompute=True, fp8="hybrid"), "fp8"),
])
def test_rms_recompute_misuse(plugin, kw, match):
    with pytest.raises(ArgumentError, match=match):
        plugin.mmp_validate_args(args=rms(**kw))


def test_rms_recompute_flags_reach_the_config_and_mt_combinations_pass():
    mt_236b = rms(attn_recompute=True, mlp_recompute=True, recompute_variance=True,
                  mla_rms_recompute=True, mlp_rms_recompute=True, q_rms_recompute=True,
                  recompute_granularity="full", recompute_method="block", recompute_num_layers=0)
    for plugin in (recompute, recompute_mla_rms, recompute_mlp_rms):
        plugin.mmp_validate_args(args=mt_236b)
    config = SimpleNamespace()
    recompute_mla_rms.mmp_transformer_config(args=mt_236b, config=config)
    recompute_mlp_rms.mmp_transformer_config(args=mt_236b, config=config)
    assert (config.q_rms_recompute, config.mla_rms_recompute, config.mlp_rms_recompute) == \
        (True, True, True)
    recompute_mlp_rms.mmp_validate_args(args=rms(mlp_rms_recompute=True))  # MoE alone: fine


# ----------------------------------------------------------------------------- switched off


FLAG_CASES = [
    ("recompute.mla_rms", ["--q-rms-recompute"], "--q-rms-recompute"),
    ("recompute.mla_rms", ["--mla-rms-recompute"], "--mla-rms-recompute"),
    ("recompute.mlp_rms", ["--mlp-rms-recompute"], "--mlp-rms-recompute"),
    ("recompute", ["--mlp-rms-recompute"], "--mlp-rms-recompute"),  # the group name
    ("moe_mla_mtp.moe_device_balance.complementary_seq_aux_loss", ["--moe-complementary-seq-aux-loss"],
     "--moe-complementary-seq-aux-loss"),
    ("moe_mla_mtp.moe_device_balance.topk_prob_norm", ["--moe-router-norm-topk-prob"],
     "--moe-router-norm-topk-prob"),
    ("moe_mla_mtp.moe_device_balance.group_score", ["--moe-router-group-score", "max"],
     "--moe-router-group-score"),
    ("mt_megatron.router_flags", ["--moe-router-use-sigmoid"], "--moe-router-use-sigmoid"),
    ("mt_megatron.router_flags", ["--moe-router-topk-limited-devices", "2"],
     "--moe-router-topk-limited-devices"),
    ("mt_megatron.router_flags", ["--moe-router-num-node-group", "4"],
     "--moe-router-num-node-group"),
    ("mt_megatron", ["--moe-noaux-gamma", "1e-3"], "--moe-noaux-gamma"),
    ("mt_megatron.wait_after_ckpt", ["--wait-after-ckpt", "5"], "--wait-after-ckpt"),
    ("mt_megatron.tp_only_amax_red", ["--tp-only-amax-red"], "--tp-only-amax-red"),
]


def test_uneven_virtual_stages_need_their_feature():
    session = make_session(*PLUGINS, disable=("mt_megatron.virtual_pipeline",))
    with pytest.raises(FeatureUnavailableError, match="--num-layers-per-virtual-pipeline-stage "
                                                      "needs the feature 'mt_megatron.virtual_"
                                                      "pipeline' .with --decoder-first/last"):
        megatron_args.check_flag_needs(session, pipeline())
    megatron_args.check_flag_needs(session, pipeline(decoder_first_pipeline_num_layers=None,
                                                     decoder_last_pipeline_num_layers=None))


@pytest.mark.parametrize("feature, argv, flag", FLAG_CASES)
def test_each_new_flag_is_refused_when_its_feature_is_switched_off(feature, argv, flag):
    session = make_session(*PLUGINS, disable=(feature,))
    parser = argparse.ArgumentParser()
    megatron_args.add_plugin_arguments(session, parser)
    with pytest.raises(FeatureUnavailableError) as caught:
        megatron_args.check_flag_needs(session, parser.parse_args(argv))
    text = str(caught.value)
    assert text.startswith(f"{flag} needs the feature '") and "switched off by " \
        f"MEGATRON_MUSA_PATCH_DISABLE={feature}" in text, text
    # on, the same flag passes the check
    on = make_session(*PLUGINS)
    parser = argparse.ArgumentParser()
    megatron_args.add_plugin_arguments(on, parser)
    megatron_args.check_flag_needs(on, parser.parse_args(argv))


def test_doctor_names_the_mt_switches_and_what_the_overlapped_shared_expert_gets():
    from tests.conftest import run_python, subprocess_env

    proc = run_python("import sys; from megatron_musa_patch.cli.main import main; "
                      "sys.exit(main(['doctor']))",
                      env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu",
                                         ENABLE_PROFILER="1", ENABLE_ZERO_BUBBLE="1",
                                         USE_RECOMPUTE_VARIANCE="1"))
    out = proc.stdout
    assert "MT-Megatron switch   NOT honoured: ENABLE_PROFILER=1: asks for MT's torch.profiler" \
        in out, out[-3000:] + proc.stderr[-2000:]
    assert "MT-Megatron switch   honoured: ENABLE_ZERO_BUBBLE=1: sets --enable-zero-bubble" in out
    assert "MT-Megatron switch   honoured: USE_RECOMPUTE_VARIANCE=1" in out
    row = next(l for l in out.splitlines() if "recompute.overlapped_shared_expert_fc2" in l)
    assert "--moe-shared-expert-overlap" in row and "released and recomputed" in row



def pipeline(**kw):
    base = dict(num_layers=8, pipeline_model_parallel_size=2,
                num_layers_per_virtual_pipeline_stage=2, num_virtual_stages_per_pipeline_rank=None,
                pipeline_model_parallel_layout=None, decoder_first_pipeline_num_layers=4,
                decoder_last_pipeline_num_layers=4, overlap_p2p_comm=True)
    base.update(kw)
    return SimpleNamespace(**base)


def test_layers_per_virtual_stage_with_an_uneven_pipeline_become_stages_per_rank():
    args = pipeline()
    virtual_pipeline.mmp_validate_args(args=args)
    assert (args.num_virtual_stages_per_pipeline_rank,
            args.num_layers_per_virtual_pipeline_stage) == (2, None)
    args = pipeline(num_layers=12, pipeline_model_parallel_size=4,
                    decoder_first_pipeline_num_layers=2, decoder_last_pipeline_num_layers=None)
    virtual_pipeline.mmp_validate_args(args=args)  # 10 layers over 3 stages: upstream says so
    assert args.num_layers_per_virtual_pipeline_stage == 2
    assert virtual_pipeline.stage_layers(12, 4, 2, None) is None
    assert virtual_pipeline.stage_layers(12, 4, 3, None) == [3, 3, 3, 3]
    assert virtual_pipeline.stage_layers(12, 4, None, 6) == [2, 2, 2, 6]
    even = pipeline(decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None)
    virtual_pipeline.mmp_validate_args(args=even)  # even pipelines: upstream's own handling
    assert even.num_layers_per_virtual_pipeline_stage == 2


@pytest.mark.parametrize("kw, match", [
    (dict(decoder_first_pipeline_num_layers=2, decoder_last_pipeline_num_layers=6),
     r"stages of \[2, 6\] layers"),
    (dict(overlap_p2p_comm=False), "needs --pipeline-model-parallel-size 3 or more"),
])
def test_uneven_virtual_stages_that_cannot_work_are_one_paragraph(kw, match):
    with pytest.raises(ArgumentError, match=match):
        virtual_pipeline.mmp_validate_args(args=pipeline(**kw))


def test_use_epx_is_honoured_under_torchrun_restarts_with_the_hang_watchdog():
    settings = Settings(mt_env=(("USE_EPX", "1"),))
    on = env_switches.verdicts(settings, margs(hang_timeout=60.0), "cpu", max_restarts=2)[0]
    assert on.honoured and "restarts the group up to 2 times" in on.text
    for args, restarts in ((margs(hang_timeout=60.0), None), (margs(hang_timeout=0.0), 2)):
        off = env_switches.verdicts(settings, args, "cpu", max_restarts=restarts)[0]
        assert not off.honoured and "mmp run --max-restarts N" in off.text


def test_enable_async_ckpt_is_honoured_by_the_async_writer_flags():
    settings = Settings(mt_env=(("ENABLE_ASYNC_CKPT", "1"),))
    on = env_switches.verdicts(settings, margs(async_save=True, use_persistent_ckpt_worker=True),
                               "cpu")[0]
    assert on.honoured and "async writer" in on.text
    # megatron-core drops --async-save without the persistent worker: named, with the flags
    off = env_switches.verdicts(settings, margs(async_save=True), "cpu")[0]
    assert not off.honoured and "--async-save --use-persistent-ckpt-worker" in off.text
