#!/bin/bash
# DeepSeek-V2-Lite (15.7B parameters, 2.4B active) pretraining with the stock Megatron-LM
# pretrain_gpt.py on a MUSA cluster (8 x MTT S4000 per node; EP8 x DP8 on one node).
# Multi-latent attention (no query compression in the Lite model), 64 routed experts (top-6) and
# 2 shared experts in every layer but the first, which is dense.
#
#   export MEGATRON_LM_PATH=/path/to/Megatron-LM  # your megatron-core's tag (core_v0.19.0 ...)
#   DATA_PATH="$(mmp data blend /data/dsv2)" TOKENIZER_MODEL=/models/DeepSeek-V2-Lite \
#   HOSTFILE=hostfile bash examples/deepseek_v2_lite/pretrain_deepseek_v2_lite.sh
#
# Uses megatron_musa_patch's mla_local feature (upstream MLA fails on the local, no
# TransformerEngine, spec without it), its DeepSeek-V2 device-level MoE balance losses and its
# fine-grained recompute. Also available through the layer, not used at this size:
# --moe-grouped-gemm (feature moe_fusion: grouped GEMM without the grouped_gemm kernels) and
# tensor parallelism with MoE (--sequence-parallel on the local norms, feature fused_ops.norm).
# The tiny variant (pretrain_deepseek_v2_lite_tiny.sh) runs these
# flags at toy sizes on 2 CPU ranks (EP2).
set -euo pipefail
EXPNAME=${EXPNAME:-deepseek_v2_lite}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# sizes (the tiny variant overrides them)
NUM_LAYERS=${NUM_LAYERS:-27}
HIDDEN_SIZE=${HIDDEN_SIZE:-2048}
FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-10944}  # the dense first layer
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-16}
KV_LORA_RANK=${KV_LORA_RANK:-512}
QK_HEAD_DIM=${QK_HEAD_DIM:-128}
QK_POS_EMB_HEAD_DIM=${QK_POS_EMB_HEAD_DIM:-64}
V_HEAD_DIM=${V_HEAD_DIM:-128}
NUM_EXPERTS=${NUM_EXPERTS:-64}
MOE_FFN_HIDDEN_SIZE=${MOE_FFN_HIDDEN_SIZE:-1408}
SHARED_EXPERT_SIZE=${SHARED_EXPERT_SIZE:-2816}  # 2 shared experts of 1408
SEQ_LENGTH=${SEQ_LENGTH:-4096}
VOCAB_SIZE=${VOCAB_SIZE:-102400}  # mock data only; real data takes it from the tokenizer
TP_SIZE=${TP_SIZE:-1}
PP_SIZE=${PP_SIZE:-1}
EP_SIZE=${EP_SIZE:-8}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-1}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-512}
TRAIN_ITERS=${TRAIN_ITERS:-250000}
EVAL_ITERS=${EVAL_ITERS:-10}
SAVE_INTERVAL=${SAVE_INTERVAL:-1000}

MODEL_ARGS=(
    --num-layers $NUM_LAYERS
    --hidden-size $HIDDEN_SIZE
    --ffn-hidden-size $FFN_HIDDEN_SIZE
    --num-attention-heads $NUM_ATTENTION_HEADS
    --seq-length $SEQ_LENGTH
    --max-position-embeddings $SEQ_LENGTH
    --position-embedding-type rope
    --rotary-base 10000
    --normalization RMSNorm
    --norm-epsilon 1e-6
    --swiglu
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --init-method-std 0.006
    "${TRANSFORMER_IMPL_ARGS[@]}"
)

MOE_ARGS=(
    --num-experts $NUM_EXPERTS
    --moe-layer-freq "([0]*1+[1]*$((NUM_LAYERS - 1)))"
    --moe-ffn-hidden-size $MOE_FFN_HIDDEN_SIZE
    --moe-shared-expert-intermediate-size $SHARED_EXPERT_SIZE
    --moe-router-topk 6
    --moe-router-load-balancing-type seq_aux_loss
    --moe-aux-loss-coeff 1e-3
    --moe-token-dispatcher-type alltoall
    # DeepSeek-V2's device-level balance (its paper's a2, a3) over the EP devices
    --moe-device-level-aux-loss-coeff 0.05
    --moe-comm-aux-loss-coeff 0.02
)

MLA_ARGS=(
    --multi-latent-attention
    --kv-lora-rank $KV_LORA_RANK
    --qk-head-dim $QK_HEAD_DIM
    --qk-pos-emb-head-dim $QK_POS_EMB_HEAD_DIM
    --v-head-dim $V_HEAD_DIM
    --qk-layernorm
    --rotary-scaling-factor 1  # YaRN rope (MLA's default type) without extension at 4k
)

training_args
MODEL_PARALLEL_ARGS+=(--expert-model-parallel-size $EP_SIZE)

run_model HuggingFaceTokenizer "$@"  # a tokenizer directory
