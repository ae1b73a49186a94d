"""The layouts ``mmp plan --search`` considers for a job's ranks: tensor, pipeline (with and
without interleaving), context and expert parallelism, the rest data-parallel; each as the user's
command line with those flags set. Megatron's own validation still has the last word: a layout it
refuses is dropped by the planner with the reason."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence

from . import flags

LAYOUT_FLAGS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                "--context-parallel-size", "--expert-model-parallel-size", "--sequence-parallel")


@dataclasses.dataclass(frozen=True)
class Shape:
    num_layers: int
    num_heads: int
    num_query_groups: Optional[int]
    num_experts: Optional[int]
    seq_length: int
    global_batch_size: int
    micro_batch_size: int


def shape_of(args: Sequence[str]) -> Shape:
    def number(flag, default=None):
        v = flags.value(args, flag)
        return int(v) if v not in (None, "") else default

    return Shape(num_layers=number("--num-layers", 1),
                 num_heads=number("--num-attention-heads", 1),
                 num_query_groups=number("--num-query-groups"),
                 num_experts=number("--num-experts"),
                 seq_length=number("--seq-length", 1),
                 global_batch_size=number("--global-batch-size", 1),
                 micro_batch_size=number("--micro-batch-size", 1))


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(args: Sequence[str], world_size: int, nproc_per_node: int) -> List[Dict]:
    """Every layout of ``world_size`` ranks the model's shape allows, TP within a node."""
    shape = shape_of(args)
    out = []
    for tp in _divisors(min(nproc_per_node, 8) if world_size >= nproc_per_node else world_size):
        if shape.num_heads % tp or (shape.num_query_groups and shape.num_query_groups % tp):
            continue
        for pp in _divisors(world_size // tp):
            if shape.num_layers % pp:
                continue
            for cp in ([1, 2] if shape.seq_length >= 8192 else [1]):
                if (world_size // (tp * pp)) % cp:
                    continue
                dp = world_size // (tp * pp * cp)
                if shape.global_batch_size % (shape.micro_batch_size * dp):
                    continue
                eps = [1]
                if shape.num_experts:
                    eps = [e for e in _divisors(dp * cp) if shape.num_experts % e == 0]
                per_stage = shape.num_layers // pp
                vpps = [1] + ([2] if pp > 1 and per_stage % 2 == 0 and
                              (shape.global_batch_size // (shape.micro_batch_size * dp)) % pp == 0
                              else [])
                for ep in eps:
                    for vpp in vpps:
                        out.append({"tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp,
                                    "dp": dp, "layers_per_chunk": per_stage // vpp})
    return out


def apply(args: Sequence[str], layout: Dict) -> List[str]:
    set_flags = {"--tensor-model-parallel-size": str(layout["tp"]),
                 "--pipeline-model-parallel-size": str(layout["pp"]),
                 "--context-parallel-size": str(layout["cp"])}
    if layout["ep"] > 1 or flags.has(args, "--expert-model-parallel-size"):
        set_flags["--expert-model-parallel-size"] = str(layout["ep"])
    if layout["vpp"] > 1:
        set_flags["--num-layers-per-virtual-pipeline-stage"] = str(layout["layers_per_chunk"])
    if layout["tp"] > 1:
        set_flags["--sequence-parallel"] = None
    return flags.edited(args, set_flags, remove=LAYOUT_FLAGS)


def name(layout: Dict) -> str:
    parts = [f"tp{layout['tp']}", f"pp{layout['pp']}"]
    if layout["vpp"] > 1:
        parts.append(f"vpp{layout['vpp']}")
    if layout["cp"] > 1:
        parts.append(f"cp{layout['cp']}")
    if layout["ep"] > 1:
        parts.append(f"ep{layout['ep']}")
    parts.append(f"dp{layout['dp']}")
    return " ".join(parts)
