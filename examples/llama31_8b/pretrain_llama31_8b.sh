#!/bin/bash
# Llama-3.1-8B pretraining with the stock Megatron-LM pretrain_gpt.py on a MUSA cluster
# (8 x MTT S4000 per node; TP2 x PP2 x DP2 on one node, more nodes add data parallelism).
# Llama-3-8B's shapes plus Llama 3.1's RoPE scaling (--use-rope-scaling), 8192-token sequences.
#
#   export MEGATRON_LM_PATH=/path/to/Megatron-LM  # your megatron-core's tag (core_v0.19.0 ...)
#   DATA_PATH="$(mmp data blend /data/llama31)" TOKENIZER_MODEL=/models/Llama-3.1-8B \
#   HOSTFILE=hostfile bash examples/llama31_8b/pretrain_llama31_8b.sh
#
# --use-rope-scaling applies megatron-core's Llama 3.x frequency scaling (low-frequency factor 1,
# high-frequency factor 4, original context 8192) with factor 8, Llama 3.1's. The stock
# pretrain_gpt.py builds the model with megatron-core's default factor, 8, whatever
# --rope-scaling-factor says: the flag is here to say which factor the model has.
# The tiny variant (pretrain_llama31_8b_tiny.sh) runs these flags at toy sizes on 2 CPU ranks.
set -euo pipefail
EXPNAME=${EXPNAME:-llama31_8b}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# sizes (the tiny variant overrides them)
NUM_LAYERS=${NUM_LAYERS:-32}
HIDDEN_SIZE=${HIDDEN_SIZE:-4096}
FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-14336}
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-32}
NUM_QUERY_GROUPS=${NUM_QUERY_GROUPS:-8}
KV_CHANNELS=${KV_CHANNELS:-128}
SEQ_LENGTH=${SEQ_LENGTH:-8192}
VOCAB_SIZE=${VOCAB_SIZE:-128256}  # mock data only; real data takes it from the tokenizer
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
    --max-position-embeddings $SEQ_LENGTH
    --position-embedding-type rope
    --rotary-base 500000
    --use-rope-scaling
    --rope-scaling-factor 8
    --normalization RMSNorm
    --norm-epsilon 1e-5
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
