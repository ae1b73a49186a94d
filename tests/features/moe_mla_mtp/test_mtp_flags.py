"""MT-Megatron's MTP spellings map onto upstream's flags; disagreeing spellings are errors."""

import types

import pytest

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.features.moe_mla_mtp import mtp_flags


def _args(**over):
    base = dict(use_multi_token_prediction=False, mtp_depth=None, mtp_coeff=None,
                mtp_num_layers=None, mtp_loss_scaling_factor=0.1)
    base.update(over)
    return types.SimpleNamespace(**base)


@pytest.mark.parametrize("over, layers, scale", [
    (dict(use_multi_token_prediction=True), 1, 0.1),
    (dict(use_multi_token_prediction=True, mtp_depth=2, mtp_coeff=0.3), 2, 0.3),
    (dict(mtp_depth=3), 3, 0.1),  # the depth alone switches MTP on
    (dict(use_multi_token_prediction=True, mtp_num_layers=2), 2, 0.1),
    (dict(mtp_depth=2, mtp_num_layers=2, mtp_coeff=0.2, mtp_loss_scaling_factor=0.2), 2, 0.2),
    (dict(), None, 0.1),  # nothing asked: upstream's settings untouched
])
def test_aliases_map_to_upstream(over, layers, scale):
    args = _args(**over)
    mtp_flags.mmp_validate_args(args=args)
    assert (args.mtp_num_layers, args.mtp_loss_scaling_factor) == (layers, scale)


@pytest.mark.parametrize("over, message", [
    (dict(mtp_depth=2, mtp_num_layers=3), "--mtp-depth 2 .* --mtp-num-layers 3"),
    (dict(use_multi_token_prediction=True, mtp_coeff=0.3, mtp_loss_scaling_factor=0.5),
     "--mtp-coeff 0.3 .* --mtp-loss-scaling-factor 0.5"),
    (dict(mtp_coeff=0.3), "MTP is off"),
    (dict(mtp_depth=0), "at least 1"),
])
def test_conflicts_name_both_spellings(over, message):
    with pytest.raises(ArgumentError, match=message):
        mtp_flags.mmp_validate_args(args=_args(**over))
