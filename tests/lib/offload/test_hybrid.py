"""megatron-core's HybridDeviceOptimizer on the CPU row, one process (no distributed setup).

Upstream decides with ``Tensor.is_cuda`` (False for everything here) and so offloads nothing;
through the layer the fraction F is stepped by host optimizers on host copies of their own,
the results are copied back, and the weights match plain ``torch.optim.AdamW(fused=True)``
bit for bit (host and device sides run the same kernel).
"""

import json

import pytest

from tests.conftest import run_probe, subprocess_env

PROBE = "tests.lib.offload.probes.hybrid_cpu"


def run(fraction, overlap=False, dtype="float32"):
    proc = run_probe(PROBE, fraction, "1" if overlap else "0", dtype,
                     env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"))
    assert "RESULT" in proc.stdout, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


@pytest.mark.parametrize("fraction,overlap,host_params", [
    (1.0, False, 5), (0.5, False, 3), (0.5, True, 3), (0.01, True, 1)])
def test_fraction_is_stepped_on_host_copies_and_matches_fused_adamw(fraction, overlap,
                                                                    host_params):
    res = run(fraction, overlap)
    placed = res["placement"]
    assert res["equal"] and res["changed"], res
    assert placed["host_params"] == host_params and placed["host_tensors_separate"], placed
    assert placed["device_params"] == 5 - host_params, placed
    assert placed["host_state_on_host"] and placed["host_state_bytes"] == 8 * placed["host_numel"]
    assert res["stream"] == "megatron_musa_patch.device.cpu_api"
    assert res["d2h_stream_is_current"] is (not overlap)
    assert placed["host_optimizers"] == (host_params if overlap else 1)  # per param / one
    assert placed["pinned"] == 0  # the CPU row has no page-locked memory to give


def test_bf16_parameters_are_stepped_on_fp32_masters_on_both_sides():
    res = run(0.5, True, "bfloat16")
    assert res["equal"] and res["changed"], res
    assert res["placement"]["host_state_bytes"] == 8 * res["placement"]["host_numel"]
