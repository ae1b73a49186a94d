#!/bin/bash
# DeepSeek-V3 (671B parameters, 37B active) shapes and flags for the stock Megatron-LM
# pretrain_gpt.py on a MUSA cluster: 64 nodes x 8 MTT S4000, PP16 x EP32, data parallel 32.
# Not run at this size: a layout to start from. Multi-latent attention with query compression,
# 256 routed experts (top-8, sigmoid scores with a balancing bias, at most 4 of 8 expert groups
# per token) and a shared expert in every layer but the first 3, which are dense, and one
# multi-token-prediction layer.
#
#   export MEGATRON_LM_PATH=/path/to/Megatron-LM  # your megatron-core's tag (core_v0.19.0 ...)
#   DATA_PATH="$(mmp data blend /data/dsv3)" TOKENIZER_MODEL=/models/DeepSeek-V3 \
#   HOSTFILE=hostfile bash examples/deepseek_v3/pretrain_deepseek_v3.sh   # on every node
#
# The 61 layers over 16 pipeline stages: 3 on the first (the embedding and the dense layers),
# 2 on the last (the output layer and the MTP layer), 4 on each of the other 14. Uses
# megatron_musa_patch's mla_local feature (upstream MLA fails on the local, no TransformerEngine,
# spec without it) and its fine-grained recompute. Also available through the layer, not used
# here: --moe-grouped-gemm (feature moe_fusion) and tensor parallelism with MoE
# (--sequence-parallel on the local norms, feature fused_ops.norm).
# The tiny variant (pretrain_deepseek_v3_tiny.sh) runs these flags at toy sizes on 2 CPU ranks
# (EP2, no pipeline).
set -euo pipefail
EXPNAME=${EXPNAME:-deepseek_v3}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# sizes (the tiny variant overrides them)
NUM_LAYERS=${NUM_LAYERS:-61}
DENSE_LAYERS=${DENSE_LAYERS:-3}
HIDDEN_SIZE=${HIDDEN_SIZE:-7168}
FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-18432}  # the dense layers
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-128}
Q_LORA_RANK=${Q_LORA_RANK:-1536}
KV_LORA_RANK=${KV_LORA_RANK:-512}
QK_HEAD_DIM=${QK_HEAD_DIM:-128}
QK_POS_EMB_HEAD_DIM=${QK_POS_EMB_HEAD_DIM:-64}
V_HEAD_DIM=${V_HEAD_DIM:-128}
NUM_EXPERTS=${NUM_EXPERTS:-256}
MOE_ROUTER_TOPK=${MOE_ROUTER_TOPK:-8}
MOE_ROUTER_NUM_GROUPS=${MOE_ROUTER_NUM_GROUPS:-8}
MOE_ROUTER_GROUP_TOPK=${MOE_ROUTER_GROUP_TOPK:-4}
MOE_FFN_HIDDEN_SIZE=${MOE_FFN_HIDDEN_SIZE:-2048}
SHARED_EXPERT_SIZE=${SHARED_EXPERT_SIZE:-2048}  # 1 shared expert of 2048
MTP_NUM_LAYERS=${MTP_NUM_LAYERS:-1}
SEQ_LENGTH=${SEQ_LENGTH:-4096}
VOCAB_SIZE=${VOCAB_SIZE:-129280}  # mock data only; real data takes it from the tokenizer
TP_SIZE=${TP_SIZE:-1}
PP_SIZE=${PP_SIZE:-16}
EP_SIZE=${EP_SIZE:-32}
FIRST_STAGE_LAYERS=${FIRST_STAGE_LAYERS:-3}  # with PP_SIZE > 1
LAST_STAGE_LAYERS=${LAST_STAGE_LAYERS:-2}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-1}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-3072}
TRAIN_ITERS=${TRAIN_ITERS:-500000}
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
    --mtp-num-layers $MTP_NUM_LAYERS
    --mtp-loss-scaling-factor 0.1
    "${TRANSFORMER_IMPL_ARGS[@]}"
)

MOE_ARGS=(
    --num-experts $NUM_EXPERTS
    --moe-layer-freq "([0]*$DENSE_LAYERS+[1]*$((NUM_LAYERS - DENSE_LAYERS)))"
    --moe-ffn-hidden-size $MOE_FFN_HIDDEN_SIZE
    --moe-shared-expert-intermediate-size $SHARED_EXPERT_SIZE
    --moe-router-topk $MOE_ROUTER_TOPK
    # sigmoid scores, normalised over the chosen experts then scaled; a per-expert bias, moved
    # after every step towards balance, takes part in the choice only (auxiliary-loss-free)
    --moe-router-score-function sigmoid
    --moe-router-enable-expert-bias
    --moe-router-bias-update-rate 1e-3
    --moe-router-topk-scaling-factor 2.5
    # group-limited routing: a token's experts come from its best MOE_ROUTER_GROUP_TOPK groups
    --moe-router-num-groups $MOE_ROUTER_NUM_GROUPS
    --moe-router-group-topk $MOE_ROUTER_GROUP_TOPK
    --moe-router-dtype fp32
    # and a small sequence-wise balance loss
    --moe-router-load-balancing-type seq_aux_loss
    --moe-aux-loss-coeff 1e-4
    --moe-token-dispatcher-type alltoall
)

MLA_ARGS=(
    --multi-latent-attention
    --q-lora-rank $Q_LORA_RANK
    --kv-lora-rank $KV_LORA_RANK
    --qk-head-dim $QK_HEAD_DIM
    --qk-pos-emb-head-dim $QK_POS_EMB_HEAD_DIM
    --v-head-dim $V_HEAD_DIM
    --qk-layernorm
    # YaRN rope (MLA's default type) without extension at 4k; the released model's 128k
    # context is YaRN factor 40 (mmp checkpoint import-hf writes those flags)
    --rotary-scaling-factor 1
)

training_args
MODEL_PARALLEL_ARGS+=(--expert-model-parallel-size $EP_SIZE)
if [ "$PP_SIZE" -gt 1 ]; then
  MODEL_PARALLEL_ARGS+=(
      --decoder-first-pipeline-num-layers $FIRST_STAGE_LAYERS
      --decoder-last-pipeline-num-layers $LAST_STAGE_LAYERS
  )
fi

run_model HuggingFaceTokenizer "$@"  # a tokenizer directory
