#!/usr/bin/env bash
# Packs what benchmarks/e2e_gpu.py needs on a GPU machine that has torch with CUDA but no
# network, into .e2e/ (git-ignored; about 5 MiB, within the device tool's 64 MiB):
#
#   .e2e/whl/          wheels for Python 3.12 / x86-64: the megatron-core release of the
#                      checkout, pydantic (megatron.training imports megatron.rl, which imports
#                      it) with its needs, PyYAML, and Liger-Kernel (scripts/gpu_check.sh
#                      compares against it)
#   .e2e/Megatron-LM/  the parts of the checkout pretrain_gpt.py runs from: pretrain_gpt.py,
#                      gpt_builders.py, model_provider.py, megatron/core/package_info.py, and
#                      for 0.16 (whose wheel has no megatron.training) megatron/training,
#                      legacy, rl, post_training; from 0.17 the wheel ships megatron.training
#                      and the checkout's rl/post_training (the core itself always comes from
#                      the wheel, for upstream and the layer alike)
#
# Run here (package registries reachable), for the newest supported release by default:
#   MEGATRON_LM_PATH=<core_v0.19.0 checkout> bash benchmarks/e2e_gpu_pack.sh
# (MEGATRON_CORE_WHEEL=0.19.2 picks the wheel; a core_v0.16.1 checkout packs megatron-core 0.16.1)
# Then on the GPU machine, with .e2e carried:  bash benchmarks/e2e_gpu.sh  (issue 10), and
# scripts/gpu_check.sh (the csrc kernels, issue 6)
set -euo pipefail
cd "$(dirname "$0")/.."
LM=${MEGATRON_LM_PATH:?set MEGATRON_LM_PATH to a Megatron-LM checkout of a supported tag (core_v0.19.0 for the newest)}
PY=${PYTHON:-python3}
PYVER=${E2E_PYTHON_VERSION:-3.12}   # the GPU image's python (KINDS.md: 3.12)
DEST=.e2e

version=$(grep -E "^(MAJOR|MINOR|PATCH) *=" "$LM/megatron/core/package_info.py" | awk '{print $3}' | paste -sd.)
series=${version%.*}
case "$series" in
  0.16) core=0.16.1; training_from=checkout ;;
  0.17) core=${MEGATRON_CORE_WHEEL:-0.17.1}; training_from=wheel ;;
  0.18) core=${MEGATRON_CORE_WHEEL:-0.18.2}; training_from=wheel ;;
  0.19) core=${MEGATRON_CORE_WHEEL:-0.19.2}; training_from=wheel ;;
  *) echo "$LM is Megatron-LM $version, not a supported release (megatron_musa_patch/upstream/tables.py)" >&2; exit 1 ;;
esac
WHEELS=("megatron-core==$core" "pydantic==2.14.4" "pydantic-core==2.50.5"
        "annotated-types==0.8.0" "typing-inspection==0.4.5" "pyyaml==6.0.3"
        "liger-kernel==0.8.5")   # Liger: the comparison column of bench_kernels.py

rm -rf "$DEST"
mkdir -p "$DEST/whl" "$DEST/Megatron-LM/megatron/core"
echo "== wheels for Python $PYVER (x86-64)"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$DEST/whl" "${WHEELS[@]}"
ls "$DEST/whl"

echo "== Megatron-LM $version subset from $LM (megatron.training from the $training_from)"
cp "$LM"/{pretrain_gpt.py,gpt_builders.py,model_provider.py} "$DEST/Megatron-LM/"
parts="rl post_training"
[ "$training_from" = checkout ] && parts="training legacy rl post_training"
for part in $parts; do
    [ -d "$LM/megatron/$part" ] && cp -r "$LM/megatron/$part" "$DEST/Megatron-LM/megatron/"
done
cp "$LM/megatron/core/package_info.py" "$DEST/Megatron-LM/megatron/core/"
find "$DEST" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$DEST"
grep -qxF "/.e2e/" .gitignore || echo "note: add /.e2e/ to .gitignore so the pack is not committed"
