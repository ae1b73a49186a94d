"""--attn-recompute / --mlp-recompute / --recompute-variance on megatron-core (local spec), CPU.

Equivalence: for every flag and combination (attn, mlp, attn+mlp, each with and without
--recompute-variance, and --recompute-variance alone), dropout off and on, the per-step losses
and every parameter's gradient over 3 steps are bitwise equal to the run without recompute (fp32;
one bf16 layout too), in 1-rank and 2-rank layouts: TP2 (with linear biases), PP2 with virtual
stages, MoE with EP2 (shared expert with gate, distributed optimizer), MoE + MTP under PP2, MLA;
and together with upstream's selective recompute of the modules the flags do not cover.
Counters check that each flag recomputed what it promises
(tests/features/recompute/recompute_worker.py).

Memory: bytes held for backward per block of a layer (saved_tensors_hooks), per flag.
"""

import json

import pytest

from tests.conftest import run_probe, subprocess_env
from tests.harness.tiny_gpt import torchrun_json

pytestmark = pytest.mark.ranks

WORKER = "tests.features.recompute.recompute_worker"
COMBOS = ["attn", "mlp", "attn+mlp", "attn+variance", "mlp+variance", "attn+mlp+variance",
          "variance"]

MIXED = ["attn+upstream_mlp", "mlp+variance+upstream_core_attn", "variance+upstream_mlp"]

LAYOUTS = {
    "1rank": (1, ["--combos", ",".join(COMBOS + MIXED)]),
    "tp2-bias": (2, ["--tp", "2", "--bias"]),
    "pp2-vpp2": (2, ["--pp", "2", "--vpp", "2", "--layers", "4"]),
    "moe-ep2-shared-gate-distopt": (2, ["--experts", "4", "--ep", "2", "--shared-expert", "32",
                                        "--shared-gate", "--distributed-optimizer"]),
    "moe-mtp-pp2": (2, ["--experts", "4", "--dispatcher", "allgather", "--mtp", "1",
                        "--pp", "2", "--moe-layer-freq", "[0,1]"]),
    # --moe-grouped-gemm (GroupedMLP: variance skips its grouped fc2 GEMM) with the shared
    # expert overlapped with the dispatch (--mlp-recompute releases its activations)
    "moe-ep2-grouped-shared-overlap": (2, ["--experts", "4", "--ep", "2", "--shared-expert", "32",
                                           "--shared-gate", "--shared-overlap",
                                           "--grouped-gemm"]),
    "moe-grouped-bf16": (2, ["--experts", "4", "--ep", "2", "--shared-expert", "32",
                             "--shared-overlap", "--grouped-gemm", "--bf16",
                             "--combos", "mlp,mlp+variance,attn+mlp+variance"]),
    "mla": (1, ["--mla"]),
    "bf16": (1, ["--bf16", "--combos", "attn+mlp,attn+mlp+variance,variance"]),
}


def run_layout(name, tmp_path):
    nproc, flags = LAYOUTS[name]
    return torchrun_json(WORKER, tmp_path / f"{name}.json", *flags, nproc=nproc,
                         timeout=900)["results"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_combination_is_bitwise_equal_to_no_recompute(layout, tmp_path):
    results = run_layout(layout, tmp_path)
    combos = LAYOUTS[layout][1][LAYOUTS[layout][1].index("--combos") + 1].split(",") \
        if "--combos" in LAYOUTS[layout][1] else COMBOS
    assert sorted(results) == sorted(f"{c} dropout={d}" for c in combos for d in (0.0, 0.1))
    bad = {k: (v["max_abs_diff_rank0"], v["differing_on_rank0"], v["losses"], v["base_losses"])
           for k, v in results.items() if not (v["losses_equal"] and v["grads_equal"])}
    assert not bad, bad
    for key, res in results.items():
        ours = {part for part in key.split(" ")[0].split("+") if not part.startswith("upstream")}
        counts = res["counts"]
        blocks = ("attn" in ours) + ("mlp" in ours)
        variance = "variance" in ours
        assert (counts["block recompute"] > 0) == (blocks > 0), (key, counts)
        # variance: the last linear of every recomputed block skipped its forward...
        assert (counts["skipped linear forward"] > 0) == (variance and blocks > 0), (key, counts)
        if variance and blocks:
            assert counts["skipped linear forward"] >= counts["block recompute"], (key, counts)
        # ...and a norm output is recomputed in every block that is not
        assert (counts["norm recompute"] > 0) == (variance and blocks < 2 or (
            "mlp" in ours and "--experts" in LAYOUTS[layout][1])), (key, counts)
        # the overlapped shared expert's activations are released and recomputed with mlp
        assert (counts.get("released recompute", 0) > 0) == (
            "mlp" in ours and "--shared-overlap" in LAYOUTS[layout][1]), (key, counts)


MLA = ["--mla", "--q-lora-rank", "16", "--qk-layernorm"]
MOE = ["--experts", "4", "--ep", "2", "--shared-expert", "32"]
RMS_COMBOS = ["--combos", "mlp_rms,mlp_rms+variance,mt_all"]
#: MT-Megatron's RMSNorm variants (plugins recompute.mla_rms, recompute.mlp_rms); mt_all is
#: MT's DeepSeek-V2-236B set: --attn-recompute --mlp-recompute --recompute-variance
#: --mla-rms-recompute --mlp-rms-recompute --q-rms-recompute
RMS_LAYOUTS = {
    "mla-q-rms": (1, [*MLA, "--combos", "q_rms,q_rms+variance,attn+mla_rms+q_rms"]),
    "moe-mla-mlp-rms": (2, [*MOE, "--shared-gate", *MLA, *RMS_COMBOS]),
    "moe-mla-mlp-rms-grouped-overlap": (2, [*MOE, "--shared-overlap", "--grouped-gemm", *MLA,
                                            *RMS_COMBOS]),
}


@pytest.mark.parametrize("layout", list(RMS_LAYOUTS))
def test_rms_norm_variants_are_bitwise_equal_to_no_recompute(layout, tmp_path):
    LAYOUTS[layout] = RMS_LAYOUTS[layout]
    try:
        results = run_layout(layout, tmp_path)
    finally:
        del LAYOUTS[layout]
    flags = RMS_LAYOUTS[layout][1]
    combos = flags[flags.index("--combos") + 1].split(",")
    assert sorted(results) == sorted(f"{c} dropout={d}" for c in combos for d in (0.0, 0.1))
    bad = {k: (v["max_abs_diff_rank0"], v["differing_on_rank0"]) for k, v in results.items()
           if not (v["losses_equal"] and v["grads_equal"])}
    assert not bad, bad
    overlap = "--shared-overlap" in flags
    for key, res in results.items():
        combo, counts = key.split(" ")[0], res["counts"]
        if combo.startswith("q_rms"):  # the q/kv norm outputs, nothing checkpointed
            assert counts["norm recompute"] > 0 and counts["block recompute"] == 0, (key, counts)
        elif combo == "attn+mla_rms+q_rms":  # inside the attention checkpoint: nothing more
            assert counts["norm recompute"] == 0 and counts["block recompute"] > 0, (key, counts)
        elif combo.startswith("mlp_rms"):  # the pre-MLP norm output and the shared expert
            assert counts["norm recompute"] > 0, (key, counts)
            assert (counts["block recompute"] > 0) == (not overlap), (key, counts)
            assert (counts["released recompute"] > 0) == overlap, (key, counts)
        else:  # mt_all
            assert counts["block recompute"] > 0 and counts["skipped linear forward"] > 0


@pytest.fixture(scope="module")
def memory():
    proc = run_probe("tests.features.recompute.probes.block_memory",
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"), timeout=600)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(line[len("RESULT "):])


def test_attn_and_mlp_recompute_keep_only_the_block_input(memory):
    d = memory["dense"]
    block_input = d["none"]["input"]
    for setting in ("attn", "attn+variance", "attn+mlp", "attn+mlp+variance"):
        assert d[setting]["attention"] == block_input, setting
    for setting in ("mlp", "mlp+variance", "attn+mlp", "attn+mlp+variance"):
        assert d[setting]["mlp"] == block_input, setting
        assert d[setting]["mlp_widths"] == [memory["hidden"]], setting  # nothing ffn-wide
    # blocks not recomputed keep what they kept
    assert d["attn"]["mlp"] == d["none"]["mlp"] and d["mlp"]["attention"] == d["none"]["attention"]
    # per layer in a block of layers: two block inputs; upstream full recompute keeps one
    assert d["attn+mlp"]["per_layer"] == 2 * block_input
    assert d["upstream full"]["per_layer"] == block_input


def test_variance_drops_the_norm_outputs_and_saves_the_same_in_recomputed_blocks(memory):
    d, norm_out = memory["dense"], memory["norm_output"]
    assert d["variance"]["attention"] == d["none"]["attention"] - norm_out
    assert d["variance"]["mlp"] == d["none"]["mlp"] - norm_out
    assert d["attn+variance"]["mlp"] == d["none"]["mlp"] - norm_out
    assert d["mlp+variance"]["attention"] == d["none"]["attention"] - norm_out
    for base in ("attn", "mlp", "attn+mlp"):
        assert d[f"{base}+variance"]["per_layer"] <= d[base]["per_layer"]


def test_attn_plus_mlp_saves_at_least_80_percent_of_what_full_recompute_saves(memory):
    d = memory["dense"]
    full_saves = d["none"]["per_layer"] - d["upstream full"]["per_layer"]
    ours = d["none"]["per_layer"] - d["attn+mlp"]["per_layer"]
    assert ours >= 0.8 * full_saves, (ours, full_saves)


def test_moe_mlp_recompute_keeps_only_the_experts_input_not_the_dispatch(memory):
    m = memory["moe"]
    assert m["none"]["experts_held"] > m["none"]["experts_inputs"]
    for setting in ("mlp", "mlp+variance"):
        # the expert computation keeps its input (the dispatched tokens and probabilities)...
        assert m[setting]["experts_held"] == m[setting]["experts_inputs"], setting
        # ...the shared expert nothing (its input is the released norm output)
        assert m[setting]["shared_experts_held"] == 0, setting
        assert m[setting]["mlp"] < m["none"]["mlp"] - (m["none"]["experts_held"]
                                                       - m["none"]["experts_inputs"])


def test_overlapped_shared_expert_under_mlp_recompute_holds_what_the_checkpointed_one_does(
        memory):
    """--moe-shared-expert-overlap keeps the shared expert in the token dispatch; with
    --mlp-recompute its fc1 output and activation are released, so the MLP block holds exactly
    what it holds when the shared expert is checkpointed as a whole (no overlap)."""
    o, m = memory["moe_overlap"], memory["moe"]
    assert o["mlp"]["mlp"] < o["none"]["mlp"]
    assert o["mlp"]["mlp"] == m["mlp"]["mlp"], (o["mlp"]["mlp"], m["mlp"]["mlp"])
    assert o["none"]["mlp"] == m["none"]["mlp"]  # the overlap itself changes nothing held


def test_grouped_experts_keep_only_their_input_under_mlp_recompute(memory):
    g = memory["moe_grouped"]
    for setting in ("mlp", "mlp+variance"):
        assert g[setting]["experts_held"] == g[setting]["experts_inputs"], setting
        assert g[setting]["mlp"] < g["none"]["mlp"], setting


def test_mlp_rms_recompute_drops_the_norm_output_and_the_shared_experts_activations(memory):
    """--mlp-rms-recompute on a MoE layer: the shared expert holds nothing (checkpointed, its input
    is the released norm output), the routed experts keep what they keep without recompute."""
    m = memory["moe"]
    assert m["mlp_rms"]["shared_experts_held"] == 0 < m["none"]["shared_experts_held"]
    assert m["mlp_rms"]["experts_held"] == m["none"]["experts_held"]
    released = m["none"]["shared_experts_held"] + memory["norm_output"]
    assert m["mlp_rms"]["mlp"] <= m["none"]["mlp"] - released + memory["norm_output"], m
    assert m["mlp_rms"]["mlp"] < m["none"]["mlp"]
