#!/usr/bin/env bash
# Sets up .venv for this checkout: the CPU build of torch the project pins, then the package
# (a regular install, so the MEGATRON_MUSA_PATCH=1 start-up hook is in place) with the extras
# for Megatron-LM's training scripts, the data pipeline and the tests, and the musa extra
# (torchada): the MUSA row's contract tests run it against the stand-in torch_musa. It is only
# installed here, never imported on the cpu row (its import writes symlinks into its own
# package directory and sets SGLANG_/VLLM_ variables even where it maps nothing), which is why
# it is not in the test extra. Safe to re-run.
#   PYTHON=python3.11 TORCH_VERSION=2.13.0 bash scripts/bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
torch_version=${TORCH_VERSION:-2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==${torch_version}"
.venv/bin/python -m pip install --quiet ".[training,data,test,musa]"
echo "bootstrap: $(.venv/bin/python -c 'import torch, megatron.core as m; print("torch", torch.__version__, "| megatron-core", m.__version__)')"
