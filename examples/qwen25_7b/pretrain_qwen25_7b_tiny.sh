#!/bin/bash
# Qwen2.5-7B's script at toy sizes on 2 CPU ranks (TP2): the same flags (query/key/value biases
# included), mock data unless DATA_PATH and TOKENIZER_MODEL are set. Extra arguments go to
# pretrain_gpt.py.
export TINY=1 NUM_LAYERS=2 HIDDEN_SIZE=64 FFN_HIDDEN_SIZE=160 NUM_ATTENTION_HEADS=4
export NUM_QUERY_GROUPS=2 KV_CHANNELS=16 SEQ_LENGTH=64 MAX_POSITION_EMBEDDINGS=64
export VOCAB_SIZE=1024 TP_SIZE=2 PP_SIZE=1 MICRO_BATCH_SIZE=2 GLOBAL_BATCH_SIZE=8
export TRAIN_ITERS=${TRAIN_ITERS:-3} EVAL_ITERS=0 SAVE_INTERVAL=${SAVE_INTERVAL:-1000}
exec bash "$(dirname "${BASH_SOURCE[0]}")/pretrain_qwen25_7b.sh" "$@"
