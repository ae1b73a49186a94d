"""Exact resume of the stock pretrain_gpt.py (core_v0.16.1, unmodified) on 2 CPU ranks, fp32,
dropout on: 4 steps in one run give, bit for bit, the losses and parameters of 2 steps, --save, a
new process, --load, 2 more -- in each layout, in both checkpoint formats (megatron-core's
distributed ``torch_dist``, the default, and the legacy ``torch``), on real .bin/.idx data (whose
position resumes too) and with the CPU-offload optimizer.

Exact values come from tests/fixtures/plugins/reliability_probe.py (every rank prints the
full-precision loss and a hash of its parameters after each step); Megatron's log rounds losses.
Needs MEGATRON_LM_PATH.
"""

import re

import pytest

from tests.harness.stock import PROBE, probe_steps, run_stock, write_bin_idx

pytestmark = pytest.mark.stock

CONSUMED = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?consumed samples:\s+(\d+)")
DROPOUT = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1"]
ITERS, HALF = 4, 2

LAYOUTS = {
    "dp2-distopt": ["--use-distributed-optimizer"],
    "tp2": ["--tensor-model-parallel-size", "2"],
    "pp2": ["--pipeline-model-parallel-size", "2"],
    # experts split unlike the dense layers (upstream_fixes marks them for the expert-DP reduce)
    "moe-tp2-etp1": ["--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear",
                     "--tensor-model-parallel-size", "2", "--sequence-parallel",
                     "--expert-tensor-parallel-size", "1", "--use-distributed-optimizer"],
}
FORMATS = {"torch_dist": [], "torch": ["--ckpt-format", "torch"]}
# megatron-core's HybridDeviceOptimizer made to work off CUDA (features/offload/cpu_offload.py)
OFFLOAD = ["--use-distributed-optimizer", "--use-precision-aware-optimizer",
           "--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5"]


def run(lm_path, args, **kw):
    _, _, log = run_stock(lm_path, [*DROPOUT, *args], iters=ITERS, env=PROBE, **kw)
    return probe_steps(log), log


@pytest.fixture(scope="module")
def continuous(lm_path):
    """The uninterrupted run of each layout (the checkpoint format does not change training)."""
    cache = {}

    def get(name, args):
        if name not in cache:
            cache[name] = run(lm_path, args)
        return cache[name]

    return get


def save_and_resume(lm_path, tmp_path, args):
    """HALF steps then exit with a checkpoint; a new job loads it and runs to ITERS."""
    ckpt = ["--save", str(tmp_path / "ckpt"), "--save-interval", str(HALF)]
    first, _ = run(lm_path, [*args, *ckpt, "--exit-interval", str(HALF)])
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == str(HALF)
    second, log = run(lm_path, [*args, *ckpt, "--load", str(tmp_path / "ckpt")])
    assert re.search(rf"successfully loaded checkpoint from .* at iteration {HALF}", log), \
        log[-3000:]
    return first, second, log


def assert_bitwise_resume(reference, first, second):
    ranks = sorted({rank for rank, _ in reference})
    assert ranks == [0, 1] and len(reference) == 2 * ITERS, reference
    assert sorted(first) == [(r, i) for r in ranks for i in range(1, HALF + 1)], first
    assert sorted(second) == [(r, i) for r in ranks for i in range(HALF + 1, ITERS + 1)], second
    resumed = {**first, **second}
    diff = {k: (reference[k], resumed[k]) for k in reference if reference[k] != resumed[k]}
    assert not diff, f"resumed run differs from the uninterrupted one: {diff}"


# the legacy format cannot hold experts split unlike the dense layers: refused at validation
# (docs/bad_inputs.md row 48)
CASES = [(layout, fmt) for layout in LAYOUTS for fmt in FORMATS
         if not (layout.startswith("moe") and fmt == "torch")]


@pytest.mark.parametrize("layout,fmt", CASES)
def test_resume_is_bitwise(lm_path, tmp_path, continuous, layout, fmt):
    reference, _ = continuous(layout, LAYOUTS[layout])
    first, second, log = save_and_resume(lm_path, tmp_path, [*LAYOUTS[layout], *FORMATS[fmt]])
    assert f"in {fmt} format" in log  # Megatron-LM's "saving checkpoint ... in X format"
    assert_bitwise_resume(reference, first, second)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_bin_idx(tmp_path_factory.mktemp("data") / "corpus_text_document", seed=3)


def test_resume_on_real_data_continues_at_the_data_position(lm_path, tmp_path, corpus,
                                                            continuous):
    data = ["--data-path", str(corpus), "--split", "100,0,0",
            "--data-cache-path", str(tmp_path / "cache"), "--use-distributed-optimizer"]
    reference, log = continuous("real-data", data)
    assert "MockGPTDataset" not in log
    first, second, resumed_log = save_and_resume(lm_path, tmp_path, data)
    assert_bitwise_resume(reference, first, second)
    # the resumed job starts at the samples the first one had not consumed
    consumed = {int(i): int(n) for i, n in CONSUMED.findall(resumed_log)}
    assert consumed == {HALF + 1: 8 * (HALF + 1), ITERS: 8 * ITERS}, consumed


@pytest.mark.parametrize("fmt", FORMATS)
def test_resume_with_optimizer_cpu_offload_is_bitwise(lm_path, tmp_path, continuous, fmt):
    """Issue 5's --optimizer-cpu-offload (half the parameters stepped on the host): the host
    optimizer's state is checkpointed and restored exactly."""
    reference, _ = continuous("offload", OFFLOAD)
    first, second, _ = save_and_resume(lm_path, tmp_path, [*OFFLOAD, *FORMATS[fmt]])
    assert_bitwise_resume(reference, first, second)
