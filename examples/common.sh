# Sourced by the model scripts in examples/<model>/: where things are, how the job is launched,
# and what a tiny variant (TINY=1) changes. Not meant to be run on its own.
#
# Cluster launch (the default): GPUS_PER_NODE devices per node (8), every node runs the same
# script. Nodes come from a HOSTFILE (one host per line, '#' comments; the first host is the
# master, this node's rank is its line) or from the usual torchrun variables NNODES, NODE_RANK,
# MASTER_ADDR, MASTER_PORT. Tiny variants run on one machine with 2 CPU ranks.
#
# Paths: MEGATRON_LM_PATH (a Megatron-LM checkout of the installed megatron-core's tag,
# core_v0.16.1 ... core_v0.19.0, required), WORK_HOME
# (checkpoints, TensorBoard, logs; default ./runs), EXPNAME (default: the script's model name).

die() { printf '%s: error: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

[ -n "${MEGATRON_LM_PATH:-}" ] || die "set MEGATRON_LM_PATH to a Megatron-LM checkout of the \
installed megatron-core's tag (mmp doctor prints the release; core_v0.16.1 for 0.16.1, \
core_v0.19.0 for 0.19.x: git clone --branch TAG --depth 1 https://github.com/NVIDIA/Megatron-LM)"
[ -f "$MEGATRON_LM_PATH/pretrain_gpt.py" ] || die "MEGATRON_LM_PATH=$MEGATRON_LM_PATH has no \
pretrain_gpt.py; point it at a Megatron-LM checkout of the installed megatron-core's tag"
command -v mmp >/dev/null 2>&1 || die "the mmp command is not on PATH: pip install \
megatron-musa-patch (or activate the environment that has it, e.g. .venv)"

TINY=${TINY:-0}
WORK_HOME=${WORK_HOME:-$PWD/runs}
CHECKPOINT_PATH=${CHECKPOINT_PATH:-$WORK_HOME/checkpoints/$EXPNAME}
# not "tensorboard/": `mmp run` (python -m) puts the working directory on sys.path, where a
# directory of that name would shadow the tensorboard package
TB_PATH=${TB_PATH:-$WORK_HOME/tboard/$EXPNAME}
mkdir -p "$CHECKPOINT_PATH" "$TB_PATH"

export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron requires it with TP/CP > 1 (any device)
if [ "$TINY" = 1 ]; then
  export MEGATRON_MUSA_PATCH_DEVICE=${MEGATRON_MUSA_PATCH_DEVICE:-cpu}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  DISTRIBUTED_ARGS=(--standalone --nproc-per-node "${GPUS_PER_NODE:-2}")
else
  # MT-Megatron's cluster settings for MCCL and the MUSA runtime; ignored on other devices
  export MUSA_KERNEL_TIMEOUT=${MUSA_KERNEL_TIMEOUT:-3200000}
  export MCCL_PROTOS=${MCCL_PROTOS:-2}
  export MCCL_CHECK_POINTERS=${MCCL_CHECK_POINTERS:-0}
  export MCCL_IB_GID_INDEX=${MCCL_IB_GID_INDEX:-3}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
  GPUS_PER_NODE=${GPUS_PER_NODE:-8}
  if [ -n "${HOSTFILE:-}" ]; then
    [ -f "$HOSTFILE" ] || die "HOSTFILE=$HOSTFILE does not exist"
    mapfile -t HOSTS < <(grep -v '^[[:space:]]*\(#\|$\)' "$HOSTFILE" | awk '{print $1}')
    [ "${#HOSTS[@]}" -gt 0 ] || die "HOSTFILE=$HOSTFILE lists no hosts"
    NNODES=${#HOSTS[@]}
    MASTER_ADDR=${HOSTS[0]}
    ME=" $(hostname) $(hostname -f 2>/dev/null) $(hostname -I 2>/dev/null) "
    NODE_RANK=""
    for i in "${!HOSTS[@]}"; do
      case "$ME" in *" ${HOSTS[$i]} "*) NODE_RANK=$i; break ;; esac
    done
    [ -n "$NODE_RANK" ] || die "this host ($(hostname)) is not in HOSTFILE=$HOSTFILE; list it \
by name or address, or set NODE_RANK"
  fi
  DISTRIBUTED_ARGS=(
    --nproc-per-node "$GPUS_PER_NODE"
    --nnodes "${NNODES:-1}"
    --node-rank "${NODE_RANK:-0}"
    --master-addr "${MASTER_ADDR:-localhost}"
    --master-port "${MASTER_PORT:-12356}"
  )
fi

# The local (no TransformerEngine) layer spec with upstream's fusion defaults: the fused_ops
# feature routes each fusion to a kernel of the selected device, and --use-flash-attn runs core
# attention through scaled_dot_product_attention (flash kernels on GPUs; upstream's local spec
# would ignore the flag).
TRANSFORMER_IMPL_ARGS=(
  --transformer-impl local
  --use-flash-attn
)

# data_args TOKENIZER_TYPE: DATA_ARGS for DATA_PATH (weighted prefixes, e.g. `mmp data blend`)
# and TOKENIZER_MODEL; a tiny variant without DATA_PATH trains on mock data. SPLIT (train,
# validation, test shares of the documents) follows EVAL_ITERS unless set: 99,1,0 with
# evaluation, 100,0,0 without (EVAL_ITERS=0, the tiny variants), as Megatron still builds a
# validation dataset that nothing reads, and on a small corpus one with no document or sample.
data_args() {
  if [ -n "${DATA_PATH:-}" ]; then
    [ -n "${TOKENIZER_MODEL:-}" ] || die "DATA_PATH is set: also set TOKENIZER_MODEL (and \
TOKENIZER_TYPE if it is not $1)"
    local split=99,1,0
    [ "${EVAL_ITERS:-0}" != 0 ] || split=100,0,0
    # shellcheck disable=SC2206 - DATA_PATH is a list of weights and prefixes
    DATA_ARGS=(
      --data-path $DATA_PATH
      --tokenizer-type "${TOKENIZER_TYPE:-$1}"
      --tokenizer-model "$TOKENIZER_MODEL"
      --split "${SPLIT:-$split}"
      --data-cache-path "$WORK_HOME/data-cache"
    )
  elif [ "$TINY" = 1 ]; then
    DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size "$VOCAB_SIZE")
  else
    die "set DATA_PATH (weights and .bin/.idx prefixes; see 'mmp data blend') and \
TOKENIZER_MODEL"
  fi
}

# training_args: the arrays every model script shares (training loop, checkpoints, recompute,
# regularization, schedule, parallelism, precision), from the variables the script set. A
# script may change any of them after the call (the MoE scripts add expert parallelism).
training_args() {
  TRAINING_ARGS=(
      --micro-batch-size $MICRO_BATCH_SIZE
      --global-batch-size $GLOBAL_BATCH_SIZE
      --train-iters $TRAIN_ITERS
      --seed 42
      --use-distributed-optimizer
      --distributed-backend nccl  # mccl on MUSA, gloo on CPU
      --log-interval 1
      --log-throughput
      --eval-interval $SAVE_INTERVAL
      --eval-iters $EVAL_ITERS
      --save-interval $SAVE_INTERVAL
      --save "$CHECKPOINT_PATH"
      --load "$CHECKPOINT_PATH"
      --tensorboard-dir "$TB_PATH"
  )

  # Off by default. To step part of the optimizer on the host (any device): --optimizer-cpu-offload
  # --optimizer-offload-fraction 0.5 --use-precision-aware-optimizer [--overlap-cpu-optimizer-d2h-h2d]
  OFFLOAD_ARGS=()

  # Fine-grained recompute: attention and MLP blocks keep only their inputs (about what full
  # recompute saves), and their last linear layers are not re-run in backward. Upstream's
  # alternative: --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
  RECOMPUTE_ARGS=(
      --attn-recompute
      --mlp-recompute
      --recompute-variance
  )

  REGULARIZATION_ARGS=(
      --attention-dropout 0.0
      --hidden-dropout 0.0
      --weight-decay 0.1
      --adam-beta1 0.9
      --adam-beta2 0.95
      --clip-grad 1.0
  )

  LEARNING_RATE_ARGS=(
      --lr 3.0e-4
      --min-lr 3.0e-5
      --lr-decay-style cosine
      --lr-warmup-iters $(( TRAIN_ITERS / 100 > 0 ? TRAIN_ITERS / 100 : 0 ))
  )

  MODEL_PARALLEL_ARGS=(
      --tensor-model-parallel-size $TP_SIZE
      --pipeline-model-parallel-size $PP_SIZE
  )

  MIXED_PRECISION_ARGS=(
      --bf16
      --attention-softmax-in-fp32
      --accumulate-allreduce-grads-in-fp32
  )
}

# run_model TOKENIZER_TYPE ARGS...: data_args, then pretrain_gpt.py with the model's arrays
# (MODEL_ARGS, MOE_ARGS, MLA_ARGS), the shared ones and ARGS
run_model() {
  data_args "$1"
  shift
  run_pretrain_gpt \
    "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${MLA_ARGS[@]}" "${TRAINING_ARGS[@]}" \
    "${OFFLOAD_ARGS[@]}" "${RECOMPUTE_ARGS[@]}" "${REGULARIZATION_ARGS[@]}" \
    "${LEARNING_RATE_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${MIXED_PRECISION_ARGS[@]}" \
    "${DATA_ARGS[@]}" "$@"
}

# run_pretrain_gpt ARGS...: the stock pretrain_gpt.py with the layer active in every rank
run_pretrain_gpt() {
  echo "mmp run ${DISTRIBUTED_ARGS[*]} $MEGATRON_LM_PATH/pretrain_gpt.py $*"
  exec mmp run "${DISTRIBUTED_ARGS[@]}" "$MEGATRON_LM_PATH/pretrain_gpt.py" "$@"
}
