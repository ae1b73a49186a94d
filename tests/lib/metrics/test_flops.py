"""FLOPs counts (megatron_musa_patch.lib.metrics.flops) against values worked out by hand, the peak table,
and the training-log fields of the throughput feature.

Per token and layer, forward: a GEMM m x k by k x n is 2mkn FLOPs; the causal core attention
sees seq/2 keys per query; training is 3x the forward.
"""

import json
import re
from types import SimpleNamespace

import pytest

from megatron_musa_patch.lib.metrics import flops
from megatron_musa_patch.features.logs import throughput
from megatron_musa_patch.lib.metrics.peak_flops import Peak, lookup, measure_matmul, training_dtype

from tests.conftest import run_probe, subprocess_env


def megatron_args(**overrides):
    """The fields of Megatron's args that FLOPs counts read (upstream's too)."""
    base = dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
        group_query_attention=False, num_query_groups=1, kv_channels=16, seq_length=32,
        padded_vocab_size=1024, swiglu=False, attention_output_gate=False,
        multi_latent_attention=False, q_lora_rank=None, kv_lora_rank=512, qk_head_dim=128,
        qk_pos_emb_head_dim=64, v_head_dim=128, num_experts=None, moe_router_topk=2,
        moe_ffn_hidden_size=None, moe_shared_expert_intermediate_size=None, moe_layer_freq=1,
        mtp_num_layers=None, is_hybrid_model=False, experimental_attention_variant=None,
        hybrid_override_pattern=None, moe_latent_size=None,
    )
    base.update(overrides)
    return SimpleNamespace(**base)


# name -> (args, batch, expected training FLOPs per iteration), each worked out by hand
DENSE = megatron_args()
# h=64, 4 heads of 16 (MHA), plain MLP 256, seq 32, vocab 1024, batch 2 -> 64 tokens
#   q,k,v: 2*64*(64+64+64) = 24576   out: 2*64*64 = 8192
#   core:  2*4*16*(32/2) * 2 = 4096   MLP: 2*64*256*2 = 65536
#   logits: 2*64*1024 = 131072
DENSE_EXPECTED = 3 * 64 * (2 * (24576 + 8192 + 4096 + 65536) + 131072)

GQA = megatron_args(num_layers=4, hidden_size=128, num_attention_heads=8,
                    group_query_attention=True, num_query_groups=2, kv_channels=16,
                    ffn_hidden_size=344, swiglu=True, seq_length=64, padded_vocab_size=2048)
# 8 query heads, 2 key/value groups of 16, SwiGLU 344, seq 64, vocab 2048, batch 4 -> 256 tokens
#   q,k,v: 2*128*(128+32+32) = 49152   out: 2*128*128 = 32768
#   core:  2*8*16*32 * 2 = 16384        SwiGLU: 2*128*344*3 = 264192
#   logits: 2*128*2048 = 524288
GQA_EXPECTED = 3 * 256 * (4 * (49152 + 32768 + 16384 + 264192) + 524288)

MOE = megatron_args(num_layers=4, hidden_size=64, ffn_hidden_size=128, swiglu=True,
                    num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=32,
                    moe_shared_expert_intermediate_size=64, moe_layer_freq=[0, 1, 1, 1],
                    seq_length=16, padded_vocab_size=512, mtp_num_layers=1)
# 1 dense + 3 MoE layers, 8 experts top-2 of 32, shared experts 64, one MTP depth, seq 16,
# vocab 512, batch 2 -> 32 tokens
#   attention per layer: 2*64*192 + 2*64*64 + 2*4*16*8*2 = 24576 + 8192 + 2048 = 34816
#   dense SwiGLU: 2*64*128*3 = 49152
#   MoE: routed 2*64*32*3*2 = 24576, shared 2*64*64*3 = 24576, router 2*64*8 = 1024 -> 50176
#   logits 2*64*512 = 65536
#   MTP depth (last layer is MoE): eh_proj 2*128*64 = 16384 + 34816 + 50176 + logits 65536
MOE_EXPECTED = 3 * 32 * (4 * 34816 + 49152 + 3 * 50176 + 65536
                         + (16384 + 34816 + 50176 + 65536))

MLA = megatron_args(num_layers=2, hidden_size=64, ffn_hidden_size=128, swiglu=True,
                    multi_latent_attention=True, q_lora_rank=32, kv_lora_rank=16,
                    qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16, seq_length=32,
                    padded_vocab_size=256)
# 4 heads; q: 64 -> 32 -> 4*(16+8); kv: 64 -> 16 (+8 rope key) -> 4*(16+16); seq 32; batch 1
#   q: 2*64*32 + 2*32*4*24 = 4096 + 6144     kv down: 2*64*(16+8) = 3072
#   kv up: 2*16*4*32 = 4096                  out: 2*4*16*64 = 8192
#   core: QK 2*4*24*16 = 3072, AV 2*4*16*16 = 2048
#   SwiGLU 2*64*128*3 = 49152                logits 2*64*256 = 32768
MLA_EXPECTED = 3 * 32 * (2 * (4096 + 6144 + 3072 + 4096 + 8192 + 3072 + 2048 + 49152) + 32768)

CASES = {"dense": (DENSE, 2, DENSE_EXPECTED), "gqa": (GQA, 4, GQA_EXPECTED),
         "moe": (MOE, 2, MOE_EXPECTED), "mla": (MLA, 1, MLA_EXPECTED)}


@pytest.mark.parametrize("name", list(CASES))
def test_training_flops_match_hand_count(name):
    args, batch, expected = CASES[name]
    assert flops.iteration_flops(args, batch) == expected


def test_hand_counts_are_the_numbers_written_out():
    # the expressions above, evaluated once by hand: a typo in one would show here
    assert (DENSE_EXPECTED, GQA_EXPECTED, MOE_EXPECTED, MLA_EXPECTED) == (
        64_487_424, 1_516_240_896, 54_853_632, 18_481_152)


def test_breakdown_names_each_part():
    parts = flops.training_flops(flops.ModelShape.from_args(MOE), 2)
    assert parts["MoE router"] == 3 * 32 * 3 * 1024
    assert parts["MTP projection"] == 3 * 32 * 16384
    assert parts["dense MLP"] == 3 * 32 * 49152
    assert sum(parts.values()) == MOE_EXPECTED


def test_mla_without_q_lora_projects_queries_directly():
    args = megatron_args(**{**vars(MLA), "q_lora_rank": None})
    # q: 2*64*4*24 = 12288 instead of 4096 + 6144
    assert flops.iteration_flops(args, 1) == MLA_EXPECTED + 3 * 32 * 2 * (12288 - 10240)


def test_group_query_attention_off_means_one_group_per_head():
    args = megatron_args(num_query_groups=2)  # ignored without --group-query-attention
    assert flops.iteration_flops(args, 2) == DENSE_EXPECTED
    assert args.num_query_groups == 2  # the count reads args; upstream's overwrites this


def test_moe_layer_freq_int_and_bad_list():
    assert flops.moe_layer_pattern(2, 4) == [1, 0, 1, 0]
    with pytest.raises(flops.UnsupportedModel):
        flops.moe_layer_pattern([0, 1], 4)
    with pytest.raises(flops.UnsupportedModel, match="hybrid"):
        flops.iteration_flops(megatron_args(is_hybrid_model=True), 1)


def test_against_upstream_num_floating_point_operations(lm_path):
    """Upstream's count (Megatron-LM core_v0.16.1 training.py) for the same args: the same for
    dense and GQA; for MoE it lacks the router and adds MTP norms (3h); for MLA it adds the
    q/kv RMSNorms (q_lora_rank + kv_lora_rank per layer)."""
    payload = {name: (vars(args), batch) for name, (args, batch, _) in CASES.items()}
    # later releases read more attributes (hybrid_layer_pattern, ...): the probe reads unset
    # ones as None, as Megatron-LM's parser leaves them without their flags
    proc = run_probe("tests.lib.metrics.probes.upstream_flops", json.dumps(payload),
                     env=subprocess_env(MEGATRON_LM_PATH=str(lm_path),
                                        MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    upstream = json.loads(proc.stdout.strip().splitlines()[-1])
    assert upstream["dense"] == DENSE_EXPECTED
    assert upstream["gqa"] == GQA_EXPECTED
    router, mtp_norms = 3 * 32 * 1024 * 4, 6 * 32 * 3 * 64  # 3 MoE layers + the MTP layer
    assert upstream["moe"] == MOE_EXPECTED - router + mtp_norms
    assert upstream["mla"] == MLA_EXPECTED + 6 * 32 * (32 + 16) * 2


# --------------------------------------------------------------------------- peaks


@pytest.mark.parametrize("name,dtype,tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H200", "bf16", 989.4), ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA A800-SXM4-80GB", "fp32", 19.5), ("MTT S4000", "bf16", 100.0),
    ("MTT S4000", "fp32", 25.0), ("MTT S5000", "bf16", 500.0),
])
def test_peak_table(name, dtype, tflops):
    peak, why = lookup(name, dtype)
    assert peak is not None and peak.tflops == tflops and not why


def test_peak_table_says_why_not():
    assert lookup("MTT S5000", "fp32") == (None, "no fp32 peak is known for MTT S5000")
    peak, why = lookup("CPU AMD EPYC 7B13", "fp32")
    assert peak is None and "not in the peak table" in why


def test_training_dtype():
    assert training_dtype(SimpleNamespace(fp8="hybrid", bf16=True)) == "fp8"
    assert training_dtype(SimpleNamespace(fp8=None, bf16=True, fp16=False)) == "bf16"
    assert training_dtype(SimpleNamespace(fp8=None, bf16=False, fp16=False)) == "fp32"


def test_cpu_matmul_benchmark_measures_something():
    peak = measure_matmul("fp32", seconds=0.1, size=128)
    assert 1e-4 < peak.tflops < 100 and peak.source.startswith("measured")


# --------------------------------------------------------------------------- the log line

LINE = (" [2026-01-01 00:00:00.000000] iteration        3/      10 | consumed samples:           24"
        " | elapsed time per iteration (ms): 250.0 | learning rate: 1.0E-03 | global batch size:"
        "     2 | lm loss: 6.9E+00 |")


def test_log_line_gets_tokens_per_second_and_mfu():
    args = megatron_args(world_size=2)
    out = throughput.extend_log_line(LINE, args, Peak(0.5, "fp32", "test"))
    # 2 sequences of 32 tokens in 0.25 s over 2 devices; DENSE_EXPECTED FLOPs per iteration
    per_device_tflops = DENSE_EXPECTED / 0.25 / 2 / 1e12
    assert "elapsed time per iteration (ms): 250.0 | tokens/s/device: 128 |" in out
    shown = re.search(r"model TFLOP/s/device: ([0-9.]+) \|", out).group(1)
    assert float(shown) == pytest.approx(per_device_tflops, rel=5e-4), out  # 4 digits
    assert len(shown.replace(".", "").lstrip("0")) <= 4, out
    mfu = re.search(r"MFU: ([0-9.]+)% \|", out).group(1)
    assert float(mfu) == pytest.approx(100 * per_device_tflops / 0.5, rel=5e-3), out  # 3 digits
    assert out.endswith("lm loss: 6.9E+00 |")


def test_log_line_without_peak_and_other_messages():
    out = throughput.extend_log_line(LINE, megatron_args(world_size=1), None)
    assert "tokens/s/device: 256 |" in out and "MFU: n/a |" in out
    other = "-" * 20
    assert throughput.extend_log_line(other, megatron_args(world_size=1), None) is other


def test_device_peak_flag_must_be_positive():
    from megatron_musa_patch.base.errors import ArgumentError

    with pytest.raises(ArgumentError, match="--device-peak-tflops must be a positive number"):
        throughput.mmp_validate_args(args=SimpleNamespace(device_peak_tflops=-1.0))
    # unset: nothing to check (and the layer need not be active)
    throughput.mmp_validate_args(args=SimpleNamespace(device_peak_tflops=None))


def test_log_line_figures_stay_in_decimal_notation():
    """Very fast and very slow iterations: every figure in plain decimal notation, to 4
    significant digits (3 for MFU); `.4g` printed 6.449e+04 and 6.449e-11 TFLOP/s here."""
    for ms, seconds in (("0.000001", 1e-9), ("1000000000.0", 1e6)):
        line = LINE.replace("(ms): 250.0", f"(ms): {ms}")
        out = throughput.extend_log_line(line, megatron_args(world_size=1), Peak(0.5, "fp32", "t"))
        fields = dict(re.findall(r"(tokens/s/device|model TFLOP/s/device|MFU): ([^ ]+) \|", out))
        assert not any("e" in v for v in fields.values()), out
        tflops = DENSE_EXPECTED / seconds / 1e12
        assert float(fields["tokens/s/device"]) == pytest.approx(64 / seconds, rel=5e-4)
        assert float(fields["model TFLOP/s/device"]) == pytest.approx(tflops, rel=5e-4)
        assert float(fields["MFU"].rstrip("%")) == pytest.approx(200 * tflops, rel=5e-3)


def test_startup_line_of_a_large_model():
    """A 70B-class model's FLOPs per iteration (about 1.8e6 TFLOP) and a peak, as read."""
    args = megatron_args(num_layers=80, hidden_size=8192, ffn_hidden_size=28672,
                         num_attention_heads=64, group_query_attention=True, num_query_groups=8,
                         kv_channels=128, seq_length=4096, padded_vocab_size=128256, swiglu=True,
                         global_batch_size=1024)
    line = throughput._startup_line(args, Peak(989.4, "bf16", "NVIDIA H100 datasheet"), "")
    expected = flops.iteration_flops(args, 1024) / 1e12
    shown = re.search(r"model FLOPs per iteration \(global batch 1024\) ([^ ]+) TFLOP", line)
    assert shown and float(shown.group(1)) == pytest.approx(expected, rel=5e-4), line
    assert expected > 1e6 and "e+" not in line, line
    assert line.endswith("; device peak 989.4 TFLOP/s (bf16, NVIDIA H100 datasheet)")
