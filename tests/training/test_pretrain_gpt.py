"""The stock Megatron-LM pretrain_gpt.py (core_v0.16.1), unmodified, on 2 CPU ranks.

Needs MEGATRON_LM_PATH. Every layout starts from the same weights (--use-cpu-initialization,
dropout off) and sees the same batches, so its fp32 losses must match the 1-rank run of the same
model; where upstream seeds differ per layout (pipeline stages), the three activation routes
must agree exactly instead.
"""

import math
import re
from pathlib import Path

import pytest

from tests.harness.stock import assert_close, run_stock, write_bin_idx

pytestmark = pytest.mark.stock

def assert_finite(losses, iters):
    assert len(losses) == iters and all(math.isfinite(v) and 0 < v < 20 for v in losses.values())


@pytest.fixture(scope="module")
def reference(lm_path):
    """1-rank fp32 runs, computed once per model variant."""
    cache = {}

    def get(*args):
        if args not in cache:
            cache[args] = run_stock(lm_path, list(args), nproc=1)[0]
        return cache[args]

    return get


@pytest.mark.ci
def test_tp2_matches_one_rank(lm_path, reference):
    losses, _, log = run_stock(lm_path, ["--tensor-model-parallel-size", "2"])
    assert_close(losses, reference())
    assert "tensor-model-parallel size: 2" in log
    assert "patches:" in log and " 0 failed" in log  # the rank-0 patch table


@pytest.mark.ci
def test_dp2_distributed_optimizer_matches_one_rank(lm_path, reference):
    losses, _, log = run_stock(lm_path, ["--use-distributed-optimizer"])
    assert "data-parallel size: 2" in log
    assert_close(losses, reference())


@pytest.mark.ci
def test_pp2_is_identical_through_all_three_activation_routes(lm_path):
    args = ["--pipeline-model-parallel-size", "2"]
    runs = {route: run_stock(lm_path, args, route=route)[0] for route in ("mmp", "pth", "import")}
    assert_finite(runs["mmp"], 4)
    assert runs["mmp"] == runs["pth"] == runs["import"], runs


def test_pp2_with_virtual_stages(lm_path):
    args = ["--pipeline-model-parallel-size", "2", "--num-layers", "4",
            "--num-layers-per-virtual-pipeline-stage", "1"]
    losses, _, log = run_stock(lm_path, args)
    assert_finite(losses, 4)
    assert "Number of virtual stages per pipeline stage: 2" in log


def test_bf16_tp2_tracks_fp32(lm_path, reference):
    losses, _, _ = run_stock(lm_path, ["--bf16", "--tensor-model-parallel-size", "2"])
    assert_close(losses, reference(), tol=2e-2)


def test_full_recompute_matches_no_recompute(lm_path, reference):
    args = ["--tensor-model-parallel-size", "2", "--recompute-granularity", "full",
            "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    losses, _, _ = run_stock(lm_path, args)
    assert_close(losses, reference())


GQA = ("--group-query-attention", "--num-query-groups", "2", "--qk-layernorm",
       "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
       "--disable-bias-linear", "--untie-embeddings-and-output-weights")


def test_gqa_with_qk_layernorm_tp2_matches_one_rank(lm_path, reference):
    losses, _, _ = run_stock(lm_path, [*GQA, "--tensor-model-parallel-size", "2"])
    assert_close(losses, reference(*GQA))


MOE = ("--num-experts", "4", "--moe-router-topk", "2", "--moe-token-dispatcher-type",
       "allgather", "--moe-aux-loss-coeff", "0.01", "--moe-ffn-hidden-size", "96",
       "--disable-bias-linear")


def test_moe_allgather_dp2_matches_one_rank(lm_path, reference):
    # (MoE with TP needs sequence parallelism, which the local spec gets with fused kernels)
    losses, _, log = run_stock(lm_path, list(MOE))
    assert_close(losses, reference(*MOE))
    assert "load_balancing_loss" in log


def test_moe_expert_parallel_alltoall_matches_allgather(lm_path):
    """EP2: the alltoall dispatcher (whose split sizes pass an .is_cuda gate) must route the
    same tokens to the same experts as allgather."""
    ep2 = [*MOE, "--expert-model-parallel-size", "2"]
    allgather, _, log = run_stock(lm_path, ep2)
    assert_finite(allgather, 4)
    assert "load_balancing_loss" in log
    alltoall_args = [a if a != "allgather" else "alltoall" for a in ep2]
    alltoall, _, _ = run_stock(lm_path, alltoall_args)
    assert_close(alltoall, allgather)


@pytest.fixture(scope="module")
def bin_idx(tmp_path_factory):
    return write_bin_idx(tmp_path_factory.mktemp("data") / "corpus_text_document", seed=0)


def test_real_bin_idx_data_tp2_matches_one_rank(lm_path, reference, bin_idx, tmp_path):
    data = ("--data-path", str(bin_idx), "--split", "100,0,0",
            "--data-cache-path", str(tmp_path / "cache"))
    one = run_stock(lm_path, list(data), nproc=1)[0]
    losses, _, log = run_stock(lm_path, [*data, "--tensor-model-parallel-size", "2"])
    assert_close(losses, one)
    assert "MockGPTDataset" not in log and one != reference()


@pytest.mark.parametrize("layout", [["--tensor-model-parallel-size", "2"],
                                    ["--use-distributed-optimizer"]], ids=["tp2", "dp2-distopt"])
def test_save_then_load_resumes_at_the_saved_iteration(lm_path, tmp_path, layout):
    continuous = run_stock(lm_path, layout, iters=4)[0]
    ckpt = ["--save", str(tmp_path / "ckpt"), "--save-interval", "2"]
    # the first job stops at iteration 2 (checkpointing as it exits), as an interrupted job would
    first, _, _ = run_stock(lm_path, [*layout, *ckpt, "--exit-interval", "2"], iters=4)
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    resumed, _, log = run_stock(lm_path, [*layout, *ckpt, "--load", str(tmp_path / "ckpt")],
                                iters=4)
    assert re.search(r"successfully loaded checkpoint from .* at iteration 2", log), log[-3000:]
    assert sorted(resumed) == [3, 4]
    assert_close(first, {i: continuous[i] for i in (1, 2)})
    # with upstream_fixes.log_loss_reset every line is its iteration's loss, so the resumed
    # curve is the continuous one line for line (tests/features/upstream_fixes/
    # test_log_loss_reset.py shows upstream's second line, the mean of two iterations)
    assert_close(resumed, {3: continuous[3], 4: continuous[4]})


def test_plugin_argument_group_and_validation_run_inside_megatron(lm_path):
    """An external plugin (tests/fixtures/plugins/flag_plugin.py) adds a flag to Megatron's own
    parser and checks it before Megatron's validation; --distributed-backend takes mccl."""
    plugin = {"MEGATRON_MUSA_PATCH_PLUGINS": "flag_plugin",
              "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "fixtures" / "plugins")}
    losses, _, log = run_stock(lm_path, ["--demo-level", "3", "--distributed-backend", "mccl"],
                               iters=2, env=plugin)
    assert_finite(losses, 2)
    assert re.search(r"demo_level \.+ 3", log) and re.search(r"distributed_backend \.+ mccl", log)
    assert "flag_demo: TransformerConfig.demo_level=3" in log
    assert "flag_demo: OptimizerConfig.demo_level=3" in log
    with pytest.raises(AssertionError) as failed:
        run_stock(lm_path, ["--demo-level", "-1"], iters=2, env=plugin)
    message = " ".join(str(failed.value).split())
    assert "megatron_musa_patch: error: --demo-level must be >= 0" in message
