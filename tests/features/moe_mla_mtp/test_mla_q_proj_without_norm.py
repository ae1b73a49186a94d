"""--mla-q-proj-without-norm (feature mla_q_proj_without_norm): its misuse refused, its flag
refused when the feature is off (docs/bad_inputs.md row 81); the model it builds on megatron-core
0.19 is checked against transformers' DeepSeek-V2-Lite in tests/checkpoint/test_hf_families.py."""

import argparse
from types import SimpleNamespace

import pytest

from megatron_musa_patch.base.errors import ArgumentError, FeatureUnavailableError
from megatron_musa_patch.features import megatron_args
from megatron_musa_patch.features.moe_mla_mtp import mla_q_proj_without_norm

from tests.harness.sessions import make_session


def margs(**kw):
    return SimpleNamespace(**{"multi_latent_attention": True, "q_lora_rank": None,
                              "mla_q_proj_without_norm": True, **kw})


def test_misuse_is_refused():
    mla_q_proj_without_norm.mmp_validate_args(args=margs())  # V2-Lite's shape: fine
    mla_q_proj_without_norm.mmp_validate_args(args=margs(mla_q_proj_without_norm=False,
                                                         multi_latent_attention=False))
    with pytest.raises(ArgumentError, match="add --multi-latent-attention"):
        mla_q_proj_without_norm.mmp_validate_args(args=margs(multi_latent_attention=False))
    with pytest.raises(ArgumentError, match="with --q-lora-rank 1536 the query's norm is the "
                                            "LoRA's own"):
        mla_q_proj_without_norm.mmp_validate_args(args=margs(q_lora_rank=1536))


def test_the_flag_needs_its_feature():
    session = make_session(mla_q_proj_without_norm, disable=("moe_mla_mtp.mla_q_proj_without_norm",))
    parser = argparse.ArgumentParser()
    megatron_args.add_plugin_arguments(session, parser)
    args = parser.parse_args(["--mla-q-proj-without-norm"])
    with pytest.raises(FeatureUnavailableError, match="--mla-q-proj-without-norm needs the "
                                                      "feature 'moe_mla_mtp.mla_q_proj_without_norm'"):
        megatron_args.check_flag_needs(session, args)


def test_config_and_record():
    config = SimpleNamespace()
    mla_q_proj_without_norm.mmp_transformer_config(args=margs(), config=config)
    assert config.mla_q_proj_without_norm is True
    records = []
    mla_q_proj_without_norm.mmp_register_patches(registry=SimpleNamespace(add=records.append))
    (record,) = records
    assert record.target.endswith("QKNormConfigResolver.resolve")
    assert record.megatron == ">=0.19,<0.20"  # the release the fact starts at
