"""The settings object: every MEGATRON_MUSA_PATCH_* variable read once, bad values named with
the fix; and the hierarchical toggles decided from it."""

import pytest

from megatron_musa_patch.core import settings
from megatron_musa_patch.base.errors import SettingsError
from megatron_musa_patch.core.toggles import decide

from tests.conftest import _LAYER_ENV


def test_defaults_without_variables():
    s = settings.from_env({})
    assert (s.device, s.jit, s.ops, s.gmm, s.kernels) == ("auto", "auto", "auto", "auto", True)
    assert (s.disable, s.only, s.allow_late, s.allow_unverified) == ((), None, False, False)


def test_values_are_parsed():
    s = settings.from_env({"MEGATRON_MUSA_PATCH_DEVICE": " CPU ", "MEGATRON_MUSA_PATCH_OPS": "eager",
                           "MEGATRON_MUSA_PATCH_DISABLE": "fused_ops.rope, recompute",
                           "MEGATRON_MUSA_PATCH_ONLY": "none",
                           "MEGATRON_MUSA_PATCH_KERNELS": "off",
                           "MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED": "1"})
    assert s.device == "cpu" and s.ops == "eager" and s.kernels is False
    assert s.disable == ("fused_ops.rope", "recompute") and s.only == ()
    assert s.allow_unverified is True
    assert settings.from_env(s.as_env()) == s  # what child processes are given reproduces it
    assert s.changed() == {"MEGATRON_MUSA_PATCH_DEVICE": "cpu", "MEGATRON_MUSA_PATCH_OPS": "eager",
                           "MEGATRON_MUSA_PATCH_KERNELS": "0",
                           "MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED": "1",
                           "MEGATRON_MUSA_PATCH_DISABLE": "fused_ops.rope,recompute",
                           "MEGATRON_MUSA_PATCH_ONLY": "none"}


@pytest.mark.parametrize("name,value,accepted", [
    ("MEGATRON_MUSA_PATCH_OPS", "eagr", "auto, eager, compile, native"),
    ("MEGATRON_MUSA_PATCH_JIT", "fast", "auto, compile, eager"),
    ("MEGATRON_MUSA_PATCH_DEVICE", "gpu", "auto, musa, cpu, cuda"),
    ("MEGATRON_MUSA_PATCH_GMM", "cutlass", "auto, loop, grouped_mm"),
    ("MEGATRON_MUSA_PATCH_KERNELS", "maybe", "1, 0"),
    ("MEGATRON_MUSA_PATCH_ALLOW_LATE", "yes please", "1, 0"),
])
def test_a_bad_value_names_the_variable_and_what_is_accepted(name, value, accepted):
    with pytest.raises(SettingsError) as caught:
        settings.from_env({name: value})
    assert f"{name}={value!r} is not a value this layer knows: use one of {accepted}" in \
        str(caught.value)


def test_a_misspelt_variable_is_named_with_the_likely_one():
    with pytest.raises(SettingsError, match="MEGATRON_MUSA_PATCH_DISABEL is not a variable of "
                                            "this layer .did you mean MEGATRON_MUSA_PATCH_DISABLE"):
        settings.from_env({"MEGATRON_MUSA_PATCH_DISABEL": "recompute"})


def test_the_test_harness_scrubs_every_variable():
    assert set(_LAYER_ENV) == set(settings.ENV_NAMES) | set(settings.FOREIGN_ENV_NAMES)
    assert len(settings.ENV_NAMES) == len(settings.VARIABLES) + len(settings.MT_VARIABLES)
    assert len(settings.VARIABLES) >= 14 and "ENABLE_ZERO_BUBBLE" in settings.ENV_NAMES
    assert set(settings.FOREIGN_ENV_NAMES) == {"TORCHADA_PLATFORM",
                                                "TORCHADA_FORCE_CUDA_AVAILABLE"}


def test_torchada_switches_are_read_into_the_settings():
    s = settings.from_env({"MEGATRON_MUSA_PATCH_TORCHADA": "0", "TORCHADA_PLATFORM": " MUSA ",
                           "TORCHADA_FORCE_CUDA_AVAILABLE": "0"})
    assert (s.torchada, s.torchada_platform, s.torchada_force_cuda_available) == (False, "musa",
                                                                                  "0")
    assert s.changed() == {"MEGATRON_MUSA_PATCH_TORCHADA": "0"}
    defaults = settings.from_env({})
    assert (defaults.torchada, defaults.torchada_platform,
            defaults.torchada_force_cuda_available) == (True, None, None)
    with pytest.raises(SettingsError, match="MEGATRON_MUSA_PATCH_TORCHADA='maybe'"):
        settings.from_env({"MEGATRON_MUSA_PATCH_TORCHADA": "maybe"})


def test_mt_megatron_switches_are_read_into_the_settings():
    got = settings.from_env({"ENABLE_ZERO_BUBBLE": "1", "USE_EPX": " 0 ", "ENABLE_PROFILER": "",
                             "UNRELATED": "1"})
    assert got.mt_env == (("ENABLE_ZERO_BUBBLE", "1"), ("USE_EPX", "0"))  # set ones, in order
    assert settings.from_env({}).mt_env == ()


FEATURES = {"device": True, "recompute": False, "fused_ops.rope": False,
            "fused_ops.norm": False, "upstream_fixes.te_version": False}


def test_a_group_name_switches_all_of_its_features():
    toggles = decide(FEATURES, ["fused_ops"], None)
    assert toggles.off == {"fused_ops.rope", "fused_ops.norm"}
    assert toggles.why("fused_ops.rope") == "switched off by MEGATRON_MUSA_PATCH_DISABLE=fused_ops"


def test_one_part_off_leaves_its_siblings_on():
    assert decide(FEATURES, ["fused_ops.rope"], None).off == {"fused_ops.rope"}


def test_only_keeps_required_features_and_the_named_group():
    assert decide(FEATURES, [], ["fused_ops"]).off == {"recompute", "upstream_fixes.te_version"}
    assert decide(FEATURES, [], []).off == set(FEATURES) - {"device"}  # ONLY=none
    # a required feature goes only when named
    assert "device" in decide(FEATURES, ["device"], None).off


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(SettingsError, match=r"DISABLE names an unknown feature 'fused_ops.rop' "
                                            r"\(did you mean 'fused_ops.rope'\?\); known "
                                            r"features: device, fused_ops.norm"):
        decide(FEATURES, ["fused_ops.rop"], None)
    # no suggestion where nothing is near; the variable named is the one that holds the name
    with pytest.raises(SettingsError, match=r"ONLY names an unknown feature 'zzz'; known"):
        decide(FEATURES, [], ["zzz"])
    with pytest.raises(SettingsError, match="ONLY names an unknown feature"):
        decide(FEATURES, [], ["fused"])


def test_an_mt_switch_is_on_unless_empty_or_an_off_word():
    from megatron_musa_patch.core.settings import Settings, switched_on

    assert [switched_on(v) for v in ("1", "true", " ON ", "yes", "2")] == [True] * 5
    assert [switched_on(v) for v in ("", " ", "0", "false", "No", "off")] == [False] * 6
    settings = Settings(mt_env=(("ENABLE_ZERO_BUBBLE", "1"), ("USE_EPX", "0")))
    assert settings.mt_switch_on("ENABLE_ZERO_BUBBLE") is True
    assert settings.mt_switch_on("USE_EPX") is False
    assert settings.mt_switch_on("ENABLE_PROFILER") is False  # not set
