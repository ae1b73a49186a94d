#!/usr/bin/env bash
# Quickstart: from a fresh clone to a trained (tiny) Llama-style model on 2 CPU ranks.
#
#   bash examples/quickstart.sh            # the whole thing (clones Megatron-LM if needed)
#   bash examples/quickstart.sh --ci       # CI mode (or --offline): never clones; see below
#
# Steps: (1) an environment with the package and only what the run needs
# (examples/quickstart/environment.sh -> .venv, made by uv), (2) Megatron-LM, (3) an offline
# corpus from text every Python has (help topics + standard-library source), (4) a tokenizer
# (mmp data train-tokenizer), (5) .bin/.idx pairs (mmp data prepare), (6) DATA_PATH (mmp data
# blend), (7) training through `mmp run` on 2 CPU ranks in TP2, stopping half-way with a
# checkpoint, (8) resuming from it to the end, then the loss curve and throughput (tokens/s per
# device, MFU). Each step prints how long it took, and the end a table of all of them with the
# total.
#
# Megatron-LM (the tag of the installed megatron-core's release: core_v0.16.1 on Python 3.11,
# core_v0.19.0 with megatron-core 0.19) is found through MEGATRON_LM_PATH, then the cache
# ${MMP_CACHE_DIR:-~/.cache/megatron_musa_patch}/Megatron-LM-<tag>, then a shallow
# `git clone` into that cache. With a checkout, steps 7-8 run the stock pretrain_gpt.py. In
# --ci mode nothing is cloned: without a checkout the prepared data is trained on through the
# megatron-core path instead (examples/quickstart/train_core.py: megatron-core's GPTDataset and
# GPT model, not pretrain_gpt.py), and the output says so.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bash examples/quickstart.sh [--ci] [--python PY] [--workdir DIR] [--iters N] [--no-clone]
  --ci           CI mode (alias --offline): never clone Megatron-LM; without a checkout, train
                 through megatron-core instead of the stock pretrain_gpt.py
  --python PY    use this Python environment as it is (no .venv is made or changed)
  --workdir DIR  corpus, tokenizer, data, checkpoints and logs (default: ./quickstart-run)
  --iters N      training iterations, checkpoint at N/2 (default 40)
  --no-clone     do not git clone Megatron-LM when no checkout is found
environment: MEGATRON_LM_PATH (a checkout of the installed release's tag), MMP_CACHE_DIR,
             TORCH_VERSION (default 2.13.0), PYTHON (the interpreter .venv is made from)
EOF
}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$REPO/examples/quickstart
CI=0 PY="" WORKDIR="$PWD/quickstart-run" ITERS=40 CLONE=1 OFF_SWITCH=--no-clone
while [ $# -gt 0 ]; do
  case "$1" in
    --ci|--offline) CI=1; CLONE=0; OFF_SWITCH=$1 ;;
    --python) PY=${2:?--python needs a path}; shift ;;
    --workdir) WORKDIR=${2:?--workdir needs a directory}; shift ;;
    --iters) ITERS=${2:?--iters needs a number}; shift ;;
    --no-clone) CLONE=0; OFF_SWITCH=--no-clone ;;
    -h|--help) usage; exit 0 ;;
    *) echo "quickstart: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$ITERS" in ''|*[!0-9]*) echo "quickstart: --iters must be a number >= 4" >&2; exit 2 ;; esac
[ "$ITERS" -ge 4 ] || { echo "quickstart: --iters must be a number >= 4" >&2; exit 2; }
HALF=$((ITERS / 2))
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
START=$(now)
NSTEP=0 STEP_START="" STEP_NAME="" TIMES=()
end_step() {  # the duration of the step that is running, printed and kept for the table
  [ -n "$STEP_START" ] || return 0
  local took
  took=$(elapsed "$STEP_START" "$(now)")
  printf -- '-- [%s] took %s s\n' "$NSTEP" "$took"
  TIMES+=("$(printf '%6s s  [%s] %s' "$took" "$NSTEP" "$STEP_NAME")")
  STEP_START=""
}
step() {
  end_step
  NSTEP=$((NSTEP + 1)) STEP_NAME="$*" STEP_START=$(now)
  printf '\n== [%s] %s\n' "$NSTEP" "$*"
}
die() { printf '\nquickstart: error: %s\n' "$*" >&2; exit 1; }

# which training path this run takes, said before anything starts (the checkout's tag is known
# once the environment is, in step 2; a cached checkout of any tag counts here)
CACHE_ROOT=${MMP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/megatron_musa_patch}
STOCK_CMD="MEGATRON_LM_PATH=/path/to/Megatron-LM bash examples/quickstart.sh $([ "$CI" = 1 ] \
&& echo "$OFF_SWITCH" || echo --no-clone)"
if [ -n "${MEGATRON_LM_PATH:-}" ]; then
  echo "quickstart: training with the stock pretrain_gpt.py of MEGATRON_LM_PATH=$MEGATRON_LM_PATH"
elif compgen -G "$CACHE_ROOT/Megatron-LM-core_v*/pretrain_gpt.py" >/dev/null; then
  echo "quickstart: training with the stock pretrain_gpt.py of the cached checkout in \
$CACHE_ROOT that matches the installed megatron-core (step 2 says which)"
elif [ "$CLONE" = 1 ]; then
  echo "quickstart: training with the stock pretrain_gpt.py of a Megatron-LM checkout cloned into \
$CACHE_ROOT in step 2"
elif [ "$CI" = 1 ]; then
  echo "quickstart: no Megatron-LM checkout (MEGATRON_LM_PATH is unset, none in $CACHE_ROOT) and \
$OFF_SWITCH: this run trains through megatron-core alone (examples/quickstart/train_core.py), not \
the stock pretrain_gpt.py. For the stock path, with a checkout of your megatron-core's tag \
(core_v0.16.1 ... core_v0.19.0): $STOCK_CMD"
fi

# --------------------------------------------------------------------------- 1. environment
step "environment"
if [ -n "$PY" ]; then
  command -v "$PY" >/dev/null 2>&1 || die "--python $PY: no such interpreter"
  echo "using $PY as it is (no .venv)"
else
  bash "$HERE/environment.sh" "$REPO/.venv" || die "making .venv failed (see above): it needs \
Python >= 3.10, and access to PyPI (or pip's configured index) for uv, torch, megatron-core and \
the data extras"
  PY=$REPO/.venv/bin/python
fi
# the packages are there (found, not imported: importing megatron.core and transformers takes
# seconds here, and the steps below import what each needs)
"$PY" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in \
('megatron_musa_patch', 'megatron.core', 'tokenizers', 'transformers', 'torch')))" \
  2>/dev/null || die "$PY cannot import megatron_musa_patch, megatron.core, tokenizers, \
transformers and torch. Install them there (pip install \"$REPO[training,data]\"), or drop \
--python to let examples/quickstart/environment.sh make .venv"
mmp() { "$PY" -c 'import _megatron_musa_patch_boot as boot; boot.cli()' "$@"; }
CORES=$(nproc 2>/dev/null || echo 2)
THREADS=$((CORES / 2)); [ "$THREADS" -ge 1 ] || THREADS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$THREADS}  # 2 ranks share the cores
export MEGATRON_MUSA_PATCH_DEVICE=${MEGATRON_MUSA_PATCH_DEVICE:-cpu}
echo "$("$PY" -c 'import sys; from importlib.metadata import version as v
print("python", sys.version.split()[0], "| torch", v("torch"), "| megatron-core", v("megatron-core"))')"\
" | device $MEGATRON_MUSA_PATCH_DEVICE | OMP_NUM_THREADS=$OMP_NUM_THREADS"

# the Megatron-LM tag that goes with the installed megatron-core (megatron_musa_patch/upstream/tables.py)
LM_TAG=$(MEGATRON_MUSA_PATCH_AUTOACTIVATE=0 "$PY" -c 'from importlib.metadata import version
from megatron_musa_patch.upstream import tables
from megatron_musa_patch.upstream.ranges import row_of
found = row_of(tables.MEGATRON, version("megatron-core"))
print(found.lm_tag if found else "")')
[ -n "$LM_TAG" ] || die "the installed megatron-core is not a release this layer supports \
(megatron_musa_patch/upstream/tables.py); install one (pip install \"$REPO[training,data]\")"

# --------------------------------------------------------------------------- 2. Megatron-LM
step "Megatron-LM ($LM_TAG)"
CACHE=${MMP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/megatron_musa_patch}/Megatron-LM-$LM_TAG
LM="" WHY=""
if [ -n "${MEGATRON_LM_PATH:-}" ]; then
  [ -f "$MEGATRON_LM_PATH/pretrain_gpt.py" ] || die "MEGATRON_LM_PATH=$MEGATRON_LM_PATH has no \
pretrain_gpt.py. Point it at a Megatron-LM checkout of tag $LM_TAG (git clone --branch $LM_TAG \
--depth 1 https://github.com/NVIDIA/Megatron-LM), or unset it"
  LM=$MEGATRON_LM_PATH
  echo "MEGATRON_LM_PATH: $LM"
elif [ -f "$CACHE/pretrain_gpt.py" ]; then
  LM=$CACHE
  echo "cached checkout: $LM"
elif [ "$CLONE" = 1 ]; then
  echo "no MEGATRON_LM_PATH and no checkout in $CACHE: cloning tag $LM_TAG there"
  mkdir -p "$(dirname "$CACHE")"
  rm -rf "$CACHE.partial"
  LIMIT=(); command -v timeout >/dev/null 2>&1 && LIMIT=(timeout 600)
  if command -v git >/dev/null 2>&1 && GIT_TERMINAL_PROMPT=0 ${LIMIT[@]+"${LIMIT[@]}"} git clone --quiet \
      --branch "$LM_TAG" --depth 1 https://github.com/NVIDIA/Megatron-LM "$CACHE.partial"; then
    mv "$CACHE.partial" "$CACHE"
    LM=$CACHE
  else
    rm -rf "$CACHE.partial"
    WHY="git clone of https://github.com/NVIDIA/Megatron-LM failed (no git, or no access to GitHub)"
  fi
else
  WHY="MEGATRON_LM_PATH is unset, there is no checkout in $CACHE, and cloning is off ($OFF_SWITCH)"
fi
if [ -z "$LM" ] && [ "$CI" = 0 ]; then
  die "the training steps need Megatron-LM ($LM_TAG) and none was found: $WHY. Fix, either:
  git clone --branch $LM_TAG --depth 1 https://github.com/NVIDIA/Megatron-LM $CACHE
  (or clone it anywhere and set MEGATRON_LM_PATH=/path/to/Megatron-LM), then run this again;
  or run 'bash examples/quickstart.sh --ci', which trains through megatron-core alone."
fi
[ -n "$LM" ] || echo "not found: $WHY"

# --------------------------------------------------------------------------- 3-6. data
mkdir -p "$WORKDIR"
cd "$WORKDIR"
step "offline corpus (Python's help topics and standard-library source)"
"$PY" "$HERE/make_corpus.py" corpus --max-mb 2 || die "building the corpus failed (see above)"

step "tokenizer: mmp data train-tokenizer"
mmp data train-tokenizer --input corpus --vocab-size 4096 --output-dir tokenizer --force \
  || die "mmp data train-tokenizer failed (see above)"

step "tokenize and binarize: mmp data prepare"
mmp data prepare --input corpus --output-dir data --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model tokenizer --append-eod --workers 2 || die "mmp data prepare failed (see above)"

step "weighted DATA_PATH: mmp data blend"
DATA_PATH=$(mmp data blend data) || die "mmp data blend failed (see above)"
echo "DATA_PATH=$DATA_PATH"

# --------------------------------------------------------------------------- 7-8. training
run_logged() {  # run_logged LOG COMMAND...: the full log to LOG, a short line per iteration here
  local log=$1 rc
  shift
  set +e
  "$@" 2>&1 | tee "$log" | "$PY" "$HERE/summarize.py" --follow
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" != 0 ]; then
    echo "---- last lines of $log ----" >&2
    tail -n 25 "$log" >&2
    die "training exited with status $rc; the full log is $log"
  fi
}
TORCHRUN=(run --standalone --nproc-per-node 2)
rm -rf checkpoints
if [ -n "$LM" ]; then
  # a tiny Llama: RMSNorm, SwiGLU, GQA, RoPE, no biases, untied embeddings, on the local (no
  # TransformerEngine) spec with upstream's fusion defaults (the layer's fused ops) and core
  # attention through SDPA.
  # Two choices keep start-up and saving out of the way at this size (measured on 2 cores):
  # - the fused ops run their eager formulas: torch.compile of the RMSNorm (chosen by size on
  #   the CPU) took 45 s in the first job and 18 s in the resumed one, for 40 iterations of
  #   0.4 s that it does not make faster; set MEGATRON_MUSA_PATCH_OPS yourself to override;
  # - the legacy torch checkpoint format: torch_dist's writer starts a spawned multiprocessing
  #   Manager on every rank at each save, which re-imports pretrain_gpt.py (7 s a save here, 30 ms
  #   for the torch format). Resume is bit for bit in both (tests/training/test_resume.py).
  export MEGATRON_MUSA_PATCH_OPS=${MEGATRON_MUSA_PATCH_OPS:-eager}
  ARGS=(
    --transformer-impl local --use-flash-attn
    --num-layers 4 --hidden-size 128 --ffn-hidden-size 352 --num-attention-heads 4
    --group-query-attention --num-query-groups 2 --seq-length 128 --max-position-embeddings 128
    --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear
    --untie-embeddings-and-output-weights --hidden-dropout 0 --attention-dropout 0
    --tensor-model-parallel-size 2 --distributed-backend nccl
    --micro-batch-size 4 --global-batch-size 8 --train-iters "$ITERS"
    --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 4 --lr-decay-style cosine --weight-decay 0.01
    --clip-grad 1.0 --seed 1234 --use-cpu-initialization
    --data-path $DATA_PATH --split 100,0,0 --data-cache-path data-cache
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer
    --log-interval 1 --eval-iters 0 --eval-interval 1000000
    --save checkpoints --save-interval "$HALF" --ckpt-format torch
  )
  step "train with the stock pretrain_gpt.py (mmp run, 2 CPU ranks, TP2): iterations 1-$HALF, then a checkpoint"
  run_logged train-1.log mmp "${TORCHRUN[@]}" "$LM/pretrain_gpt.py" "${ARGS[@]}" --exit-interval "$HALF"
  [ "$(cat checkpoints/latest_checkpointed_iteration.txt 2>/dev/null)" = "$HALF" ] \
    || die "no checkpoint at iteration $HALF in $WORKDIR/checkpoints (see train-1.log)"
  step "resume from the checkpoint: iterations $((HALF + 1))-$ITERS"
  run_logged train-2.log mmp "${TORCHRUN[@]}" "$LM/pretrain_gpt.py" "${ARGS[@]}" --load checkpoints
  grep -q "successfully loaded checkpoint from checkpoints .*at iteration $HALF" train-2.log \
    || die "the second run did not resume from iteration $HALF (see train-2.log)"
  echo "(Megatron logs the mean of two iterations on the second line after a resume.)"
  PATH_TAKEN="stock pretrain_gpt.py from $LM"
else
  echo
  echo "SKIPPED: the stock pretrain_gpt.py steps ($WHY)."
  echo "Training on the same data through the megatron-core path instead: megatron-core's own"
  echo "GPTDataset, GPT model and optimizer (examples/quickstart/train_core.py),"
  echo "not the stock script. For the stock path: $STOCK_CMD"
  # the checkpoint in Megatron-LM's torch format, as the stock steps above: dist_checkpointing's
  # writer starts a multiprocessing Manager on each rank at the first save (7 s here)
  CORE=(--data-path "$DATA_PATH" --tokenizer-model tokenizer --tp 2 --iters "$ITERS"
        --cache data-cache --ckpt-format torch)
  step "train through megatron-core (mmp run, 2 CPU ranks, TP2): iterations 1-$HALF, then a checkpoint"
  run_logged train-1.log mmp "${TORCHRUN[@]}" "$HERE/train_core.py" "${CORE[@]}" \
    --save checkpoints --save-at "$HALF" --exit-interval "$HALF" --losses losses-1.json
  grep -q "saved checkpoint checkpoints at iteration $HALF" train-1.log \
    || die "no checkpoint at iteration $HALF in $WORKDIR/checkpoints (see train-1.log)"
  step "resume from the checkpoint: iterations $((HALF + 1))-$ITERS"
  run_logged train-2.log mmp "${TORCHRUN[@]}" "$HERE/train_core.py" "${CORE[@]}" \
    --load checkpoints --losses losses-2.json
  grep -q "loaded checkpoint checkpoints at iteration $HALF" train-2.log \
    || die "the second run did not resume from iteration $HALF (see train-2.log)"
  PATH_TAKEN="megatron-core path (no Megatron-LM checkout)"
fi

# --------------------------------------------------------------------------- summary
step "loss curve and throughput ($PATH_TAKEN)"
"$PY" "$HERE/summarize.py" train-1.log train-2.log --json summary.json || die "training did not learn (see above)"
end_step
echo
echo "time per step:"
printf '  %s\n' "${TIMES[@]}"
echo "quickstart finished in $(elapsed "$START" "$(now)") s; everything is in $WORKDIR"
