"""Stock pretrain_gpt.py with --use-flash-attn on the local spec, 2 CPU ranks. Needs
MEGATRON_LM_PATH.

Upstream core_v0.16.1 ignores --use-flash-attn on --transformer-impl local (only the legacy model
reads it); with the layer, core attention runs through scaled_dot_product_attention. fp32,
dropout off: the losses must match the run without the flag within 1e-5 per iteration (the CPU
flash kernel sums in another order).
"""

import math

import pytest

from megatron_musa_patch.features.fused_ops.flash_attention import ANNOUNCEMENT

from tests.harness.stock import assert_close, run_stock

pytestmark = pytest.mark.stock

GQA = ["--group-query-attention", "--num-query-groups", "2"]


@pytest.mark.parametrize("model", [[], GQA], ids=["mha", "gqa"])
def test_flash_attention_matches_unfused(lm_path, model):
    base, _, base_log = run_stock(lm_path, model, iters=4)
    flash, _, log = run_stock(lm_path, [*model, "--use-flash-attn"], iters=4)
    assert ANNOUNCEMENT in log and ANNOUNCEMENT not in base_log
    assert_close(flash, base)


def test_flash_attention_with_attention_dropout_trains(lm_path):
    losses, _, _ = run_stock(lm_path, [*GQA, "--use-flash-attn", "--attention-dropout", "0.1",
                                       "--lr", "3e-3"], iters=6)
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses.values())
    assert losses[6] < losses[1], losses


def test_flag_of_the_switched_off_feature_fails_clearly(lm_path):
    with pytest.raises(AssertionError) as failed:
        run_stock(lm_path, ["--use-flash-attn"], iters=1, nproc=1,  # one rank: an unmixed log
                  env={"MEGATRON_MUSA_PATCH_DISABLE": "fused_ops.flash_attention"})
    message = " ".join(str(failed.value).split())
    assert ("--use-flash-attn needs the feature 'fused_ops.flash_attention' (with --transformer-impl local: "
            "upstream's local attention has no flash path and would ignore the flag), which is "
            "switched off") in message
