"""--use-flash-attn, --moe-permute-fusion and --moe-grouped-gemm on megatron-core, 2 CPU ranks.

The selftest's tiny GPT (local spec, fp32, dropout off, GQA, seq 30) trained 4 steps per run
from the same weights and batches (tests/features/fusion_worker.py):

* dense and MLA (key/value head dims 24/16), DP2: SDPA core attention against upstream's
  unfused local attention. Tolerance 1e-5 per step: the flash CPU kernel sums in another order
  (measured: at most ~1e-6).
* MoE, 4 experts top-2, EP2, alltoall and allgather dispatchers: the fused permute and the
  grouped GEMM (GroupedMLP with weights converted from the SequentialMLP ones) against the
  non-fused SequentialMLP run. Tolerance 1e-5 (measured: bitwise equal; the permute is
  bitwise by construction, torch's grouped_mm equals the per-expert matmuls on CPU).
"""

import math

import pytest

from tests.harness.tiny_gpt import max_abs_diff, torchrun_json

pytestmark = pytest.mark.ranks

WORKER = "tests.features.fusion_worker"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fusions") / "result.json"
    return torchrun_json(WORKER, out, timeout=600)["results"]


def worst(a, b):
    return max_abs_diff(a, b, length=4)


@pytest.mark.parametrize("base,run", [("unfused", "flash"), ("mla", "mla+flash")])
def test_flash_attention_matches_unfused(results, base, run):
    base, flash = results[base], results[run]
    assert base["losses"][-1] < base["losses"][0] - 0.5  # it learns
    assert "sdpa_attention" not in base["calls"]
    assert flash["calls"].get("sdpa_attention", 0) > 0  # the SDPA path ran
    assert worst(flash["losses"], base["losses"]) <= TOLERANCE, (flash, base)


def test_flash_attention_dropout_trains(results):
    run, flash = results["flash+dropout"]["losses"], results["flash"]["losses"]
    assert all(math.isfinite(x) for x in run) and run[-1] < run[0] - 0.5
    assert worst(run, flash) > 1e-4  # the dropout is applied


@pytest.mark.parametrize("run,base", [("moe+permute", "moe"), ("moe+permute+gg", "moe"),
                                      ("moe-allgather+permute+gg", "moe-allgather")])
def test_moe_fusions_match_unfused(results, run, base, release):
    fused, ref = results[run], results[base]
    assert ref["experts"] == ["SequentialMLP"] and ref["losses"][-1] < ref["losses"][0]
    assert not ref["calls"]
    assert fused["calls"].get("permute", 0) > 0 and fused["calls"].get("unpermute", 0) > 0
    if run.endswith("+gg") and release.series == "0.16":
        assert fused["experts"] == ["GroupedMLP"] and fused["calls"].get("gmm", 0) > 0
    elif run.endswith("+gg"):  # upstream removed GroupedMLP in 0.17: the local spec's experts
        assert fused["experts"] == ["SequentialMLP"] and not fused["calls"].get("gmm")
    if run == "moe+permute":  # 2 local experts per rank: the chunk sort is fused too
        assert fused["calls"].get("sort_chunks_by_index", 0) > 0
    assert worst(fused["losses"], ref["losses"]) <= TOLERANCE, (run, fused, ref)
