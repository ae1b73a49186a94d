"""Stock pretrain_gpt.py with --moe-permute-fusion and --moe-grouped-gemm on the local spec (no
TransformerEngine, no grouped_gemm package), EP2 on 2 CPU ranks. Needs MEGATRON_LM_PATH.

Upstream core_v0.16.1 fails on both flags here (ImportError of TE's fused permute when the
TransformerConfig is built; Megatron-LM's compute-capability assertion and GroupedMLP's
grouped_gemm assertion). fp32, dropout off, tolerance 1e-5 per iteration:

* --moe-permute-fusion changes no weight: the same run as without it.
* --moe-grouped-gemm selects GroupedMLP (0.16; from 0.17 the local spec builds SequentialMLP
  for it), whose weights are initialised in another layout than SequentialMLP's, so it cannot
  start from the same random weights: both continue from one checkpoint (2 iterations without
  the flags, torch_dist; GroupedMLP's sharded state dict maps onto SequentialMLP's) with a fresh
  optimizer (--no-load-optim: upstream's optimizer states do not map between the two), and
  iterations 3-4 must agree.
"""

import re

import pytest

from megatron_musa_patch.upstream import facts

from tests.harness.stock import GROUPED_MLP_SELECTED, assert_close, run_stock

pytestmark = pytest.mark.stock

MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
       "--moe-token-dispatcher-type", "alltoall", "--moe-aux-loss-coeff", "0.01",
       "--disable-bias-linear", "--swiglu", "--normalization", "RMSNorm",
       "--position-embedding-type", "rope"]
EP2 = [*MOE, "--expert-model-parallel-size", "2"]
FUSED = ["--moe-permute-fusion", "--moe-grouped-gemm"]


def test_permute_fusion_matches_unfused(lm_path):
    base = run_stock(lm_path, EP2, iters=4)[0]
    fused = run_stock(lm_path, [*EP2, "--moe-permute-fusion"], iters=4)[0]
    assert_close(fused, base)


def test_grouped_gemm_and_permute_fusion_continue_a_checkpoint_like_unfused(lm_path, tmp_path,
                                                                          release):
    ckpt = str(tmp_path / "ckpt")
    run_stock(lm_path, [*EP2, "--save", ckpt, "--save-interval", "2", "--exit-interval", "2"],
              iters=4)
    resume = ["--load", ckpt, "--no-load-optim"]
    base, _, base_log = run_stock(lm_path, [*EP2, *resume], iters=4)
    fused, _, log = run_stock(lm_path, [*EP2, *FUSED, *resume], iters=4)
    assert sorted(base) == [3, 4], base
    if facts.holds("local_spec_has_grouped_mlp", release.first):
        # the local spec warns when it selects GroupedMLP
        assert GROUPED_MLP_SELECTED in log and GROUPED_MLP_SELECTED not in base_log
    else:
        # no GroupedMLP on this release: its record is skipped (the table pads the status)
        assert re.search(r"^skipped +moe_fusion\.grouped_mlp_dtype ", log, re.M), log[-3000:]
    assert_close(fused, base)


def test_flags_of_the_switched_off_feature_fail_clearly(lm_path):
    for flag in FUSED:
        with pytest.raises(AssertionError) as failed:
            run_stock(lm_path, [*MOE, flag], iters=1, nproc=1,
                      env={"MEGATRON_MUSA_PATCH_DISABLE": "fused_ops.moe_fusion"})
        message = " ".join(str(failed.value).split())
        assert f"{flag} needs the feature 'fused_ops.moe_fusion'" in message, message[-1500:]
