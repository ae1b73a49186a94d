#!/bin/bash
# DeepSeek-V2-Lite's script at toy sizes on 2 CPU ranks (EP2, data parallel 2): the same flags
# (MLA, a dense first layer, routed top-6 and shared experts), mock data unless DATA_PATH and
# TOKENIZER_MODEL are set. Extra arguments go to pretrain_gpt.py.
export TINY=1 NUM_LAYERS=3 HIDDEN_SIZE=64 FFN_HIDDEN_SIZE=128 NUM_ATTENTION_HEADS=4
export KV_LORA_RANK=32 QK_HEAD_DIM=16 QK_POS_EMB_HEAD_DIM=8 V_HEAD_DIM=16 NUM_EXPERTS=8
export MOE_FFN_HIDDEN_SIZE=32 SHARED_EXPERT_SIZE=64 SEQ_LENGTH=64 VOCAB_SIZE=1024
export TP_SIZE=1 PP_SIZE=1 EP_SIZE=2 MICRO_BATCH_SIZE=2 GLOBAL_BATCH_SIZE=8
export TRAIN_ITERS=${TRAIN_ITERS:-3} EVAL_ITERS=0 SAVE_INTERVAL=${SAVE_INTERVAL:-1000}
exec bash "$(dirname "${BASH_SOURCE[0]}")/pretrain_deepseek_v2_lite.sh" "$@"
