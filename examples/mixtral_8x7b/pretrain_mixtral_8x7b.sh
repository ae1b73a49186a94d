#!/bin/bash
# Mixtral-8x7B pretraining with the stock Megatron-LM pretrain_gpt.py on a MUSA cluster
# (4 nodes x 8 MTT S4000: PP4 x EP8, data parallel 8; the MoE layers' experts are split 8 ways).
#
#   export MEGATRON_LM_PATH=/path/to/Megatron-LM  # your megatron-core's tag (core_v0.19.0 ...)
#   DATA_PATH="$(mmp data blend /data/mixtral)" TOKENIZER_MODEL=/models/mixtral/tokenizer.model \
#   HOSTFILE=hostfile bash examples/mixtral_8x7b/pretrain_mixtral_8x7b.sh   # on every node
#
# Tensor parallelism stays 1 at this size. MoE with TP takes --sequence-parallel, which works on
# the local norms (feature fused_ops.norm); --moe-grouped-gemm works without the grouped_gemm
# kernels (feature moe_fusion). The tiny variant
# (pretrain_mixtral_8x7b_tiny.sh) runs these flags at toy sizes on 2 CPU ranks (EP2).
set -euo pipefail
EXPNAME=${EXPNAME:-mixtral_8x7b}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# sizes (the tiny variant overrides them)
NUM_LAYERS=${NUM_LAYERS:-32}
HIDDEN_SIZE=${HIDDEN_SIZE:-4096}
FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-14336}
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-32}
NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-8}
SEQ_LENGTH=${SEQ_LENGTH:-4096}
NUM_EXPERTS=${NUM_EXPERTS:-8}
VOCAB_SIZE=${VOCAB_SIZE:-32000}  # mock data only; real data takes it from the tokenizer
TP_SIZE=${TP_SIZE:-1}
PP_SIZE=${PP_SIZE:-4}
EP_SIZE=${EP_SIZE:-8}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-1}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-256}
TRAIN_ITERS=${TRAIN_ITERS:-500000}
EVAL_ITERS=${EVAL_ITERS:-10}
SAVE_INTERVAL=${SAVE_INTERVAL:-1000}

MODEL_ARGS=(
    --num-layers $NUM_LAYERS
    --hidden-size $HIDDEN_SIZE
    --ffn-hidden-size $FFN_HIDDEN_SIZE
    --num-attention-heads $NUM_ATTENTION_HEADS
    --group-query-attention
    --num-query-groups $NUM_QUERY_GROUPS
    --seq-length $SEQ_LENGTH
    --max-position-embeddings 32768
    --position-embedding-type rope
    --rotary-base 1000000
    --normalization RMSNorm
    --norm-epsilon 1e-5
    --swiglu
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --init-method-std 0.01
    "${TRANSFORMER_IMPL_ARGS[@]}"
)

MOE_ARGS=(
    --num-experts $NUM_EXPERTS
    --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-2
    --moe-token-dispatcher-type alltoall
)

MLA_ARGS=()  # grouped-query attention (MODEL_ARGS)
training_args
MODEL_PARALLEL_ARGS+=(--expert-model-parallel-size $EP_SIZE)

run_model Llama2Tokenizer "$@"  # SentencePiece tokenizer.model
