"""--use-flash-attn / --moe-permute-fusion / --moe-grouped-gemm: upstream flags whose local-spec
implementation is a feature of this layer; switched off or broken, they fail naming the feature."""

import types

import pytest

from megatron_musa_patch import activation
from megatron_musa_patch.errors import FeatureUnavailableError
from megatron_musa_patch.features import flash_attention, moe_fusion


@pytest.fixture
def registry(monkeypatch):
    state = types.SimpleNamespace(disabled_features=set(), problems=[])
    fake = types.SimpleNamespace(registry=types.SimpleNamespace(
        disabled_features=state.disabled_features,
        feature_problems=lambda name: list(state.problems)))
    monkeypatch.setattr(activation, "current", lambda: fake)
    return state


def _args(**kw):
    base = dict(use_flash_attn=False, use_legacy_models=False, transformer_impl="local",
                moe_permute_fusion=False, moe_grouped_gemm=False)
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_flash_attention_switched_off_is_an_error(registry):
    registry.disabled_features.add("flash_attention")
    with pytest.raises(FeatureUnavailableError, match="--use-flash-attn .* 'flash_attention' "
                                                      "feature, which .* switched off"):
        flash_attention.mmp_validate_args(_args(use_flash_attn=True), None)
    # not given, or served by TransformerEngine / the legacy model: nothing to check
    flash_attention.mmp_validate_args(_args(), None)
    flash_attention.mmp_validate_args(_args(use_flash_attn=True,
                                            transformer_impl="transformer_engine"), None)
    flash_attention.mmp_validate_args(_args(use_flash_attn=True, use_legacy_models=True), None)


def test_flash_attention_broken_names_the_failure(registry):
    registry.problems.append("target gone")
    with pytest.raises(FeatureUnavailableError, match="failed: target gone"):
        flash_attention.mmp_validate_args(_args(use_flash_attn=True), None)


def test_flash_attention_flag_reaches_the_config():
    config = types.SimpleNamespace()
    flash_attention.mmp_transformer_config(_args(use_flash_attn=True), config)
    assert config.use_flash_attn is True
    flash_attention.mmp_transformer_config(_args(use_flash_attn=True, use_legacy_models=True),
                                           config)
    assert config.use_flash_attn is False


@pytest.mark.parametrize("flag,attr", [("--moe-permute-fusion", "moe_permute_fusion"),
                                       ("--moe-grouped-gemm", "moe_grouped_gemm")])
def test_moe_fusion_switched_off_is_an_error(registry, flag, attr):
    if not (moe_fusion.te_missing() and moe_fusion.grouped_gemm_package_missing()):
        pytest.skip("TransformerEngine or grouped_gemm is installed: upstream serves the flags")
    registry.disabled_features.add("moe_fusion")
    with pytest.raises(FeatureUnavailableError, match=f"{flag} .* 'moe_fusion' feature"):
        moe_fusion.mmp_validate_args(_args(**{attr: True}), None)


def test_grouped_gemm_passes_the_capability_check_and_is_restored(registry):
    if not moe_fusion.grouped_gemm_package_missing():
        pytest.skip("the grouped_gemm package is installed: upstream serves the flag")
    args = _args(moe_grouped_gemm=True)
    moe_fusion.mmp_validate_args(args, None)  # no GPU here: capability (0, 0) < 8
    assert args.moe_grouped_gemm is False  # hidden from Megatron-LM's assertion ...
    seen = []
    moe_fusion._validate_args(lambda a: seen.append(a.moe_grouped_gemm), None, (args,), {})
    assert seen == [False] and args.moe_grouped_gemm is True  # ... and back afterwards
    assert not hasattr(args, moe_fusion._HIDDEN)
