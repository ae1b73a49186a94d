#!/bin/bash
# Qwen2.5-7B pretraining with the stock Megatron-LM pretrain_gpt.py on a MUSA cluster
# (8 x MTT S4000 per node; TP2 x PP2 x DP2 on one node, more nodes add data parallelism).
# Grouped-query attention (28 heads, 4 key/value groups) with biases on the query, key and value
# projections (--add-qkv-bias) and none elsewhere; untied input and output embeddings.
#
#   export MEGATRON_LM_PATH=/path/to/Megatron-LM  # your megatron-core's tag (core_v0.19.0 ...)
#   DATA_PATH="$(mmp data blend /data/qwen25)" TOKENIZER_MODEL=/models/Qwen2.5-7B \
#   HOSTFILE=hostfile bash examples/qwen25_7b/pretrain_qwen25_7b.sh
#
# The tiny variant (pretrain_qwen25_7b_tiny.sh) runs these flags at toy sizes on 2 CPU ranks
# (TP2: the query/key/value biases split across the tensor-parallel ranks).
set -euo pipefail
EXPNAME=${EXPNAME:-qwen25_7b}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# sizes (the tiny variant overrides them)
NUM_LAYERS=${NUM_LAYERS:-28}
HIDDEN_SIZE=${HIDDEN_SIZE:-3584}
FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-18944}
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-28}
NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-4}
KV_CHANNELS=${KV_CHANNELS:-128}
SEQ_LENGTH=${SEQ_LENGTH:-4096}
MAX_POSITION_EMBEDDINGS=${MAX_POSITION_EMBEDDINGS:-32768}
VOCAB_SIZE=${VOCAB_SIZE:-152064}  # mock data only; real data takes it from the tokenizer
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
    --seq-length $SEQ_LENGTH
    --max-position-embeddings $MAX_POSITION_EMBEDDINGS
    --position-embedding-type rope
    --rotary-base 1000000
    --normalization RMSNorm
    --norm-epsilon 1e-6
    --swiglu
    --disable-bias-linear
    --add-qkv-bias
    --untie-embeddings-and-output-weights
    --init-method-std 0.02
    "${TRANSFORMER_IMPL_ARGS[@]}"
)

MOE_ARGS=()  # dense model
MLA_ARGS=()  # grouped-query attention (MODEL_ARGS)
training_args

run_model HuggingFaceTokenizer "$@"  # a tokenizer directory
