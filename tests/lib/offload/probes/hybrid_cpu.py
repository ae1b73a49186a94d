"""megatron-core's HybridDeviceOptimizer on the CPU row, one process (no distributed setup):
four steps with offload fraction ``sys.argv[1]``, overlap ``sys.argv[2]`` ("1" or "0") and
parameters of dtype ``sys.argv[3]`` (a torch attribute: float32, bfloat16), against plain
``torch.optim.AdamW(fused=True)`` on fp32 copies. Prints ``RESULT<json>``: whether the weights
are equal and changed, the optimizer's placement, and its d2h stream.

Run by tests/lib/offload/test_hybrid.py."""

import json
import sys

import torch
import megatron_musa_patch  # activates the layer: before megatron is imported
from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer
from megatron_musa_patch.lib.offload.counting import placement

SHAPES = [(64, 32), (32,), (128, 16), (16,), (48, 48)]
HYPER = dict(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)


def hybrid_steps(start, grads, fraction, overlap, dtype):
    params = [p.clone() for p in start]
    hdo = HybridDeviceOptimizer(
        [{"params": params[:2], "wd_mult": 1.0}, {"params": params[2:], "wd_mult": 0.0}],
        offload_fraction=fraction, cpu_optimizer_cls=torch.optim.AdamW,
        gpu_optimizer_cls=torch.optim.AdamW, param_update_in_fp32=True,
        overlap_cpu_optimizer_d2h_h2d=overlap, fused=True, **HYPER)
    for step in grads:
        for p, g in zip(params, step):
            p.decoupled_grad = g.to(dtype)
        hdo.step()
        hdo.zero_grad()
    return params, hdo


def reference_steps(start, grads, dtype):
    ref = [p.clone().float() for p in start]
    opt = torch.optim.AdamW(ref, fused=True, **HYPER)
    for step in grads:
        for p, g in zip(ref, step):
            p.grad = g.to(dtype).float()
        opt.step()
    return ref


def main(fraction, overlap, dtype):
    assert megatron_musa_patch.is_active(), "the import activates the layer"
    torch.manual_seed(0)
    start = [torch.randn(s).to(dtype) for s in SHAPES]
    grads = [[torch.randn(s) * 1e-2 for s in SHAPES] for _ in range(4)]
    params, hdo = hybrid_steps(start, grads, fraction, overlap, dtype)
    ref = reference_steps(start, grads, dtype)
    print("RESULT" + json.dumps({
        "equal": all(torch.equal(p, r.to(dtype)) for p, r in zip(params, ref)),
        "changed": all(not torch.equal(p, s) for p, s in zip(params, start)),
        "placement": placement(hdo),
        "d2h_stream_is_current": hdo._d2h_stream is torch.cuda.current_stream(),
        "stream": type(hdo._d2h_stream).__module__,
    }))


if __name__ == "__main__":
    main(float(sys.argv[1]), sys.argv[2] == "1", getattr(torch, sys.argv[3]))
