#!/bin/bash
# DeepSeek-V3's script at toy sizes on 2 CPU ranks (EP2, data parallel 2): the same flags (MLA
# with query compression, a dense first layer then 3 MoE layers of 8 routed experts, top-4 from
# 2 of 4 groups, sigmoid scores with the balancing bias, a shared expert, one MTP layer), mock
# data unless DATA_PATH and TOKENIZER_MODEL are set. Extra arguments go to pretrain_gpt.py.
export TINY=1 NUM_LAYERS=4 DENSE_LAYERS=1 HIDDEN_SIZE=64 FFN_HIDDEN_SIZE=128
export NUM_ATTENTION_HEADS=4 Q_LORA_RANK=48 KV_LORA_RANK=32 QK_HEAD_DIM=16 QK_POS_EMB_HEAD_DIM=8
export V_HEAD_DIM=16 NUM_EXPERTS=8 MOE_ROUTER_TOPK=4 MOE_ROUTER_NUM_GROUPS=4
export MOE_ROUTER_GROUP_TOPK=2 MOE_FFN_HIDDEN_SIZE=32 SHARED_EXPERT_SIZE=32 MTP_NUM_LAYERS=1
export SEQ_LENGTH=64 VOCAB_SIZE=1024 TP_SIZE=1 PP_SIZE=1 EP_SIZE=2
export MICRO_BATCH_SIZE=2 GLOBAL_BATCH_SIZE=8
export TRAIN_ITERS=${TRAIN_ITERS:-3} EVAL_ITERS=0 SAVE_INTERVAL=${SAVE_INTERVAL:-1000}
exec bash "$(dirname "${BASH_SOURCE[0]}")/pretrain_deepseek_v3.sh" "$@"
