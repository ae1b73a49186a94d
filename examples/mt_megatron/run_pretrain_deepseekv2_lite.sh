#!/bin/bash
# DeepSeek-V2-Lite pretraining written the way MT-MegatronLM's scripts are
# (MooreThreads/MT-MegatronLM examples/deepseek-v2/deepseek-v2-lite/run_pretrain_deepseekv2_*.sh):
# its exports, its argument arrays and its flag spellings, MT's own flags included
# (--q-rms-recompute, --attn-recompute, --mlp-recompute, --recompute-variance,
# --mla-rms-recompute, --mlp-rms-recompute, --moe-router-topk-limited-devices,
# --moe-router-num-node-group, --moe-noaux-gamma, --moe-complementary-seq-aux-loss,
# --moe-router-use-sigmoid, --moe-router-norm-topk-prob). One line differs: the launch runs the
# stock Megatron-LM pretrain_gpt.py through `mmp run` instead of MT's pretrain_deepseekv2.py.
#
#   export MEGATRON_LM_PATH=/path/to/Megatron-LM  # your megatron-core's tag (core_v0.19.0 ...)
#   DATA_PATH="$(mmp data blend /data/dsv2)" bash examples/mt_megatron/run_pretrain_deepseekv2_lite.sh
#
# Every size and parallel setting is a variable (defaults: the Lite model, TP1 PP1 EP8 on 8
# devices). TRANSFORMER_IMPL defaults to transformer_engine, as in MT's scripts: without
# TransformerEngine the layer stops with one paragraph naming --transformer-impl local.
# tests/features/mt_megatron/test_scripts.py runs it at toy sizes with TP2 on 2 CPU ranks.
set -euo pipefail

export ENABLE_PROFILER=${ENABLE_PROFILER:-0}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export MUSA_KERNEL_TIMEOUT=3200000
export ACCELERATOR_BACKEND=${ACCELERATOR_BACKEND:-"musa"}
export MCCL_PROTOS=2
export MCCL_CHECK_POINTERS=0
export CUDA_DEVICE_MAX_CONNECTIONS=1
export MCCL_IB_GID_INDEX=3
export MUSA_BLOCK_SCHEDULE_MODE=1
export MCCL_ALGOS=1
export MCCL_BUFFSIZE=20480000
export USE_RECOMPUTE_VARIANCE=${USE_RECOMPUTE_VARIANCE:-1}
export USE_MUSA_MOE=${USE_MUSA_MOE:-1}
export ENABLE_ZERO_BUBBLE=${ENABLE_ZERO_BUBBLE:-0}

: "${MEGATRON_LM_PATH:?set MEGATRON_LM_PATH to a Megatron-LM checkout of the megatron-core tag}"
WORK_HOME=${WORK_HOME:-$PWD/runs}
EXPNAME=${EXPNAME:-deepseekv2_lite}
CHECKPOINT_PATH=${CHECKPOINT_PATH:-$WORK_HOME/checkpoints/$EXPNAME}
TB_PATH=${TB_PATH:-$WORK_HOME/tboard/$EXPNAME}
mkdir -p "$CHECKPOINT_PATH" "$TB_PATH"

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NUM_NODES=${NUM_NODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-12356}
TP_SIZE=${TP_SIZE:-1}
PP_SIZE=${PP_SIZE:-1}
EP_SIZE=${EP_SIZE:-8}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-1}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-512}
TRAIN_SAMPLES=${TRAIN_SAMPLES:-24414062}
WARMUP_SAMPLES=${WARMUP_SAMPLES:-$(( TRAIN_SAMPLES / 100 ))}
NUM_LAYERS=${NUM_LAYERS:-27}
HIDDEN_SIZE=${HIDDEN_SIZE:-2048}
NUM_ATTENTION_HEADS=${NUM_ATTENTION_HEADS:-16}
SEQ_LENGTH=${SEQ_LENGTH:-4096}
FFN_HIDDEN_SIZE=${FFN_HIDDEN_SIZE:-10944}
VOCAB_SIZE=${VOCAB_SIZE:-102400}
KV_LORA_RANK=${KV_LORA_RANK:-512}
Q_LORA_RANK=${Q_LORA_RANK:-1536}
QK_HEAD_DIM=${QK_HEAD_DIM:-128}
QK_POS_EMB_HEAD_DIM=${QK_POS_EMB_HEAD_DIM:-64}
V_HEAD_DIM=${V_HEAD_DIM:-128}
MOE_NUM_EXPERTS=${MOE_NUM_EXPERTS:-64}
MOE_TOPK=${MOE_TOPK:-6}
MOE_LIMITED_DEVICES=${MOE_LIMITED_DEVICES:-4}
MOE_NODE_GROUPS=${MOE_NODE_GROUPS:-8}
MOE_FFN_HIDDEN_SIZE=${MOE_FFN_HIDDEN_SIZE:-1408}
MOE_SHARED_EXPERT_SIZE=${MOE_SHARED_EXPERT_SIZE:-2816}
MOE_LAYER_FREQ=${MOE_LAYER_FREQ:-"([0]*1+[1]*$(( NUM_LAYERS - 1 )))"}
SAVE_INTERVAL=${SAVE_INTERVAL:-100000}
TRANSFORMER_IMPL=${TRANSFORMER_IMPL:-transformer_engine}
: "${DATA_PATH:?set DATA_PATH (weights and .bin/.idx prefixes; see mmp data blend)}"

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

MODEL_ARGS=(
    --num-layers $NUM_LAYERS
    --hidden-size $HIDDEN_SIZE
    --num-attention-heads $NUM_ATTENTION_HEADS
    --seq-length $SEQ_LENGTH
    --max-position-embeddings $SEQ_LENGTH
    --norm-epsilon 1e-6
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --disable-bias-linear
    --vocab-size $VOCAB_SIZE
    --ffn-hidden-size $FFN_HIDDEN_SIZE
    --position-embedding-type rope
    --no-position-embedding
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
)

TRAINING_ARGS=(
    --seed 42
    --micro-batch-size $MICRO_BATCH_SIZE
    --global-batch-size $GLOBAL_BATCH_SIZE
    --train-samples $TRAIN_SAMPLES
    --init-method-std 0.006
    --use-mcore-models
    --no-gradient-accumulation-fusion
    --no-bias-dropout-fusion
    --no-bias-swiglu-fusion
    --use-distributed-optimizer
    --use-flash-attn
    --sequence-parallel
    --recompute-granularity full
    --recompute-method block
    --recompute-num-layers 0
    --distributed-backend nccl
    --multi-latent-attention
    --qk-layernorm
    --q-rms-recompute
    --attn-recompute
    --recompute-variance
    --mlp-recompute
    --mla-rms-recompute
    --mlp-rms-recompute
    --enable-experimental
)

MLA_ARGS=(
    --q-lora-rank $Q_LORA_RANK
    --kv-lora-rank $KV_LORA_RANK
    --qk-head-dim $QK_HEAD_DIM
    --qk-pos-emb-head-dim $QK_POS_EMB_HEAD_DIM
    --v-head-dim $V_HEAD_DIM
    --rotary-scaling-factor 1
)

REGULARIZATION_ARGS=(
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --clip-grad 1.0
)

LEARNING_RATE_ARGS=(
    --lr 1.5e-5
    --lr-decay-style cosine
    --lr-warmup-samples $WARMUP_SAMPLES
    --min-lr 1.5e-6
    --initial-loss-scale 65536
    --min-loss-scale 1.0
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP_SIZE
    --pipeline-model-parallel-size $PP_SIZE
)

MIXED_PRECISION_ARGS=(
    --bf16
    --attention-softmax-in-fp32
    --no-masked-softmax-fusion
    --accumulate-allreduce-grads-in-fp32
)

# shellcheck disable=SC2206 - DATA_PATH is a list of weights and prefixes
DATA_ARGS=(
    --data-path $DATA_PATH
    --tokenizer-type NullTokenizer
    --split 1
)

EVAL_AND_LOGGING_ARGS=(
    --log-interval 1
    --log-throughput
    --save-interval $SAVE_INTERVAL
    --eval-interval 1
    --save $CHECKPOINT_PATH
    --load $CHECKPOINT_PATH
    --ckpt-format torch
    --no-load-optim
    --eval-iters 0
    --tensorboard-dir $TB_PATH
)

MOE_ARGS=(
    --num-experts $MOE_NUM_EXPERTS
    --expert-model-parallel-size $EP_SIZE
    --moe-token-dispatcher-type alltoall
    --moe-router-topk-limited-devices $MOE_LIMITED_DEVICES
    --moe-router-num-node-group $MOE_NODE_GROUPS
    --moe-noaux-gamma 1e-3
    --moe-router-load-balancing-type seq_aux_loss
    --moe-complementary-seq-aux-loss
    --moe-router-topk $MOE_TOPK
    --moe-router-pre-softmax #deepseek use pre-softmax
    --moe-router-use-sigmoid #deepseek use sigmoid
    --moe-router-norm-topk-prob #norm topk prob with sigmoid
    --moe-router-topk-scaling-factor 2.5
    --moe-aux-loss-coeff 3e-3
    --moe-ffn-hidden-size $MOE_FFN_HIDDEN_SIZE
    --moe-shared-expert-intermediate-size $MOE_SHARED_EXPERT_SIZE
    --moe-layer-freq "$MOE_LAYER_FREQ"
    --moe-grouped-gemm
    --moe-router-dtype fp32
)

TRANSFORMER_ENGINE_ARGS=(
    --transformer-impl $TRANSFORMER_IMPL
)

cmd=(mmp run "${DISTRIBUTED_ARGS[@]}" "$MEGATRON_LM_PATH/pretrain_gpt.py"
    "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${REGULARIZATION_ARGS[@]}"
    "${LEARNING_RATE_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${MIXED_PRECISION_ARGS[@]}"
    "${DATA_ARGS[@]}" "${MOE_ARGS[@]}" "${MLA_ARGS[@]}" "${EVAL_AND_LOGGING_ARGS[@]}"
    "${TRANSFORMER_ENGINE_ARGS[@]}" "$@")
echo "${cmd[*]}"
exec "${cmd[@]}"
