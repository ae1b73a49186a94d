"""Flags of a feature that is switched off or broken fail with the feature's name, instead of
silently doing nothing."""

import argparse
import types

import pytest

from megatron_musa_patch.errors import FeatureUnavailableError
from megatron_musa_patch.features import megatron_args
from megatron_musa_patch.hookspecs import hookimpl
from megatron_musa_patch.plugins import make_manager


class DemoFeature:
    FEATURE = "demo"

    @hookimpl
    def mmp_add_arguments(self, parser):
        parser.add_argument("--demo-on", action="store_true")
        parser.add_argument("--demo-level", type=int, default=0)


@pytest.fixture
def parsed():
    pm = make_manager(builtins=(), load_entry_points=False)
    pm.register(DemoFeature(), name="demo")
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream-flag", type=int, default=1)
    megatron_args.add_plugin_arguments(pm, parser)
    assert [a.dest for a in megatron_args.FLAG_OWNERS["demo"]] == ["demo_on", "demo_level"]
    return parser


def _registry(disabled=(), problems=()):
    return types.SimpleNamespace(disabled_features=set(disabled),
                                 feature_problems=lambda name: list(problems))


def test_flag_of_a_switched_off_feature_is_an_error(parsed):
    args = parsed.parse_args(["--demo-level", "3"])
    with pytest.raises(FeatureUnavailableError, match="--demo-level belongs to the feature "
                                                      "'demo', which is switched off"):
        megatron_args.check_unavailable_flags(args, _registry(disabled={"demo"}))


def test_flag_of_a_broken_feature_names_the_failure(parsed):
    args = parsed.parse_args(["--demo-on"])
    with pytest.raises(FeatureUnavailableError, match="whose patches failed: target gone"):
        megatron_args.check_unavailable_flags(args, _registry(problems=["target gone"]))


def test_defaults_and_healthy_features_pass(parsed):
    megatron_args.check_unavailable_flags(parsed.parse_args([]), _registry(disabled={"demo"}))
    megatron_args.check_unavailable_flags(parsed.parse_args(["--demo-on", "--upstream-flag",
                                                             "5"]), _registry())
