#!/bin/bash
# One job on two nodes with `mmp run` (torchrun with the layer active in every rank): the same
# command on both nodes, each with its own NODE_RANK; node 0's address is the rendezvous point.
#
#   # on node 0, then on node 1 with NODE_RANK=1 (MASTER_ADDR: node 0's address on both)
#   NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash examples/multinode/launch_two_nodes.sh \
#       "$MEGATRON_LM_PATH/pretrain_gpt.py" ARGS...        # a Python script and its arguments
#   NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash examples/multinode/launch_two_nodes.sh \
#       examples/llama3_8b/pretrain_llama3_8b.sh          # a model script of examples/
#   NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash examples/multinode/launch_two_nodes.sh
#                                         # no script: the comm benchmark across the two nodes
#   sbatch examples/multinode/launch_two_nodes.sbatch [SCRIPT ARGS...]   # SLURM: both at once
#
#   --dry-run (or DRY_RUN=1) as the first argument: print the command this node would run, and
#   run nothing.
#
# A Python script runs as `mmp run --nproc-per-node GPUS_PER_NODE --nnodes 2 --node-rank
# NODE_RANK --master-addr MASTER_ADDR --master-port MASTER_PORT --max-restarts MAX_RESTARTS
# SCRIPT ARGS...`. A model script (*.sh) gets NNODES=2, NODE_RANK, MASTER_ADDR, MASTER_PORT and
# GPUS_PER_NODE, which examples/common.sh turns into that same mmp run line.
#
# Variables: NODE_RANK (0 or 1; under SLURM, $SLURM_NODEID), MASTER_ADDR (node 0's address or
# host name, reachable from node 1; under SLURM, the job's first host), MASTER_PORT (29500, free
# on node 0), GPUS_PER_NODE (8), MAX_RESTARTS (0: restart the group from the latest checkpoint
# that many times when a rank dies or hangs). MT-Megatron's MCCL and MUSA runtime settings are
# set as examples/common.sh sets them (each one only if unset); other devices ignore them.
set -euo pipefail

die() { printf '%s: error: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

DRY_RUN=${DRY_RUN:-0}
if [ "${1:-}" = --dry-run ]; then DRY_RUN=1; shift; fi

NNODES=2
if [ -n "${SLURM_NNODES:-}" ] && [ "$SLURM_NNODES" != "$NNODES" ]; then
  die "this SLURM job has $SLURM_NNODES nodes; this script starts a job on exactly 2 \
(#SBATCH --nodes=2)"
fi
NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-}}
[ -n "$NODE_RANK" ] || die "set NODE_RANK: 0 on the node whose address is MASTER_ADDR, 1 on \
the other (under SLURM it is \$SLURM_NODEID)"
case "$NODE_RANK" in 0|1) ;; *) die "NODE_RANK=$NODE_RANK: it is 0 or 1 for two nodes" ;; esac
if [ -z "${MASTER_ADDR:-}" ] && [ -n "${SLURM_JOB_NODELIST:-}" ] \
    && command -v scontrol >/dev/null 2>&1; then
  MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
fi
[ -n "${MASTER_ADDR:-}" ] || die "set MASTER_ADDR to node 0's address or host name (the same \
on both nodes; node 1 must reach it)"
MASTER_PORT=${MASTER_PORT:-29500}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MAX_RESTARTS=${MAX_RESTARTS:-0}

# MT-Megatron's cluster settings for MCCL and the MUSA runtime, as examples/common.sh sets them
export MUSA_KERNEL_TIMEOUT=${MUSA_KERNEL_TIMEOUT:-3200000}
export MCCL_PROTOS=${MCCL_PROTOS:-2}
export MCCL_CHECK_POINTERS=${MCCL_CHECK_POINTERS:-0}
export MCCL_IB_GID_INDEX=${MCCL_IB_GID_INDEX:-3}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

if [ $# -eq 0 ]; then
  set -- "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/comm/comm_bench.py" -b 8 -e 256M -f 2
fi

case "$1" in
  *.sh)  # a model script: examples/common.sh builds the mmp run line from these
    [ -f "$1" ] || die "$1 does not exist"
    COMMAND=(env -u HOSTFILE NNODES=$NNODES NODE_RANK=$NODE_RANK MASTER_ADDR=$MASTER_ADDR
             MASTER_PORT=$MASTER_PORT GPUS_PER_NODE=$GPUS_PER_NODE bash "$@")
    ;;
  *)
    COMMAND=(mmp run
             --nproc-per-node "$GPUS_PER_NODE"
             --nnodes "$NNODES"
             --node-rank "$NODE_RANK"
             --master-addr "$MASTER_ADDR"
             --master-port "$MASTER_PORT"
             --max-restarts "$MAX_RESTARTS"
             "$@")
    ;;
esac

if [ "$DRY_RUN" = 1 ]; then
  printf '%q ' "${COMMAND[@]}" | sed 's/ $//'
  echo
  exit 0
fi
command -v mmp >/dev/null 2>&1 || die "the mmp command is not on PATH: pip install \
megatron-musa-patch (or activate the environment that has it) on both nodes"
echo "node $NODE_RANK of $NNODES: ${COMMAND[*]}"
exec "${COMMAND[@]}"
