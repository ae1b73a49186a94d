#!/usr/bin/env bash
# Packs what benchmarks/e2e_gpu.py needs on a GPU machine that has torch with CUDA but no
# network, into .e2e/ (git-ignored; about 5 MiB, within the device tool's 64 MiB):
#
#   .e2e/whl/          wheels for Python 3.12 / x86-64: megatron-core 0.16.1, pydantic
#                      (megatron.training imports megatron.rl, which imports it) with its
#                      needs, and Liger-Kernel (scripts/gpu_check.sh compares against it)
#   .e2e/Megatron-LM/  the parts of a core_v0.16.1 checkout pretrain_gpt.py runs from:
#                      pretrain_gpt.py, gpt_builders.py, model_provider.py, megatron/training,
#                      legacy, rl, post_training, and megatron/core/package_info.py only (the
#                      core itself comes from the wheel, for upstream and the layer alike)
#
# Run here (package registries reachable): MEGATRON_LM_PATH=... bash benchmarks/e2e_gpu_pack.sh
# Then on the GPU machine, with .e2e carried:  bash benchmarks/e2e_gpu.sh  (issue 10), and
# scripts/gpu_check.sh (the csrc kernels, issue 6)
set -euo pipefail
cd "$(dirname "$0")/.."
LM=${MEGATRON_LM_PATH:?set MEGATRON_LM_PATH to a Megatron-LM checkout of tag core_v0.16.1}
PY=${PYTHON:-python3}
PYVER=${E2E_PYTHON_VERSION:-3.12}   # the GPU image's python (KINDS.md: 3.12)
DEST=.e2e
WHEELS=("megatron-core==0.16.1" "pydantic==2.14.4" "pydantic-core==2.50.5"
        "annotated-types==0.8.0" "typing-inspection==0.4.5"
        "liger-kernel==0.8.5")   # Liger: the comparison column of bench_kernels.py

version=$(grep -E "^(MAJOR|MINOR|PATCH) *=" "$LM/megatron/core/package_info.py" | awk '{print $3}' | paste -sd.)
[ "$version" = "0.16.1" ] || { echo "$LM is Megatron-LM $version, not core_v0.16.1" >&2; exit 1; }

rm -rf "$DEST"
mkdir -p "$DEST/whl" "$DEST/Megatron-LM/megatron/core"
echo "== wheels for Python $PYVER (x86-64)"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$DEST/whl" "${WHEELS[@]}"
ls "$DEST/whl"

echo "== Megatron-LM subset from $LM"
cp "$LM"/{pretrain_gpt.py,gpt_builders.py,model_provider.py} "$DEST/Megatron-LM/"
for part in training legacy rl post_training; do
    cp -r "$LM/megatron/$part" "$DEST/Megatron-LM/megatron/"
done
cp "$LM/megatron/core/package_info.py" "$DEST/Megatron-LM/megatron/core/"
find "$DEST" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$DEST"
grep -qxF "/.e2e/" .gitignore || echo "note: add /.e2e/ to .gitignore so the pack is not committed"
