#!/usr/bin/env bash
# The docs' planning examples (docs/plan.md): a 70B-class dense model and a DeepSeek-V3-class MoE
# planned on 64 and 256 ranks (8 per node), priced on the MTT S5000 and the H200, with the levers
# the planner proposes. Needs a Megatron-LM checkout: MEGATRON_LM_PATH=... bash benchmarks/plan_examples.sh
# Writes benchmarks/results/plan_examples_<date>.txt: each plan as mmp plan prints it.
# PLAN_ONLY=DeepSeek plans only the examples whose name holds that text (into ..._<date>_DeepSeek.txt).
set -euo pipefail
lm=${MEGATRON_LM_PATH:?set MEGATRON_LM_PATH to a Megatron-LM checkout}
only=${PLAN_ONLY:-}
out=benchmarks/results/plan_examples_$(date +%F)${only:+_$only}
common=(--transformer-impl local --seq-length 4096 --max-position-embeddings 4096
  --micro-batch-size 1 --lr 1e-4 --train-iters 1000 --tokenizer-type NullTokenizer --bf16
  --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
  --untie-embeddings-and-output-weights --use-distributed-optimizer --mock-data
  --eval-iters 0 --eval-interval 100000)
# Llama-3-70B's shape
dense=(--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64
  --group-query-attention --num-query-groups 8 --vocab-size 128255
  --tensor-model-parallel-size 8 --sequence-parallel --pipeline-model-parallel-size 8)
# DeepSeek-V3's shape: MLA, 3 dense layers then 58 MoE layers of 256 experts (8 routed, 1 shared),
# one MTP layer
moe=(--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128
  --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128
  --qk-pos-emb-head-dim 64 --v-head-dim 128 --qk-layernorm --vocab-size 129279
  --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048
  --moe-shared-expert-intermediate-size 2048 --moe-layer-freq "([0]*3+[1]*58)"
  --moe-token-dispatcher-type alltoall --moe-grouped-gemm --moe-router-score-function sigmoid
  --moe-router-enable-expert-bias --mtp-num-layers 1)
: > "$out.txt"
plan() {  # name nodes extra-args...
  local name=$1 nodes=$2 begin=$SECONDS; shift 2
  [[ $name == *"$only"* ]] || return 0
  echo "== $name on $((nodes * 8)) ranks" | tee -a "$out.txt"
  mmp plan --device s5000,h200 --nodes "$nodes" --nproc-per-node 8 \
    "$lm/pretrain_gpt.py" "${common[@]}" "$@" 2>/dev/null | tee -a "$out.txt"
  echo "(planned with its levers in $((SECONDS - begin)) s on $(nproc) cores)" | tee -a "$out.txt"
}
plan "70B dense, TP8 PP8" 8 "${dense[@]}" --global-batch-size 512
plan "70B dense, TP8 PP8 DP4" 32 "${dense[@]}" --global-batch-size 512
plan "DeepSeek-V3-class, PP8 EP8 DP8" 8 "${moe[@]}" --global-batch-size 512 \
  --pipeline-model-parallel-size 8 --decoder-first-pipeline-num-layers 5 \
  --expert-model-parallel-size 8
plan "DeepSeek-V3-class, PP16 EP16 DP16" 32 "${moe[@]}" --global-batch-size 1024 \
  --pipeline-model-parallel-size 16 --decoder-first-pipeline-num-layers 1 \
  --expert-model-parallel-size 16
echo "wrote $out.txt"
