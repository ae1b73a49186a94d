"""megatron-core's HybridDeviceOptimizer on the CPU row, one process (no distributed setup).

Upstream decides with ``Tensor.is_cuda`` (False for everything here) and so offloads nothing;
through the layer the fraction F is stepped by host optimizers on host copies of their own,
the results are copied back, and the weights match plain ``torch.optim.AdamW(fused=True)``
bit for bit (host and device sides run the same kernel).
"""

import json

import pytest

from tests.conftest import run_python, subprocess_env

SCRIPT = r"""
import json, sys, torch
import megatron_musa_patch
from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer
from megatron_musa_patch.lib.offload.counting import placement

fraction, overlap, dtype = float(sys.argv[1]), sys.argv[2] == "1", getattr(torch, sys.argv[3])
torch.manual_seed(0)
shapes = [(64, 32), (32,), (128, 16), (16,), (48, 48)]
start = [torch.randn(s).to(dtype) for s in shapes]
grads = [[torch.randn(s) * 1e-2 for s in shapes] for _ in range(4)]
hyper = dict(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)

params = [p.clone() for p in start]
hdo = HybridDeviceOptimizer(
    [{"params": params[:2], "wd_mult": 1.0}, {"params": params[2:], "wd_mult": 0.0}],
    offload_fraction=fraction, cpu_optimizer_cls=torch.optim.AdamW,
    gpu_optimizer_cls=torch.optim.AdamW, param_update_in_fp32=True,
    overlap_cpu_optimizer_d2h_h2d=overlap, fused=True, **hyper)
for step in grads:
    for p, g in zip(params, step):
        p.decoupled_grad = g.to(dtype)
    hdo.step()
    hdo.zero_grad()

ref = [p.clone().float() for p in start]
opt = torch.optim.AdamW(ref, fused=True, **hyper)
for step in grads:
    for p, g in zip(ref, step):
        p.grad = g.to(dtype).float()
    opt.step()

print("RESULT" + json.dumps({
    "equal": all(torch.equal(p, r.to(dtype)) for p, r in zip(params, ref)),
    "changed": all(not torch.equal(p, s) for p, s in zip(params, start)),
    "placement": placement(hdo),
    "d2h_stream_is_current": hdo._d2h_stream is torch.cuda.current_stream(),
    "stream": type(hdo._d2h_stream).__module__,
}))
"""


def run(fraction, overlap=False, dtype="float32"):
    proc = run_python(SCRIPT, args=(str(fraction), "1" if overlap else "0", dtype),
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
