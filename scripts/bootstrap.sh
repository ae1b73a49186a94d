#!/usr/bin/env bash
# Sets up a virtual environment for this checkout: the pinned torch, then the package
# (a regular install, so the MEGATRON_MUSA_PATCH=1 start-up hook is in place) with the extras
# for Megatron-LM's training scripts, the data pipeline and the tests, and the musa extra
# (torchada): the MUSA row's contract tests run it against the stand-in torch_musa. It is only
# installed here, never imported on the cpu row (its import writes symlinks into its own
# package directory and sets SGLANG_/VLLM_ variables even where it maps nothing), which is why
# it is not in the test extra. Safe to re-run.
#   bash scripts/bootstrap.sh                          # .venv: Python 3, the oldest torch of the
#                                                      # table, megatron-core the newest pip allows
#   PYTHON=python3.12 VENV=.venv312 TORCH_VERSION=2.15.0 MEGATRON_CORE_VERSION=0.19.2 \
#     bash scripts/bootstrap.sh
#   PINS_ONLY=1 ... bash scripts/bootstrap.sh          # only the venv and the pins (no build of
#                                                      # this checkout): safe beside another run
# MEGATRON_CORE_VERSION is pinned in the same pip run, so the package's requirement (every
# supported release) keeps it. On Python 3.11 pip's newest megatron-core is 0.16.1; 0.17+ needs
# Python 3.12. What pip may install is said here, not by the machine: PIP_CONSTRAINT is the
# project's own scripts/constraints.txt (the support tables' ranges), which also takes the place
# of a machine-wide pip constraints file; the pins choose inside those ranges. torch from PyPI
# is a CUDA build (several GB; it runs on the CPU), except the CPU build of 2.13.0 that some
# machines keep for Python 3.11 (TORCH_VERSION=2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=${VENV:-.venv}
# the oldest torch of megatron_musa_patch/upstream/tables.py (tests/project/test_ci_pins.py)
torch_version=${TORCH_VERSION:-2.11.0}
export PIP_CONSTRAINT="$PWD/scripts/constraints.txt"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# the pip a venv comes with is enough from 23 on (upgrading it costs a download and a pip run)
if ! "$venv/bin/python" -c 'import sys, pip; sys.exit(int(pip.__version__.split(".")[0]) < 23)'; then
  "$venv/bin/python" -m pip install --quiet --upgrade pip
fi
pins=("torch==${torch_version}")
if [ -n "${MEGATRON_CORE_VERSION:-}" ]; then
  pins+=("megatron-core==${MEGATRON_CORE_VERSION}")
fi
if [ -n "${PINS_ONLY:-}" ]; then  # the bulk of the download (torch is 5 GB on Python 3.12)
  "$venv/bin/python" -m pip install --quiet "${pins[@]}"
  echo "bootstrap ($venv): pins installed: ${pins[*]}"
  exit 0
fi
# one pip run for the pins and the package: one resolution, one start-up
"$venv/bin/python" -m pip install --quiet "${pins[@]}" ".[training,data,checkpoint,test,musa]"
# dlrover-run for its test (tests/training/test_restarts.py): dlrover and what its standalone master
# imports (grpc, protobuf, kubernetes, tornado), without its pynvml, whose import warns in every
# process that imports torch.cuda (nothing here has NVML)
"$venv/bin/python" -m pip install --quiet grpcio protobuf kubernetes tornado deprecated requests \
  packaging psutil
"$venv/bin/python" -m pip install --quiet --no-deps "dlrover==0.6.1"
# ft_launcher for its test: nvidia-resiliency-ext 0.4.1, the newest whose wheels install before
# glibc 2.39, serves megatron-core 0.16 (Python 3.11 here); 0.17+ (Python 3.12) need >= 0.6.
# Without its pynvml too (nvidia-ml-py gives the same module without the warning)
if "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then
  "$venv/bin/python" -m pip install --quiet defusedxml nvidia-ml-py pyyaml
  "$venv/bin/python" -m pip install --quiet --no-deps "nvidia-resiliency-ext==0.4.1"
fi
# versions from the installed metadata: importing torch and megatron.core would take seconds
echo "bootstrap ($venv): $("$venv/bin/python" -c 'import sys
from importlib.metadata import version as v
print("python", sys.version.split()[0], "| torch", v("torch"), "| megatron-core", v("megatron-core"))')"
