#!/usr/bin/env bash
# One short check of the csrc kernels on a GPU (CUDA or MUSA): build the extension, run
# tests/lib/ops/test_kernels_gpu.py, print the bandwidth table (benchmarks/bench_kernels.py).
# Installs nothing and downloads nothing: the python used needs torch (a CUDA build, or
# torch_musa), nvcc / mcc, ninja and pytest. Budget: about 3 minutes, at most ~6 (each step has a timeout).
#
#   scripts/gpu_check.sh              # PYTHON=... picks the interpreter, OUT=... the log dir
#   BENCH_ARGS=--no-compile scripts/gpu_check.sh   # skip the torch.compile column
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-${TMPDIR:-/tmp}/mmp_gpu_check}
mkdir -p "$OUT"
export MEGATRON_MUSA_PATCH_AUTOACTIVATE=0          # measure the ops, do not patch torch
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$OUT/torch_extensions}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
step() { echo; echo "== $1 (t=$(( $(date +%s) - start ))s)"; }

. scripts/packed_wheels.sh
packed_wheels "$PY" || true   # Liger-Kernel's column, when benchmarks/e2e_gpu_pack.sh was run

step "environment"
(nvidia-smi -L || mthreads-gmi) 2>/dev/null | head -4
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

step "build the extension (first use; cached in $TORCH_EXTENSIONS_DIR)"
timeout 240 $PY - <<'PYEOF' 2>&1 | tee "$OUT/build.log"
import sys, time
import torch
t0 = time.time()
from megatron_musa_patch.lib.ops import kernels
dev = "cuda" if (torch.version.cuda and torch.cuda.is_available()) else "musa"
ok = kernels.available("rms_norm_fwd", dev) and all(kernels.available(op, dev) for op in kernels.OPS)
print(kernels.status(dev), f"({time.time() - t0:.0f}s)")
sys.exit(0 if ok else 1)
PYEOF
rc_build=${PIPESTATUS[0]}

step "tests/lib/ops/test_kernels_gpu.py (numerics vs torch references)"
timeout 120 $PY -m pytest -q -p no:cacheprovider -rs tests/lib/ops/test_kernels_gpu.py 2>&1 | tee "$OUT/tests.log" | tail -25
rc_tests=${PIPESTATUS[0]}

step "bandwidth table"
timeout 180 $PY benchmarks/bench_kernels.py --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
rc_bench=${PIPESTATUS[0]}

step "done"
echo "build rc=$rc_build  tests rc=$rc_tests  bench rc=$rc_bench  (logs in $OUT)"
[ "$rc_build" = 0 ] && [ "$rc_tests" = 0 ] && [ "$rc_bench" = 0 ]
