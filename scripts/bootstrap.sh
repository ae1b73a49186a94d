#!/usr/bin/env bash
# Sets up .venv for this checkout: the CPU build of torch the project pins, then the package
# (a regular install, so the MEGATRON_MUSA_PATCH=1 start-up hook is in place) with the extras
# for Megatron-LM's training scripts, the data pipeline and the tests. Safe to re-run.
#   PYTHON=python3.11 TORCH_VERSION=2.13.0 bash scripts/bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
torch_version=${TORCH_VERSION:-2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
# the pip a venv comes with is enough from 23 on (upgrading it costs a download and a pip run)
if ! .venv/bin/python -c 'import sys, pip; sys.exit(int(pip.__version__.split(".")[0]) < 23)'; then
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
# one pip run for torch and the package: one resolution, one start-up (the pin holds either way)
.venv/bin/python -m pip install --quiet "torch==${torch_version}" ".[training,data,test]"
# versions from the installed metadata: importing torch and megatron.core would take seconds
echo "bootstrap: $(.venv/bin/python -c 'from importlib.metadata import version as v
print("torch", v("torch"), "| megatron-core", v("megatron-core"))')"
