"""A feature's dotted name is its public toggle: the features that moved into their README area's
folder keep their earlier names (``feature(..., aliases=...)``), and a group name that existed
before keeps switching exactly the features it switched (``kept_out``). The names before the
regroup are written out here, as users have them in their scripts."""

import pytest

from megatron_musa_patch.base.errors import SettingsError
from megatron_musa_patch.core.plugins import make_manager, toggles
from megatron_musa_patch.core.settings import Settings
from megatron_musa_patch.core.toggles import decide
from megatron_musa_patch.features import BUILTIN

#: earlier name -> the feature it names now
MOVED = {
    "collectives": "device.collectives",
    "lazy_gloo_groups": "device.lazy_gloo_groups",
    "release_dropped_groups": "device.release_dropped_groups",
    "fsdp_reduce_unfused": "device.fsdp_reduce_unfused",
    "te_absent": "device.te_absent",
    "cpu_offload": "offload.cpu_offload",
    "flash_attention": "fused_ops.flash_attention",
    "moe_fusion": "fused_ops.moe_fusion",
    "moe_device_balance": "moe_mla_mtp.moe_device_balance",
    "moe_device_balance.complementary_seq_aux_loss":
        "moe_mla_mtp.moe_device_balance.complementary_seq_aux_loss",
    "moe_device_balance.group_score": "moe_mla_mtp.moe_device_balance.group_score",
    "moe_device_balance.topk_prob_norm": "moe_mla_mtp.moe_device_balance.topk_prob_norm",
    "mla_local": "moe_mla_mtp.mla_local",
    "mla_q_proj_without_norm": "moe_mla_mtp.mla_q_proj_without_norm",
    "mtp_flags": "moe_mla_mtp.mtp_flags",
    "checkpoint_safety.async_snapshot": "reliability.checkpoint_safety.async_snapshot",
    "checkpoint_safety.atomic_tracker": "reliability.checkpoint_safety.atomic_tracker",
    "checkpoint_safety.exact_resume_rng": "reliability.checkpoint_safety.exact_resume_rng",
    "checkpoint_safety.legacy_format_experts":
        "reliability.checkpoint_safety.legacy_format_experts",
    "checkpoint_safety.no_rewrite_of_loaded": "reliability.checkpoint_safety.no_rewrite_of_loaded",
    "checkpoint_safety.tracker_check": "reliability.checkpoint_safety.tracker_check",
    "hang_watchdog": "reliability.hang_watchdog",
    "restart_store": "reliability.restart_store",
    "data_checks": "reliability.data_checks",
    "brief_log": "logs.brief_log",
    "startup_progress": "logs.startup_progress",
    "throughput": "logs.throughput",
    "lazy_compile": "startup.lazy_compile",
    "forked_write_queue": "startup.forked_write_queue",
    "cuda_free_startup": "startup.cuda_free_startup",
}
#: group names that existed before, with what they switched then
GROUPS_BEFORE = {
    "device": {"device"},
    "fused_ops": {"fused_ops.norm", "fused_ops.rope", "fused_ops.softmax", "fused_ops.swiglu",
                  "fused_ops.wgrad_accumulation"},
    "checkpoint_safety": {v for k, v in MOVED.items() if k.startswith("checkpoint_safety.")},
    "moe_device_balance": {v for k, v in MOVED.items() if k.startswith("moe_device_balance")},
}


def off(**settings):
    pm = make_manager(Settings(**settings), BUILTIN, load_entry_points=False)
    return toggles(pm, Settings(**settings)).off


def names():
    return {m.FEATURE.name for m in BUILTIN}


def test_each_moved_feature_declares_its_earlier_name():
    declared = {m.FEATURE.name: m.FEATURE.aliases for m in BUILTIN}
    assert {old: new for new, aliases in declared.items() for old in aliases} == MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_earlier_name_switches_its_feature_off(old, new):
    switched = off(disable=(old,))
    parts = {n for n in names() if n.startswith(new + ".")}
    assert switched == {new} | parts
    assert off(disable=(new,)) == switched


@pytest.mark.parametrize("group", sorted(GROUPS_BEFORE))
def test_a_group_name_of_before_keeps_its_features(group):
    assert off(disable=(group,)) == GROUPS_BEFORE[group]


def test_only_takes_earlier_names_too():
    kept = names() - off(only=("hang_watchdog", "fused_ops"))
    assert {"reliability.hang_watchdog", "fused_ops.rope"} <= kept
    assert "fused_ops.flash_attention" not in kept and "reliability.data_checks" not in kept


def test_a_new_group_name_switches_its_whole_folder():
    assert off(disable=("reliability",)) == {n for n in names()
                                             if n.startswith("reliability.")}
    assert off(disable=("logs",)) == {"logs.brief_log", "logs.startup_progress",
                                      "logs.throughput"}


def test_a_misspelt_earlier_name_is_refused_with_the_nearest():
    with pytest.raises(SettingsError, match=r"'hang_watchdg' \(did you mean 'hang_watchdog'\?\)"):
        off(disable=("hang_watchdg",))


def test_kept_out_and_aliases_in_the_decision_itself():
    decided = decide({"g.a": False, "g.b": False, "h.c": False}, ["g"], None,
                     aliases={"h.c": ("c",)}, kept_out={"g.b": ("g",)})
    assert decided.off == {"g.a"}
    assert decide({"h.c": False}, ["c"], None, aliases={"h.c": ("c",)}).off == {"h.c"}


def test_after_takes_earlier_names_and_keeps_group_meanings():
    """A plugin ordered after an earlier name follows the feature that had it; after a group
    name, the features that name switches (not those kept out of it)."""
    import types

    from megatron_musa_patch.core.feature import Feature, ordered

    def plugin(name, **kw):
        return types.SimpleNamespace(FEATURE=Feature(name, "", **kw))

    moved = plugin("zz.watchdog", aliases=("a_watchdog",))
    joined = plugin("g.zlate", kept_out=("g",))
    member = plugin("g.member")
    after_alias = plugin("aa", after=("a_watchdog",))
    after_group = plugin("ab", after=("g",))
    order = [p.FEATURE.name for p in ordered([after_alias, after_group, moved, joined, member])]
    assert order.index("zz.watchdog") < order.index("aa")
    # after g: after its member, not after the one kept out (which sorts later by name)
    assert order.index("g.member") < order.index("ab") < order.index("g.zlate")
