#!/usr/bin/env bash
# The quickstart's environment: VENV with only what the run needs (torch, megatron-core, and this
# checkout's package with its training and data extras), made by uv.
#
#   bash examples/quickstart/environment.sh VENV
#
# - uv: the one on PATH, else uv $UV_VERSION installed once by pip into the cache
#   (${MMP_CACHE_DIR:-~/.cache/megatron_musa_patch}/uv-<version>), through pip's own sources.
# - Sources: pip's (index, extra indexes, find-links, certificate), translated by pip_to_uv.py:
#   uv reads no pip configuration, and would otherwise fetch everything from PyPI.
# - Versions: torch==$TORCH_VERSION (default 2.13.0, inside the support table); megatron-core the
#   newest the project's constraints (scripts/constraints.txt) and this Python allow (0.16.1 on
#   Python 3.11, 0.19 on 3.12).
# - A VENV that already imports torch, megatron.core and the data extras keeps them: only this
#   checkout's package is reinstalled (without its dependencies), so a development environment
#   made by scripts/bootstrap.sh is not moved to other releases.
# - Without uv (no PyPI access for it), python -m venv and pip do the same, slower.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$REPO/examples/quickstart
venv=${1:?usage: environment.sh VENV}
python=${PYTHON:-python3}
torch_version=${TORCH_VERSION:-2.13.0}
uv_version=${UV_VERSION:-0.13.9}
cache=${MMP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/megatron_musa_patch}
constraints=$REPO/scripts/constraints.txt
lean=("torch==$torch_version" "$REPO[training,data]")

find_uv() {  # prints the uv to use, or nothing
  if command -v uv >/dev/null 2>&1; then command -v uv; return; fi
  local dir=$cache/uv-$uv_version
  if [ ! -x "$dir/bin/uv" ]; then
    rm -rf "$dir.partial"
    mkdir -p "$cache"
    "$python" -m pip install --quiet --disable-pip-version-check --target "$dir.partial" \
      "uv==$uv_version" >&2 && mv "$dir.partial" "$dir" || { rm -rf "$dir.partial"; return 0; }
  fi
  echo "$dir/bin/uv"
}

has_packages() {  # found, not imported (importing megatron.core and transformers takes seconds)
  "$1" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in \
('torch', 'megatron.core', 'tokenizers', 'transformers')))" 2>/dev/null
}

python=$("$python" -c 'import sys; print(sys.executable)')  # a pyenv shim -> the interpreter
uv=$(find_uv)
if [ -z "$uv" ]; then
  echo "uv $uv_version could not be installed (above): python -m venv and pip instead (slower)"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  if has_packages "$venv/bin/python"; then
    "$venv/bin/python" -m pip install --quiet --no-deps --force-reinstall "$REPO"
  else
    PIP_CONSTRAINT=$constraints "$venv/bin/python" -m pip install --quiet "${lean[@]}"
  fi
  exit 0
fi

options=()
while IFS= read -r line; do
  case "$line" in
    "env "*) export "${line#env }" ;;
    ?*) options+=("$line") ;;
  esac
done < <("$python" "$HERE/pip_to_uv.py")

if [ -x "$venv/bin/python" ] && has_packages "$venv/bin/python"; then
  echo "$venv has torch, megatron-core and the data extras: reinstalling only this checkout's package"
  "$uv" pip install --quiet --python "$venv/bin/python" "${options[@]}" --no-deps \
    --reinstall-package megatron-musa-patch "$REPO"
else
  # --seed: pip in the venv too, for what is installed later (scripts/bootstrap.sh uses it)
  [ -x "$venv/bin/python" ] || "$uv" venv --quiet --seed --python "$python" "${options[@]}" "$venv"
  "$uv" pip install --quiet --python "$venv/bin/python" "${options[@]}" \
    --constraint "$constraints" "${lean[@]}"
fi
