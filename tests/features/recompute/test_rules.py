"""--attn-recompute / --mlp-recompute / --recompute-variance: which combinations are refused,
the flags on Megatron's parser, and the config carry (no Megatron import needed)."""

import argparse
from types import SimpleNamespace

import pytest

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.features import recompute as feature
from megatron_musa_patch.lib.recompute import rules


def settings(**kw):
    base = dict(attn_recompute=False, mlp_recompute=False, recompute_variance=False,
                recompute_granularity=None, recompute_modules=None, recompute_activations=False,
                fp8=None, fp4=None, cuda_graph_impl="none", transformer_impl="local",
                num_experts=None, moe_grouped_gemm=False)
    base.update(kw)
    return SimpleNamespace(**base)


ALL = dict(attn_recompute=True, mlp_recompute=True, recompute_variance=True)


def test_every_combination_alone_and_with_compatible_upstream_modules_is_allowed():
    for attn in (False, True):
        for mlp in (False, True):
            for var in (False, True):
                s = settings(attn_recompute=attn, mlp_recompute=mlp, recompute_variance=var)
                assert rules.problems(s) == []
    # upstream's core_attn with --mlp-recompute, upstream's mlp with --attn-recompute
    assert rules.problems(settings(mlp_recompute=True, recompute_granularity="selective")) == []
    assert rules.problems(settings(attn_recompute=True, recompute_granularity="selective",
                                   recompute_modules=["mlp"])) == []


def test_no_flag_means_no_opinion():
    assert rules.problems(settings(recompute_granularity="full", fp8="e4m3")) == []


def test_full_granularity_is_refused_naming_the_flags():
    for method, layers in (("uniform", 1), ("block", 1), ("block", 2)):
        (msg,) = rules.problems(settings(attn_recompute=True, mlp_recompute=True,
                                         recompute_granularity="full", recompute_method=method,
                                         recompute_num_layers=layers))
        assert "--attn-recompute --mlp-recompute" in msg and "--recompute-granularity full" in msg
        assert f"--recompute-method {method} --recompute-num-layers {layers}" in msg
        assert "--recompute-method block --recompute-num-layers 0" in msg  # what is accepted


def test_full_block_granularity_with_no_layer_is_accepted_with_every_flag():
    """MT-Megatron's scripts: --recompute-granularity full --recompute-method block
    --recompute-num-layers 0 beside the fine-grained flags (no layer is fully recomputed)."""
    for flags in ({"attn_recompute": True}, {"mlp_recompute": True}, ALL,
                  {"recompute_variance": True}):
        s = settings(**flags, recompute_granularity="full", recompute_method="block",
                     recompute_num_layers=0)
        assert rules.full_recompute_is_off(s)
        assert rules.problems(s) == [] and rules.upstream_problems(s) == []
    assert not rules.full_recompute_is_off(settings(recompute_granularity="full",
                                                    recompute_method="uniform",
                                                    recompute_num_layers=0))


def test_uniform_method_with_no_layer_is_refused_as_the_endless_loop_it_is():
    s = settings(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=0)
    (msg,) = rules.upstream_problems(s)
    assert "--recompute-method uniform --recompute-num-layers 0 never ends" in msg
    assert "--recompute-method block --recompute-num-layers 0" in msg
    with pytest.raises(ArgumentError, match="never ends"):
        feature.mmp_validate_args(args=s)  # with or without the fine-grained flags
    assert rules.upstream_problems(settings(recompute_granularity="full",
                                            recompute_method="uniform",
                                            recompute_num_layers=1)) == []


@pytest.mark.parametrize("flag,module", [
    ("mlp_recompute", "mlp"), ("mlp_recompute", "moe"), ("mlp_recompute", "shared_experts"),
    ("mlp_recompute", "moe_act"), ("attn_recompute", "core_attn"),
    ("attn_recompute", "mla_up_proj"), ("attn_recompute", "layernorm"),
    ("recompute_variance", "layernorm")])
def test_a_module_requested_twice_is_refused(flag, module):
    (msg,) = rules.problems(settings(**{flag: True}, recompute_granularity="selective",
                                     recompute_modules=[module]))
    assert rules.FLAGS[flag] in msg and f"--recompute-modules {module}" in msg
    assert "twice" in msg


def test_upstream_default_core_attn_counts_as_requested():
    # --recompute-activations (or selective without modules) means core_attn upstream
    for s in (settings(attn_recompute=True, recompute_activations=True),
              settings(attn_recompute=True, recompute_granularity="selective")):
        (msg,) = rules.problems(s)
        assert "core_attn" in msg and "upstream's default" in msg


def test_unsupported_combinations_say_so(monkeypatch):
    assert "fp8" in rules.problems(settings(mlp_recompute=True, fp8="hybrid"))[0]
    assert "CUDA graphs" in rules.problems(settings(attn_recompute=True,
                                                    cuda_graph_impl="local"))[0]
    assert "--cpu-offloading" in rules.problems(settings(attn_recompute=True,
                                                         cpu_offloading=True))[0]
    # the overlapped shared expert: its activations are released instead (no refusal)
    assert rules.problems(settings(mlp_recompute=True, moe_shared_expert_overlap=True)) == []
    msg = rules.problems(settings(recompute_variance=True, transformer_impl="transformer_engine"))
    assert "--transformer-impl local" in msg[0]
    # a TransformerConfig built in code keeps the TE default: not checked there
    assert rules.problems(settings(recompute_variance=True, transformer_impl="transformer_engine"),
                          check_impl=False) == []
    # grouped experts: the layer's grouped GEMM offers its backward on its own; the
    # grouped_gemm package does not, so only with it installed the combination is refused
    grouped = settings(**ALL, num_experts=8, moe_grouped_gemm=True)
    assert rules.problems(grouped) == []
    monkeypatch.setattr(rules, "importable", lambda name: name == "grouped_gemm")
    msg = rules.problems(grouped)
    assert "--moe-grouped-gemm" in msg[0] and "Uninstall grouped_gemm" in msg[0]
    assert rules.problems(settings(attn_recompute=True, recompute_variance=True, num_experts=8,
                                   moe_grouped_gemm=True)) == []


def test_flags_land_in_a_recompute_argument_group():
    parser = argparse.ArgumentParser()
    feature.mmp_add_arguments(parser)
    group = next(g for g in parser._action_groups if g.title == "recompute")
    assert {a.dest for a in group._group_actions} == set(rules.FLAGS)
    args = parser.parse_args(["--attn-recompute", "--recompute-variance"])
    assert args.attn_recompute and args.recompute_variance and not args.mlp_recompute


def test_validation_raises_one_paragraph_and_config_carries_the_flags():
    with pytest.raises(ArgumentError, match="--mlp-recompute already recomputes"):
        feature.mmp_validate_args(args=settings(mlp_recompute=True,
                                                recompute_granularity="selective",
                                                recompute_modules=["mlp"]))
    feature.mmp_validate_args(args=settings())  # no flag: nothing to check
    config = SimpleNamespace()
    feature.mmp_transformer_config(args=settings(**ALL), config=config)
    assert (config.attn_recompute, config.mlp_recompute, config.recompute_variance) == \
        (True, True, True)


def test_a_config_set_in_code_is_checked_when_a_layer_runs():
    from megatron_musa_patch.lib.recompute import wrappers

    from tests.harness.sessions import make_session

    session = make_session(feature)
    bad = settings(attn_recompute=True, recompute_granularity="full",
                   transformer_impl="transformer_engine")
    with pytest.raises(ArgumentError, match="--recompute-granularity full"):
        wrappers.verify(feature.requirement(session), bad)
    good = settings(**ALL, transformer_impl="transformer_engine")
    wrappers.verify(feature.requirement(session), good)  # the layer checks its modules itself when variance needs them
    assert good._mmp_recompute_verified
    good.recompute_granularity = "full"  # changed after the first check: checked again
    with pytest.raises(ArgumentError):
        wrappers.verify(feature.requirement(session), good)


def test_flags_of_a_broken_feature_fail_instead_of_doing_nothing():
    from megatron_musa_patch.base.errors import FeatureUnavailableError
    from megatron_musa_patch.lib.recompute import wrappers

    from tests.harness.sessions import make_session

    broken = make_session(feature, problems={"recompute": ["target gone"]})
    with pytest.raises(FeatureUnavailableError, match="--attn-recompute needs the feature "
                                                      "'recompute', which did not apply: target"):
        wrappers.verify(feature.requirement(broken), settings(attn_recompute=True))
    wrappers.verify(feature.requirement(make_session(feature)), settings(attn_recompute=True, recompute_variance=True))
