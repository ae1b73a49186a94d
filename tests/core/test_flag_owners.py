"""Flags of a feature that is switched off or broken fail with the feature's name, instead of
silently doing nothing: the flags a plugin adds, and the upstream flags it declares in
``FLAG_NEEDS``, checked in one place (``megatron_args.check_flag_needs``)."""

import argparse

import pytest

from megatron_musa_patch.base.errors import FeatureUnavailableError
from megatron_musa_patch.features import megatron_args
from megatron_musa_patch.core.flag_needs import FlagNeed
from megatron_musa_patch.core.hookspecs import hookimpl

from tests.harness.sessions import make_session


class DemoFeature:
    FEATURE = "demo"
    FLAG_NEEDS = (FlagNeed("--upstream-flag", when=lambda args: args.upstream_flag > 1,
                           because="upstream cannot do it alone", instead="add --upstream-flag 1"),
                  FlagNeed("--gpu-only-flag", when=lambda args: True,
                           devices=frozenset({"musa"})))

    @hookimpl
    def mmp_add_arguments(self, parser):
        parser.add_argument("--demo-on", action="store_true")
        parser.add_argument("--demo-level", type=int, default=0)


def parsed(**session_options):
    session = make_session(DemoFeature(), **session_options)
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream-flag", type=int, default=1)
    megatron_args.add_plugin_arguments(session, parser)
    assert [a.dest for a in session.flag_owners["demo"]] == ["demo_on", "demo_level"]
    return session, parser


def test_flag_of_a_switched_off_feature_is_an_error():
    session, parser = parsed(disable=("demo",))
    with pytest.raises(FeatureUnavailableError, match="--demo-level needs the feature 'demo', "
                                                      "which is switched off by "
                                                      "MEGATRON_MUSA_PATCH_DISABLE=demo"):
        megatron_args.check_flag_needs(session, parser.parse_args(["--demo-level", "3"]))


def test_flag_of_a_broken_feature_names_the_failure():
    session, parser = parsed(problems={"demo": ["target gone"]})
    with pytest.raises(FeatureUnavailableError, match="did not apply: target gone"):
        megatron_args.check_flag_needs(session, parser.parse_args(["--demo-on"]))


def test_declared_upstream_flag_names_why_and_what_instead():
    session, parser = parsed(disable=("demo",))
    with pytest.raises(FeatureUnavailableError) as caught:
        megatron_args.check_flag_needs(session, parser.parse_args(["--upstream-flag", "5"]))
    text = str(caught.value)
    assert "--upstream-flag needs the feature 'demo' (upstream cannot do it alone)" in text
    assert text.endswith("or add --upstream-flag 1.")


def test_defaults_healthy_features_and_other_devices_pass():
    session, parser = parsed(disable=("demo",))
    megatron_args.check_flag_needs(session, parser.parse_args([]))  # --gpu-only-flag: musa only
    session, parser = parsed()
    megatron_args.check_flag_needs(session, parser.parse_args(["--demo-on", "--upstream-flag",
                                                               "5"]))
