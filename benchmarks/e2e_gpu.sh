#!/usr/bin/env bash
# Issue 10's end-to-end comparison on a GPU machine without network, in one command:
# installs the wheels packed by benchmarks/e2e_gpu_pack.sh (.e2e/whl) into a private
# directory, then runs benchmarks/e2e_gpu.py on the packed Megatron-LM subset. Everything it
# writes (logs, e2e.json) goes to $OUT (default ./e2e-out). Extra arguments go to e2e_gpu.py,
# e.g. --runs upstream,layer or --budget-s 300.
#
#   here:  MEGATRON_LM_PATH=... bash benchmarks/e2e_gpu_pack.sh
#   there: bash benchmarks/e2e_gpu.sh            (with .e2e carried)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/e2e-out}
mkdir -p "$OUT"
. scripts/packed_wheels.sh
packed_wheels "$PY" || { echo "no usable .e2e/whl: run benchmarks/e2e_gpu_pack.sh here first and carry .e2e" >&2; exit 2; }
nvidia-smi -L 2>/dev/null || true
exec "$PY" benchmarks/e2e_gpu.py --lm .e2e/Megatron-LM --out "$OUT" "$@"
