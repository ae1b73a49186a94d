"""--use-flash-attn / --moe-permute-fusion / --moe-grouped-gemm: upstream flags whose local-spec
implementation is a feature of this layer; switched off or broken, they fail naming the feature
(their FLAG_NEEDS, checked by megatron_args)."""

import types

import pytest

from megatron_musa_patch.upstream.conditions import te_installed
from megatron_musa_patch.base.errors import FeatureUnavailableError
from megatron_musa_patch.features import megatron_args
from megatron_musa_patch.features.fused_ops import flash_attention, moe_fusion

from tests.harness.sessions import make_session


def _args(**kw):
    base = dict(use_flash_attn=False, use_legacy_models=False, transformer_impl="local",
                moe_permute_fusion=False, moe_grouped_gemm=False)
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_flash_attention_switched_off_is_an_error():
    session = make_session(flash_attention, disable=("fused_ops.flash_attention",))
    with pytest.raises(FeatureUnavailableError, match="--use-flash-attn needs the feature "
                                                      "'fused_ops.flash_attention' .* switched off"):
        megatron_args.check_flag_needs(session, _args(use_flash_attn=True))
    # not given, or served by TransformerEngine / the legacy model: nothing to check
    megatron_args.check_flag_needs(session, _args())
    megatron_args.check_flag_needs(session, _args(use_flash_attn=True,
                                                  transformer_impl="transformer_engine"))
    megatron_args.check_flag_needs(session, _args(use_flash_attn=True, use_legacy_models=True))


def test_flash_attention_broken_names_the_failure():
    session = make_session(flash_attention, problems={"fused_ops.flash_attention": ["target gone"]})
    with pytest.raises(FeatureUnavailableError, match="did not apply: target gone"):
        megatron_args.check_flag_needs(session, _args(use_flash_attn=True))


def test_flash_attention_flag_reaches_the_config():
    config = types.SimpleNamespace()
    flash_attention.mmp_transformer_config(_args(use_flash_attn=True), config)
    assert config.use_flash_attn is True
    flash_attention.mmp_transformer_config(_args(use_flash_attn=True, use_legacy_models=True),
                                           config)
    assert config.use_flash_attn is False


@pytest.mark.parametrize("flag,attr", [("--moe-permute-fusion", "moe_permute_fusion"),
                                       ("--moe-grouped-gemm", "moe_grouped_gemm")])
def test_moe_fusion_switched_off_is_an_error(flag, attr):
    if te_installed() or not moe_fusion.grouped_gemm_package_missing():
        pytest.skip("TransformerEngine or grouped_gemm is installed: upstream serves the flags")
    session = make_session(moe_fusion, disable=("fused_ops.moe_fusion",))
    with pytest.raises(FeatureUnavailableError, match=f"{flag} needs the feature 'fused_ops.moe_fusion'"):
        megatron_args.check_flag_needs(session, _args(**{attr: True}))


def test_grouped_gemm_passes_the_capability_check_and_is_restored():
    if not moe_fusion.grouped_gemm_package_missing():
        pytest.skip("the grouped_gemm package is installed: upstream serves the flag")
    args = _args(moe_grouped_gemm=True)
    moe_fusion.mmp_validate_args(args)  # no GPU here: capability (0, 0) < 8
    assert args.moe_grouped_gemm is False  # hidden from Megatron-LM's assertion ...
    seen = []

    def validate_args(args, defaults={}):
        seen.append(args.moe_grouped_gemm)

    moe_fusion._validate_args(validate_args, None, (args,), {})
    assert seen == [False] and args.moe_grouped_gemm is True  # ... and back afterwards
    assert not hasattr(args, moe_fusion._HIDDEN)
