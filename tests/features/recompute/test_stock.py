"""--attn-recompute / --mlp-recompute / --recompute-variance in the stock pretrain_gpt.py
(core_v0.16.1, unmodified) on 2 CPU ranks, dropout on, fp32: every run is bitwise equal to the same
run without the flags -- the full-precision loss, the gradient norm and a hash of every parameter's
gradient and value after each step (tests/features/recompute/recompute_probe.py), per rank -- and
the counters show the recompute ran. Needs MEGATRON_LM_PATH."""

import re
from pathlib import Path

import pytest

from tests.harness.stock import assert_grouped_experts, run_stock

pytestmark = pytest.mark.stock

PROBE = {"MEGATRON_MUSA_PATCH_PLUGINS": "recompute_probe",
         "PYTHONPATH": str(Path(__file__).resolve().parent)}
DROPOUT = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1"]
LINE = re.compile(r"recompute_probe rank=(\d+) losses=(\{.*?\}) grad_norm=(\S+) grads=(\w+) "
                  r"params=(\w+) blocks=(\d+) variance_blocks=(\d+) norms=(\d+)")
ITERS = 3

TP2 = ["--tensor-model-parallel-size", "2", *DROPOUT]
PP2_VPP = ["--pipeline-model-parallel-size", "2", "--num-layers", "4",
           "--num-layers-per-virtual-pipeline-stage", "1", "--use-distributed-optimizer", *DROPOUT]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-token-dispatcher-type", "alltoall",
       "--expert-model-parallel-size", "2", "--moe-aux-loss-coeff", "0.01",
       "--moe-ffn-hidden-size", "96", "--moe-shared-expert-intermediate-size", "64",
       "--disable-bias-linear", *DROPOUT]
ALL = ["--attn-recompute", "--mlp-recompute", "--recompute-variance"]


def probe(lm_path, args):
    """Per (rank, step): (loss, grad norm, gradient hash, parameter hash); recompute counters."""
    losses, _, log = run_stock(lm_path, args, iters=ITERS, env=PROBE)
    steps, counts = {}, {"blocks": 0, "variance_blocks": 0, "norms": 0}
    for rank, loss, norm, grads, params, b, vb, n in LINE.findall(log):
        step = sum(1 for key in steps if key[0] == int(rank)) + 1
        steps[(int(rank), step)] = (loss, norm, grads, params)
        counts = {k: max(counts[k], int(v)) for k, v in
                  (("blocks", b), ("variance_blocks", vb), ("norms", n))}
    assert len(steps) == 2 * ITERS, log[-3000:]
    return steps, counts, log


@pytest.fixture(scope="module")
def baseline(lm_path):
    cache = {}

    def get(name, args):
        if name not in cache:
            cache[name] = probe(lm_path, args)
        return cache[name]

    return get


@pytest.mark.parametrize("flags", [pytest.param(ALL, marks=pytest.mark.ci),
                                   ["--attn-recompute", "--recompute-variance"],
                                   ["--mlp-recompute"], ["--recompute-variance"]],
                         ids=["all", "attn+variance", "mlp", "variance"])
def test_tp2_bitwise_equal_to_no_recompute(lm_path, baseline, flags):
    ref, ref_counts, _ = baseline("tp2", TP2)
    assert ref_counts == {"blocks": 0, "variance_blocks": 0, "norms": 0}
    steps, counts, log = probe(lm_path, [*TP2, *flags])
    assert steps == ref
    blocks = ("--attn-recompute" in flags) + ("--mlp-recompute" in flags)
    variance = "--recompute-variance" in flags
    assert (counts["blocks"] > 0) == (blocks > 0 and not variance), counts
    assert (counts["variance_blocks"] > 0) == (blocks > 0 and variance), counts
    assert (counts["norms"] > 0) == (variance and blocks < 2), counts
    for flag in ("attn_recompute", "mlp_recompute", "recompute_variance"):
        on = f"--{flag.replace('_', '-')}" in flags
        assert re.search(rf"{flag} \.+ {on}", log), flag


def test_pp2_virtual_stages_distributed_optimizer_bitwise(lm_path, baseline):
    ref, _, _ = baseline("pp2-vpp", PP2_VPP)
    steps, counts, _ = probe(lm_path, [*PP2_VPP, *ALL])
    assert steps == ref and counts["variance_blocks"] > 0


def test_moe_expert_parallel_with_shared_experts_bitwise(lm_path, baseline):
    ref, _, _ = baseline("moe", MOE)
    steps, counts, log = probe(lm_path, [*MOE, *ALL])
    assert steps == ref and counts["variance_blocks"] > 0
    assert "load_balancing_loss" in log


MOE_GROUPED_OVERLAP = [*MOE, "--moe-grouped-gemm", "--moe-shared-expert-overlap"]
#: MT-Megatron's scripts: upstream's full granularity that recomputes no layer, beside the flags
FULL_BLOCK_0 = ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", "0"]


def test_grouped_experts_and_overlapped_shared_expert_bitwise(lm_path, baseline, release):
    """--moe-grouped-gemm (the grouped fc2 GEMM skipped in the variance recompute) and
    --moe-shared-expert-overlap (its activations released under --mlp-recompute), with
    --mlp-rms-recompute and full/block/0 granularity as MT-Megatron's scripts pass them."""
    ref, _, _ = baseline("moe-grouped-overlap", MOE_GROUPED_OVERLAP)
    steps, counts, log = probe(lm_path, [*MOE_GROUPED_OVERLAP, *ALL, "--mlp-rms-recompute",
                                         *FULL_BLOCK_0])
    assert steps == ref and counts["variance_blocks"] > 0
    assert_grouped_experts(log, release)
    assert re.search(r"recompute_granularity \.+ full", log)


@pytest.mark.parametrize("extra,expected", [
    (["--attn-recompute", "--recompute-granularity", "full", "--recompute-method", "uniform",
      "--recompute-num-layers", "1"],
     "--attn-recompute cannot be combined with --recompute-granularity full"),
    (["--mlp-recompute", "--recompute-granularity", "selective", "--recompute-modules", "mlp"],
     "--mlp-recompute already recomputes the whole MLP block"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform",
      "--recompute-num-layers", "0"],
     "--recompute-granularity full --recompute-method uniform --recompute-num-layers 0 never "
     "ends"),
], ids=["full", "mlp-twice", "uniform-0"])
def test_conflicts_stop_with_one_paragraph(lm_path, extra, expected):
    with pytest.raises(AssertionError) as failed:
        run_stock(lm_path, extra, iters=1)
    message = " ".join(str(failed.value).split())
    assert f"megatron_musa_patch: error: {expected}" in message, message[-2000:]
