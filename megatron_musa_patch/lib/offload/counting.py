"""Where each parameter's optimizer state lives: counted from the optimizer itself.

Used by the tests (the offloaded share must be real), the benchmark and the start-up log line.
"""

from __future__ import annotations

from typing import Dict, Iterator

import torch


def hybrid_optimizers(optimizer) -> Iterator:
    """Every ``HybridDeviceOptimizer`` inside a Megatron optimizer (chained or not)."""
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    if isinstance(optimizer, HybridDeviceOptimizer):
        yield optimizer
        return
    for inner in getattr(optimizer, "chained_optimizers", None) or ():
        yield from hybrid_optimizers(inner)
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and inner is not optimizer:
        yield from hybrid_optimizers(inner)


def _stepped(sub_optimizers):
    return [p for o in sub_optimizers for g in o.param_groups for p in g["params"]]


def placement(optimizer) -> Dict[str, object]:
    """Counts for this rank: parameters (and elements) stepped on the host and on the device,
    the bytes of optimizer state on each side, and whether every host tensor is memory of its
    own (not the model's). ``host_share`` is the host fraction of the elements."""
    counts = dict(host_params=0, host_numel=0, device_params=0, device_numel=0,
                  host_state_bytes=0, device_state_bytes=0, host_tensors_separate=True,
                  host_state_on_host=True, host_optimizers=0, pinned=0)
    for hybrid in hybrid_optimizers(optimizer):
        host = _stepped(hybrid.cpu_optimizers)
        device = _stepped([hybrid.gpu_optimizer] if hybrid.gpu_optimizer else [])
        counts["host_optimizers"] += len(hybrid.cpu_optimizers)
        counts["host_params"] += len(host)
        counts["host_numel"] += sum(p.numel() for p in host)
        counts["device_params"] += len(device)
        counts["device_numel"] += sum(p.numel() for p in device)
        for side, params in (("host", host), ("device", device)):
            for p in params:
                for key, value in hybrid.state.get(hybrid.inner_param_to_orig_param[p], {}).items():
                    if torch.is_tensor(value) and key not in ("master_param", "step"):
                        counts[f"{side}_state_bytes"] += value.numel() * value.element_size()
                        if side == "host" and value.device.type != "cpu":
                            counts["host_state_on_host"] = False
        for p in host:
            owner = hybrid.cpu_copys_map_gpu_param[p]
            counts["pinned"] += int(p.is_pinned())
            if p.device.type != "cpu" or _shares_memory(p, owner):
                counts["host_tensors_separate"] = False
    total = counts["host_numel"] + counts["device_numel"]
    counts["host_share"] = counts["host_numel"] / total if total else 0.0
    return counts


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
