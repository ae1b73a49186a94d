# Sourced by benchmarks/e2e_gpu.sh and scripts/gpu_check.sh on a machine without network:
# installs the wheels benchmarks/e2e_gpu_pack.sh put in .e2e/whl into a private directory and
# puts it first on PYTHONPATH. Without .e2e/whl it does nothing (returns 1).
packed_wheels() {
    local py=${1:-python3} site=${E2E_SITE:-/tmp/mmp-e2e-site} start=$(date +%s)
    [ -d .e2e/whl ] || return 1
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .e2e/whl/*.whl || return 1
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    echo "packed wheels installed in $(( $(date +%s) - start )) s: $(ls .e2e/whl | tr '\n' ' ')"
}
