"""core.feature: the registration order follows the declarations' ``after``; a misspelt name or
a cycle is refused (an ordering that silently stopped holding would swap two wrappers)."""

from types import SimpleNamespace

import pytest

from megatron_musa_patch.base.errors import PluginError
from megatron_musa_patch.core.feature import Feature, declaration, feature, ordered


def plugin(name, after=()):
    return SimpleNamespace(FEATURE=Feature(name, "test", after=tuple(after)))


def names(plugins):
    return [p.FEATURE.name for p in plugins]


def test_by_name_unless_declared_after():
    assert names(ordered([plugin("b"), plugin("a"), plugin("c")])) == ["a", "b", "c"]
    assert names(ordered([plugin("a", after=["c"]), plugin("b"), plugin("c")])) == ["b", "c", "a"]


def test_a_group_name_means_all_of_its_features_but_a_feature_name_means_that_feature():
    group = [plugin("g.x"), plugin("g.y"), plugin("a", after=["g"])]
    assert names(ordered(group)) == ["g.x", "g.y", "a"]
    both = [plugin("g"), plugin("g.x", after=["g"]), plugin("a", after=["g"])]
    assert names(ordered(both)) == ["g", "a", "g.x"]


def test_misspelt_and_cyclic_orderings_are_refused():
    with pytest.raises(PluginError, match="'a' is declared after 'nope', which names no feature"):
        ordered([plugin("a", after=["nope"])])
    with pytest.raises(PluginError, match="a, b are ordered after each other"):
        ordered([plugin("a", after=["b"]), plugin("b", after=["a"])])
    with pytest.raises(PluginError, match="two plugins declare the feature 'a'"):
        ordered([plugin("a"), plugin("a")])


def test_feature_takes_its_name_from_the_module_path():
    assert feature("megatron_musa_patch.features.fused_ops.rope", "d").name == "fused_ops.rope"
    with pytest.raises(PluginError, match="feature\\(\\) is for modules under"):
        feature("somewhere.else", "d")


def test_an_external_plugin_may_declare_the_older_constants():
    legacy = SimpleNamespace(FEATURE="legacy", REQUIRED=True, DESCRIPTION="old form")
    assert declaration(legacy) == Feature("legacy", "old form", required=True)
    assert declaration(SimpleNamespace()) is None


def test_the_builtin_order_keeps_the_wrappers_that_share_a_function_as_they_were():
    """Where two features wrap one upstream function, which is outside is the order of their
    registration (pluggy calls the last-registered first): these pairs are part of behaviour."""
    from megatron_musa_patch.features import BUILTIN

    order = names(BUILTIN)
    outside_inside = [("recompute", "fused_ops.moe_fusion"), ("megatron_args", "fused_ops.moe_fusion"),
                      ("logs.throughput", "reliability.hang_watchdog"),
                      ("upstream_fixes.distopt_step_counters", "offload.cpu_offload"),
                      ("upstream_fixes.distopt_step_counters", "upstream_fixes.distopt_load_no_grad"),
                      ("upstream_fixes.optimizer_lr_unset", "offload.cpu_offload"),
                      ("upstream_fixes.expert_bias_out_of_place", "recompute"),
                      ("recompute", "recompute.mlp_rms"),
                      ("reliability.checkpoint_safety.no_rewrite_of_loaded", "mt_megatron.wait_after_ckpt"),
                      ("moe_mla_mtp.moe_device_balance", "moe_mla_mtp.moe_device_balance.complementary_seq_aux_loss"),
                      ("moe_mla_mtp.moe_device_balance.complementary_seq_aux_loss",
                       "moe_mla_mtp.moe_device_balance.topk_prob_norm"),
                      ("moe_mla_mtp.moe_device_balance.topk_prob_norm", "moe_mla_mtp.moe_device_balance.group_score"),
                      ("moe_mla_mtp.moe_device_balance.group_score", "mt_megatron.router_flags"),
                      ("startup.forked_write_queue", "reliability.restart_store")]
    for outside, inside in outside_inside:
        assert order.index(outside) < order.index(inside), (outside, inside)
