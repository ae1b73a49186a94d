"""--moe-shared-expert-gate on every release (feature moe_mla_mtp.shared_expert_gate): added where
Megatron's parser lacks it (megatron-core 0.16), left to upstream where it has it, carried onto
the config, its misuse refused (docs/bad_inputs.md row 97). The model it builds is checked
against transformers' Qwen2-MoE on 0.16.1 and 0.19 in tests/checkpoint/test_hf_families.py."""

import argparse
from types import SimpleNamespace

import pytest

from megatron_musa_patch.base.errors import ArgumentError, FeatureUnavailableError
from megatron_musa_patch.features import megatron_args
from megatron_musa_patch.features.moe_mla_mtp import shared_expert_gate

from tests.harness.sessions import make_session


def test_added_where_the_parser_lacks_it_and_left_to_upstream_where_it_has_it():
    parser = argparse.ArgumentParser()
    shared_expert_gate.mmp_add_arguments(parser=parser)
    assert parser.parse_args(["--moe-shared-expert-gate"]).moe_shared_expert_gate is True
    assert parser.parse_args([]).moe_shared_expert_gate is False
    upstream = argparse.ArgumentParser()
    upstream.add_argument("--moe-shared-expert-gate", action="store_true", help="upstream's")
    shared_expert_gate.mmp_add_arguments(parser=upstream)  # no conflicting second flag
    (action,) = [a for a in upstream._actions if "--moe-shared-expert-gate" in a.option_strings]
    assert action.help == "upstream's"


def test_carried_onto_the_config_and_misuse_refused():
    config = SimpleNamespace()
    args = SimpleNamespace(moe_shared_expert_gate=True, moe_shared_expert_intermediate_size=48)
    shared_expert_gate.mmp_validate_args(args=args)
    shared_expert_gate.mmp_transformer_config(args=args, config=config)
    assert config.moe_shared_expert_gate is True
    with pytest.raises(ArgumentError, match="add --moe-shared-expert-intermediate-size"):
        shared_expert_gate.mmp_validate_args(args=SimpleNamespace(
            moe_shared_expert_gate=True, moe_shared_expert_intermediate_size=None))


def test_the_flag_needs_its_feature():
    session = make_session(shared_expert_gate, disable=("moe_mla_mtp.shared_expert_gate",))
    parser = argparse.ArgumentParser()
    megatron_args.add_plugin_arguments(session, parser)
    args = parser.parse_args(["--moe-shared-expert-gate"])
    with pytest.raises(FeatureUnavailableError, match="--moe-shared-expert-gate needs the "
                                                      "feature 'moe_mla_mtp.shared_expert_gate'"):
        megatron_args.check_flag_needs(session, args)
