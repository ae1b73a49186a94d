#!/bin/bash
# Llama-3.1-8B's script at toy sizes on 2 CPU ranks (PP2): the same flags (RoPE scaling
# included), mock data unless DATA_PATH and TOKENIZER_MODEL are set. Extra arguments go to
# pretrain_gpt.py.
export TINY=1 NUM_LAYERS=2 HIDDEN_SIZE=64 FFN_HIDDEN_SIZE=224 NUM_ATTENTION_HEADS=4
export NUM_QUERY_GROUPS=2 KV_CHANNELS=16 SEQ_LENGTH=64 VOCAB_SIZE=1024 TP_SIZE=1 PP_SIZE=2
export MICRO_BATCH_SIZE=2 GLOBAL_BATCH_SIZE=8
export TRAIN_ITERS=${TRAIN_ITERS:-3} EVAL_ITERS=0 SAVE_INTERVAL=${SAVE_INTERVAL:-1000}
exec bash "$(dirname "${BASH_SOURCE[0]}")/pretrain_llama31_8b.sh" "$@"
