"""Scripts written for MT-Megatron, unchanged but for the launch, through the stock pretrain_gpt.py
(core_v0.16.1) on 2 CPU ranks (issue 19). Needs MEGATRON_LM_PATH.

* The seed tutorial's ("MT-Megatron 入门") full flag set -- every group: model, MoE (grouped
  GEMM, device-level capacity and losses), MLA + MTP, training (full/block/0 granularity,
  overlapped shared expert, virtual pipeline stages, first/last stage layers,
  --wait-after-ckpt, --tp-comm-overlap), offload, MT's fine-grained recompute, regularization,
  schedule, parallelism, bf16 -- at toy sizes, on real .bin/.idx shards (`mmp data prepare`)
  blended into a weighted DATA_PATH (`mmp data blend`) with a trained HuggingFace tokenizer.
* An MT-MegatronLM DeepSeek-V2-Lite script (examples/mt_megatron/run_pretrain_deepseekv2_lite.sh:
  MT's arrays and exports, MT's own router and RMSNorm-recompute flags) at toy sizes with TP2
  and --sequence-parallel; as MT ships it (--transformer-impl transformer_engine) it stops with
  the layer's one paragraph, exit status non-zero, no traceback.
"""

import math
import os
import re
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO, subprocess_env
from tests.harness.stock import LOSS, assert_grouped_experts, mmp_executable, write_bin_idx

pytestmark = pytest.mark.stock

MMP = mmp_executable()


def mmp_data(*argv):
    proc = subprocess.run([MMP, "data", *map(str, argv)], env=subprocess_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def blended(tmp_path_factory):
    """A byte-level BPE tokenizer trained offline, two .bin/.idx shards, the weighted list."""
    from tests.data.mmp_data_helpers import make_docs, write_jsonl

    root = tmp_path_factory.mktemp("seed-data")
    inputs = [root / "wiki.jsonl", root / "code.jsonl"]
    write_jsonl(inputs[0], make_docs(300, seed=1, empties=False))
    write_jsonl(inputs[1], make_docs(200, seed=2, empties=False))
    mmp_data("train-tokenizer", "--input", *inputs, "--output-dir", root / "tok",
             "--vocab-size", "800", "--min-frequency", "1")
    mmp_data("prepare", "--input", *inputs, "--output-dir", root / "data",
             "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", root / "tok",
             "--append-eod", "--workers", "1")
    data_path = mmp_data("blend", root / "data")
    weights = data_path.split()[::2]
    assert len(weights) == 2 and all(w.isdigit() for w in weights), data_path
    return data_path.split(), root / "tok"


def seed_groups(data_path, tokenizer, save, iters):
    """The tutorial's argument groups, in its order and spelling, at toy sizes (TP1 x PP2 on 2
    ranks: the pipeline flags need PP; EP1). With its 2 first-stage layers and 2-layer virtual
    stages each rank holds one virtual stage (an interleaved schedule with
    --no-overlap-p2p-communication would need 3 pipeline stages: Megatron-LM's rule).
    --train-samples is marked "not enabled" there."""
    return {
        "MODEL_ARGS": ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                       "--seq-length", "64", "--max-position-embeddings", "64",
                       "--norm-epsilon", "1e-6", "--attention-dropout", "0.0",
                       "--hidden-dropout", "0.0", "--disable-bias-linear", "--vocab-size", "1024",
                       "--ffn-hidden-size", "128", "--position-embedding-type", "rope",
                       "--no-position-embedding", "--swiglu", "--normalization", "RMSNorm",
                       "--untie-embeddings-and-output-weights"],
        "MOE_ARGS": ["--num-experts", "4", "--expert-model-parallel-size", "1",
                     "--moe-token-dispatcher-type", "alltoall",
                     "--moe-router-score-function", "softmax", "--moe-router-num-groups", "1",
                     "--moe-router-group-topk", "1",
                     "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-router-topk", "2",
                     "--moe-router-pre-softmax", "--moe-router-topk-scaling-factor", "2.0",
                     "--moe-aux-loss-coeff", "3e-3", "--moe-expert-capacity-factor", "1",
                     "--moe-device-level-capacity", "--moe-device-level-aux-loss-coeff", "5e-2",
                     "--moe-comm-aux-loss-coeff", "2e-2", "--moe-ffn-hidden-size", "32",
                     "--moe-shared-expert-intermediate-size", "64",
                     "--moe-layer-freq", "([0]*1+[1]*3)", "--moe-grouped-gemm"],
        "MLA_ARGS": ["--q-lora-rank", "32", "--kv-lora-rank", "32", "--qk-head-dim", "16",
                     "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16",
                     "--rotary-scaling-factor", "1", "--use-multi-token-prediction",
                     "--mtp-coeff", "0.3", "--mtp-depth", "1"],
        "TRAINING_ARGS": ["--seed", "42", "--micro-batch-size", "1", "--global-batch-size", "4",
                          "--train-iters", str(iters), "--init-method-std", "0.006",
                          "--use-mcore-models", "--no-rope-fusion", "--use-distributed-optimizer",
                          "--use-flash-attn", "--sequence-parallel",
                          "--recompute-granularity", "full", "--recompute-method", "block",
                          "--recompute-num-layers", "0", "--distributed-backend", "nccl",
                          "--multi-latent-attention", "--qk-layernorm", "--overlap-grad-reduce",
                          "--moe-shared-expert-overlap", "--no-gradient-accumulation-fusion",
                          "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion",
                          "--no-persist-layer-norm",
                          "--num-layers-per-virtual-pipeline-stage", "2",
                          "--decoder-first-pipeline-num-layers", "2",
                          "--decoder-last-pipeline-num-layers", "2", "--wait-after-ckpt", "0",
                          "--overlap-param-gather", "--tp-comm-overlap",
                          "--disable-tp-comm-overlap-ag", "--no-overlap-p2p-communication"],
        "OFFLOAD_ARGS": ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0",
                         "--use-precision-aware-optimizer", "--overlap-cpu-optimizer-d2h-h2d"],
        "RECOMPUTE_ARGS": ["--attn-recompute", "--recompute-variance", "--mlp-recompute"],
        "REGULARIZATION_ARGS": ["--weight-decay", "0.1", "--adam-beta1", "0.9",
                                "--adam-beta2", "0.95", "--clip-grad", "1.0"],
        "LEARNING_RATE_ARGS": ["--lr", "1e-3", "--lr-decay-style", "cosine",
                               "--lr-warmup-iters", "1", "--min-lr", "1e-4",
                               "--initial-loss-scale", "65536", "--min-loss-scale", "1.0"],
        "MODEL_PARALLEL_ARGS": ["--tensor-model-parallel-size", "1",
                                "--pipeline-model-parallel-size", "2"],
        "MIXED_PRECISION_ARGS": ["--bf16", "--attention-softmax-in-fp32",
                                 "--no-masked-softmax-fusion",
                                 "--accumulate-allreduce-grads-in-fp32"],
        "DATA_ARGS": ["--data-path", *data_path, "--tokenizer-type", "HuggingFaceTokenizer",
                      "--tokenizer-model", str(tokenizer), "--split", "1"],
        # not in the tutorial's list: logging and a checkpoint (for --wait-after-ckpt)
        "LOGGING_ARGS": ["--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000",
                         "--save", str(save), "--save-interval", "2"],
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(argv, timeout=900, **env):
    # Megatron's list of arguments is read (the layer's log is brief by default)
    run_env = subprocess_env(CUDA_DEVICE_MAX_CONNECTIONS="1", MEGATRON_MUSA_PATCH_DEVICE="cpu",
                             MEGATRON_MUSA_PATCH_LOG="full", **env)
    run_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + run_env.get("PATH", "")
    proc = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr


def losses_of(log):
    return {int(i): float(v) for i, v in LOSS.findall(log)}


def test_seed_tutorial_flag_set_trains_on_blended_shards(lm_path, blended, tmp_path,
                                                         release):
    data_path, tokenizer = blended
    groups = seed_groups(data_path, tokenizer, tmp_path / "ckpt", iters=3)
    argv = [MMP, "run", "--standalone", "--nproc-per-node", "2",
            str(lm_path / "pretrain_gpt.py"), *[a for g in groups.values() for a in g],
            "--transformer-impl", "local"]  # the tutorial's groups leave upstream's TE default
    proc, log = run(argv, MEGATRON_LM_PATH=str(lm_path))
    assert proc.returncode == 0, log[-5000:]
    losses = losses_of(log)
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) and 0 < v < 20
                                               for v in losses.values()), losses
    # the flags reached Megatron with their meaning
    for name, value in (("attn_recompute", "True"), ("mlp_recompute", "True"),
                        ("recompute_variance", "True"), ("recompute_granularity", "full"),
                        ("recompute_num_layers", "0"),
                        ("moe_shared_expert_overlap", "True"), ("optimizer_cpu_offload", "True"),
                        ("mtp_num_layers", "1"), ("mtp_loss_scaling_factor", "0.3"),
                        ("wait_after_ckpt", "0.0"), ("tp_comm_overlap", "False"),
                        ("num_virtual_stages_per_pipeline_rank", "1"),
                        ("decoder_first_pipeline_num_layers", "2"),
                        ("moe_device_level_capacity", "True"), ("multi_latent_attention", "True")):
        assert re.search(rf"\b{name} \.+ {re.escape(value)}\n", log), (name, value)
    assert log.count("--tp-comm-overlap overlaps tensor-parallel communication") == 1
    # GroupedMLP (--moe-grouped-gemm; Megatron's argument dump shows it hidden from its CUDA
    # capability check) and the local spec's MLA ran
    assert_grouped_experts(log, release)
    for term in ("mtp_1 loss", "seq_load_balancing_loss", "device_level_balancing_loss",
                 "communication_balancing_loss"):
        assert term in log, term
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert "Traceback" not in log


def mt_script_env(lm_path, work, data_path, **extra):
    """examples/mt_megatron/run_pretrain_deepseekv2_lite.sh at toy sizes: TP2 (sequence
    parallel), 2 CPU ranks, 8 experts in 4 node groups (2 per token)."""
    env = dict(MEGATRON_LM_PATH=str(lm_path), WORK_HOME=str(work), DATA_PATH=data_path,
               GPUS_PER_NODE="2", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
               TP_SIZE="2", PP_SIZE="1", EP_SIZE="1", MICRO_BATCH_SIZE="2",
               GLOBAL_BATCH_SIZE="4", TRAIN_SAMPLES="12", WARMUP_SAMPLES="4", NUM_LAYERS="3",
               HIDDEN_SIZE="64", NUM_ATTENTION_HEADS="4", SEQ_LENGTH="64", FFN_HIDDEN_SIZE="128",
               VOCAB_SIZE="1024", KV_LORA_RANK="32", Q_LORA_RANK="32", QK_HEAD_DIM="16",
               QK_POS_EMB_HEAD_DIM="8", V_HEAD_DIM="16", MOE_NUM_EXPERTS="8", MOE_TOPK="2",
               MOE_LIMITED_DEVICES="2", MOE_NODE_GROUPS="4", MOE_FFN_HIDDEN_SIZE="32",
               MOE_SHARED_EXPERT_SIZE="64", SAVE_INTERVAL="2")
    env.update(extra)
    return env


SCRIPT = REPO / "examples" / "mt_megatron" / "run_pretrain_deepseekv2_lite.sh"


@pytest.fixture(scope="module")
def null_tokens(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt-data")
    return " ".join(["2", str(write_bin_idx(root / "a_document", seed=1, max_id=1000)),
                     "1", str(write_bin_idx(root / "b_document", seed=2, max_id=1000))])


def test_mt_deepseek_v2_lite_script_trains_with_tp2_and_sequence_parallel(lm_path, null_tokens,
                                                                         tmp_path, release):
    # extra arguments go to pretrain_gpt.py: a wait after each checkpoint save
    proc, log = run(["bash", str(SCRIPT), "--wait-after-ckpt", "1"],
                    **mt_script_env(lm_path, tmp_path, null_tokens, TRANSFORMER_IMPL="local"))
    assert proc.returncode == 0, log[-5000:]
    losses = losses_of(log)
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) for v in losses.values()), losses
    for name, value in (("tensor_model_parallel_size", "2"), ("sequence_parallel", "True"),
                        ("moe_router_score_function", "sigmoid"),
                        ("moe_router_group_topk", "2"), ("moe_router_num_groups", "4"),
                        ("moe_router_enable_expert_bias", "True"),
                        ("moe_router_bias_update_rate", "0.001"),
                        ("moe_complementary_seq_aux_loss", "True"),
                        ("moe_router_norm_topk_prob", "True"), ("q_rms_recompute", "True"),
                        ("mla_rms_recompute", "True"), ("mlp_rms_recompute", "True"),
                        ("recompute_variance", "True")):
        assert re.search(rf"\b{name} \.+ {re.escape(value)}\n", log), (name, value)
    assert "seq_load_balancing_loss" in log
    assert_grouped_experts(log, release)
    for iteration in (2, 3):  # --save-interval 2, and the final save
        assert f"--wait-after-ckpt: waited 1 s after saving the checkpoint of iteration " \
            f"{iteration}" in log
    # MT's exports: the ones this layer does not honour are named once (ACCELERATOR_BACKEND=musa
    # on this CPU machine); USE_RECOMPUTE_VARIANCE=1, USE_MUSA_MOE=1, ENABLE_ZERO_BUBBLE=0 are
    assert log.count("MT-Megatron environment switches that this layer does not honour") == 1
    assert "ACCELERATOR_BACKEND=musa: this layer runs on cpu" in log
    assert "USE_RECOMPUTE_VARIANCE" not in log.split("does not honour")[1].split("\n")[0]
    assert "Traceback" not in log


def test_mt_script_as_shipped_stops_with_one_paragraph_without_te(lm_path, null_tokens,
                                                                 tmp_path):
    proc, log = run(["bash", str(SCRIPT)], timeout=300,
                    **mt_script_env(lm_path, tmp_path, null_tokens))
    assert proc.returncode != 0
    assert "Traceback" not in log and "NameError: name" not in log, log[-4000:]
    text = " ".join(log.split())
    assert "megatron_musa_patch: error: --transformer-impl transformer_engine (upstream's " \
        "default when the flag is not given) needs TransformerEngine" in text, log[-4000:]
    assert "Add --transformer-impl local" in text
    assert not losses_of(log)  # nothing trained, no model built
    assert "building GPT model" not in log
