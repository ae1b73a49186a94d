#!/bin/bash
# Qwen3-8B pretraining with the stock Megatron-LM pretrain_gpt.py on a MUSA cluster
# (8 x MTT S4000 per node; TP2 x PP2 x DP2 on one node, more nodes add data parallelism).
# Grouped-query attention (32 heads, 8 key/value groups, head dimension 128) with an RMSNorm on
# each query and key head (--qk-layernorm), no biases; untied input and output embeddings.
#
#   export MEGATRON_LM_PATH=/path/to/Megatron-LM  # your megatron-core's tag (core_v0.19.0 ...)
#   DATA_PATH="$(mmp data blend /data/qwen3)" TOKENIZER_MODEL=/models/Qwen3-8B \
#   HOSTFILE=hostfile bash examples/qwen3_8b/pretrain_qwen3_8b.sh
#
# The tiny variant (pretrain_qwen3_8b_tiny.sh) runs these flags at toy sizes on 2 CPU ranks
# (TP2: each rank normalises the query and key heads it holds).
set -euo pipefail
EXPNAME=${EXPNAME:-qwen3_8b}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# sizes (the tiny variant overrides them)
NUM_LAYERS=${NUM_LAYERS:-36}
HIDDEN_SIZE=${HIDDEN_SIZE:-4096}
FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-12288}
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-32}
NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-8}
KV_CHANNELS=${KV_CHANNELS:-128}
SEQ_LENGTH=${SEQ_LENGTH:-4096}
MAX_POSITION_EMBEDDINGS=${MAX_POSITION_EMBEDDINGS:-40960}
VOCAB_SIZE=${VOCAB_SIZE:-151936}  # mock data only; real data takes it from the tokenizer
TP_SIZE=${TP_SIZE:-2}
PP_SIZE=${PP_SIZE:-2}
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
    --group-query-attention
    --num-query-groups $NUM_QUERY_GROUPS
    --kv-channels $KV_CHANNELS
    --qk-layernorm
    --seq-length $SEQ_LENGTH
    --max-position-embeddings $MAX_POSITION_EMBEDDINGS
    --position-embedding-type rope
    --rotary-base 1000000
    --normalization RMSNorm
    --norm-epsilon 1e-6
    --swiglu
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --init-method-std 0.02
    "${TRANSFORMER_IMPL_ARGS[@]}"
)

MOE_ARGS=()  # dense model
MLA_ARGS=()  # grouped-query attention (MODEL_ARGS)
training_args

run_model HuggingFaceTokenizer "$@"  # a tokenizer directory
