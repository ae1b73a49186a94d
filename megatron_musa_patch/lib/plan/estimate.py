"""One layout's plan: every pipeline stage's busiest rank (what the fake run measured) priced on a
device profile, with the pipeline's schedule simulated: memory per rank, fits or not, step time,
tokens/s and MFU.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from . import cost, schedule
from .profile import Profile
from .tracker import rounded


@dataclasses.dataclass
class RankPlan:
    rank: int
    stage: int
    memory_bytes: Dict[str, int]
    fits: bool
    bubble: float
    megatron_theoretical: Optional[dict]
    #: a middle stage not run, taken to be the first (``mmp plan --search`` ranking)
    approximated: bool = False
    #: a middle stage derived from two others that run the same layers (``lib/plan/stages``)
    interpolated: bool = False


@dataclasses.dataclass
class Estimate:
    device: Profile
    world_size: int
    nodes: int
    nproc_per_node: int
    layout: Dict[str, int]
    ranks: List[RankPlan]
    step_time_s: float
    tokens_per_s: float
    mfu: Optional[float]
    theoretical_bubble: float
    parts_s: Dict[str, float]
    flags: List[str]

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.ranks)

    @property
    def peak_bytes(self) -> int:
        return max(r.memory_bytes["peak"] for r in self.ranks)

    def to_json(self) -> dict:
        return {
            "fits": self.fits, "device": self.device.name, "device_title": self.device.title,
            "world_size": self.world_size, "nodes": self.nodes,
            "nproc_per_node": self.nproc_per_node, "layout": self.layout,
            "usable_bytes_per_rank": usable_bytes(self.device, self.nproc_per_node),
            "ranks": [dataclasses.asdict(r) for r in self.ranks],
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu, "bubble": {"theoretical": self.theoretical_bubble,
                                       "by_stage": [r.bubble for r in self.ranks]},
            "step_parts_s": self.parts_s, "flags": self.flags,
        }


def usable_bytes(device: Profile, nproc_per_node: int) -> int:
    """What one rank's tensors may take: a host's memory is shared by the node's ranks."""
    if device.shared_by_node_ranks:
        return device.usable_bytes // max(nproc_per_node, 1)
    return device.usable_bytes


def estimate(results: List[dict], device: Profile, nodes: int, nproc_per_node: int,
             flags: List[str]) -> Estimate:
    results = sorted(results, key=lambda r: r["stage"])
    first = results[0]
    blocks = device.allocation_block > 1  # the tracker rounds to a caching allocator's block
    limit = usable_bytes(device, nproc_per_node)
    costs = [cost.price(r, device) for r in results]
    chunks = first["vpp"]
    microbatches = first["microbatches"]
    timeline = schedule.simulate([c.forward_s for c in costs], [c.backward_s for c in costs],
                                 microbatches, chunks,
                                 transfer_s=max(c.transfer_s for c in costs))
    parts = {"pipeline": timeline.makespan,
             "grad_sync": max(c.grad_sync_s for c in costs),
             "optimizer": max(c.optimizer_s for c in costs),
             "other": max(c.other_s for c in costs)}
    step = sum(parts.values())
    ranks = []
    for r, c in zip(results, costs):
        m = r["memory"]
        peak = max(m["setup_peak"], m["step_peak"])
        if blocks:
            peak = max(rounded(m["setup_peak"]), m["step_peak_rounded"])
        static = m["weights"] + m["gradients"] + m["optimizer"]
        memory = {"weights": m["weights"], "gradients": m["gradients"],
                  "optimizer": m["optimizer"], "activations": max(peak - static, 0),
                  "peak": peak, "steady_peak": m["steady_peak"],
                  "with_allocator_margin": int(peak * (1 + device.allocator_margin)),
                  "usable": limit}
        ranks.append(RankPlan(rank=r["rank"], stage=r["stage"], memory_bytes=memory,
                              fits=memory["with_allocator_margin"] <= limit,
                              bubble=timeline.bubble(r["stage"]),
                              megatron_theoretical=r.get("megatron_theoretical"),
                              approximated=bool(r.get("approximated")),
                              interpolated=bool(r.get("interpolated"))))
    tokens = first["tokens_per_iteration"]
    flops = first.get("model_flops_per_iteration")
    peak_flops = device.peak_flops_per_s(int(first.get("dtype_bits", 16)))
    mfu = flops / (step * first["world_size"] * peak_flops) if flops and step else None
    layout = {k: first[k] for k in ("tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch_size",
                                    "global_batch_size", "microbatches", "seq_length")
              if k in first}
    return Estimate(device=device, world_size=first["world_size"], nodes=nodes,
                    nproc_per_node=nproc_per_node, layout=layout, ranks=ranks,
                    step_time_s=step, tokens_per_s=tokens / step if step else 0.0, mfu=mfu,
                    theoretical_bubble=schedule.equal_stages_bubble(first["pp"], microbatches,
                                                                    chunks),
                    parts_s=parts, flags=flags)
