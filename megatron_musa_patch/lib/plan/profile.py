"""Device profiles: what a device holds and how fast it computes and communicates, as data.

One JSON file per device in ``profiles/`` (``h100``, ``h200``, ``s4000``, ``s5000``, ``cpu``),
or any file of the same fields (``mmp plan --device my.json``, written by ``mmp plan
--calibrate``). Each figure says where it comes from (``sources``: datasheet, announced, assumed
or measured); a ``measured`` section, when present, takes the place of the datasheet's speeds:
GEMM throughput by op size, memory bandwidth, the cost of one op, and collectives by message size,
with the machine, date and command that measured them.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
from typing import Dict, Optional, Sequence, Tuple

from megatron_musa_patch.base.errors import ArgumentError

from .kinds import kind_of

HERE = os.path.join(os.path.dirname(__file__), "profiles")
#: the shipped profiles, by name (one JSON file each)
NAMES = tuple(sorted(name[:-len(".json")] for name in os.listdir(HERE) if name.endswith(".json")))
REQUIRED = ("name", "title", "memory_bytes", "runtime_reserved_bytes", "allocator_margin",
            "peak_flops", "memory_bandwidth", "op_overhead_s", "gemm_efficiency",
            "memory_efficiency", "links", "sources")
LINK_FIELDS = ("bandwidth", "latency_s")


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    title: str
    path: str
    memory_bytes: int
    runtime_reserved_bytes: int
    allocator_margin: float
    peak_flops: Dict[str, float]
    memory_bandwidth: float
    op_overhead_s: float
    gemm_efficiency: Tuple[Tuple[float, float], ...]
    memory_efficiency: float
    links: Dict[str, Dict[str, float]]
    sources: Dict[str, str]
    measured: Optional[dict]
    collective_transient: Dict[str, float] = dataclasses.field(default_factory=dict)
    #: the node's ranks share the memory (a host's), so each may use its share of it
    shared_by_node_ranks: bool = False
    #: the allocator's block: allocations are rounded up to it (a caching allocator's 512 bytes)
    allocation_block: int = 512
    #: the share of an asynchronous collective that hides behind compute, unmeasured
    overlap: float = 1.0

    @property
    def usable_bytes(self) -> int:
        """What tensors may take: the device's memory less the runtime's own."""
        return self.memory_bytes - self.runtime_reserved_bytes

    # --------------------------------------------------------------- compute
    def gemm_flops_per_s(self, flops: float, width: int) -> float:
        measured = (self.measured or {}).get("gemm", {}).get(str(width))
        if measured:
            return _interpolate(measured, flops)
        peak = self.peak_flops.get(str(width)) or self.peak_flops["32"]
        return peak * _interpolate(self.gemm_efficiency, flops)

    def peak_flops_per_s(self, width: int) -> float:
        """The peak MFU is taken against: the datasheet's, or the fastest GEMM measured."""
        measured = (self.measured or {}).get("gemm", {}).get(str(width))
        if measured:
            return max(float(rate) for _, rate in measured)
        return self.peak_flops.get(str(width)) or self.peak_flops["32"]

    def bytes_per_s(self, width: int = 32) -> float:
        """An elementwise op's bytes read and written per second (measured per width)."""
        measured = (self.measured or {}).get("elementwise_bytes_per_s", {}).get(str(width))
        return measured or self.memory_bandwidth * self.memory_efficiency

    def overhead_s(self) -> float:
        measured = (self.measured or {}).get("op_overhead_s")
        return measured if measured is not None else self.op_overhead_s

    def math_elements_per_s(self) -> float:
        measured = (self.measured or {}).get("math_elements_per_s")
        return measured or self.peak_flops["32"] / 8  # a transcendental: about 8 FP32 ops

    def framework_overhead_s(self) -> float:
        """What a training step adds per op beyond issuing it (``--calibrate`` measures it)."""
        return float((self.measured or {}).get("framework_op_overhead_s") or 0.0)

    def step_efficiency(self) -> float:
        """A micro-batch's real time over its ops priced one by one (``--calibrate`` measures
        it)."""
        return float((self.measured or {}).get("step_efficiency") or 1.0)

    def update_efficiency(self) -> float:
        """The same for the step's work outside the micro-batches (the gradients' reduction and
        the optimizer): measured by ``--calibrate`` with a script, else taken as 1."""
        return float((self.measured or {}).get("update_efficiency") or 1.0)

    def fused_bytes_per_s(self, width: int = 16) -> float:
        """A compiled region's bytes read and written per second (measured per width), else an
        elementwise op's."""
        measured = (self.measured or {}).get("fused_bytes_per_s", {}).get(str(width))
        return measured or self.bytes_per_s(width)

    def fused_overhead_s(self) -> float:
        """Calling a compiled region (its guards and wrappers), else issuing one op."""
        measured = (self.measured or {}).get("fused_overhead_s")
        return measured if measured is not None else self.overhead_s()

    def op_seconds(self, flops: float, nbytes: float, width: int, elements: int = 0,
                   microbatch: bool = True, fused: bool = False) -> float:
        """One op alone (its work at the measured rates, plus issuing it), then as a step runs it:
        ``microbatch``: in a micro-batch's forward or backward pass, else in the update;
        ``fused``: a compiled region, its bytes at a compiled kernel's rate (its transcendentals,
        counted by the tracker, still at theirs)."""
        compute = flops / self.gemm_flops_per_s(flops, width) if flops else 0.0
        if elements:
            compute = max(compute, elements / self.math_elements_per_s())
        if fused:
            alone = max(compute, nbytes / self.fused_bytes_per_s(width)) + \
                self.fused_overhead_s()
        else:
            alone = max(compute, nbytes / self.bytes_per_s(width)) + self.overhead_s()
        factor = self.step_efficiency() if microbatch else self.update_efficiency()
        return alone * factor + self.framework_overhead_s()

    # --------------------------------------------------------------- communication
    def collective_seconds(self, op: str, nbytes: float, ranks: int, nodes: int) -> float:
        """One collective of ``nbytes`` (the shard for gathers and reductions to shards, the
        whole tensor otherwise) among ``ranks`` ranks on ``nodes`` nodes."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        kind = kind_of(op)
        measured = (self.measured or {}).get("collectives", {}).get(kind)
        if measured and nodes <= 1 and measured["ranks"] > 1:
            # measured among `measured_ranks`; a ring's time scales with (n-1)/n of the volume
            table = measured["seconds_by_bytes"]
            n0 = measured["ranks"]
            volume = nbytes * _ring_factor(kind, ranks) / _ring_factor(kind, n0)
            return _interpolate(table, volume)
        link = self.links["inter_node" if nodes > 1 else "intra_node"]
        steps = 1 if kind == "p2p" else (ranks - 1) * (2 if kind == "all_reduce" else 1)
        return steps * link["latency_s"] + nbytes * _ring_factor(kind, ranks) / link["bandwidth"]

    def collective_in_step_s(self) -> float:
        """What a collective adds inside a step to its table's time: its backend waking after
        compute (``--calibrate`` measures it; the peers' lag is ``collective_wait_share``)."""
        return float((self.measured or {}).get("collective_in_step_s") or 0.0)

    def collective_wait_share(self) -> float:
        """What ranks meeting at a micro-batch's synchronous collectives wait for each other, as
        a share of that micro-batch's compute (the slowest rank's lag grows with the work since
        they last met): measured by ``--calibrate`` with a script on two ranks, else 0."""
        return float((self.measured or {}).get("collective_wait_share") or 0.0)

    def collective_overlap(self) -> float:
        """The share of an asynchronous collective that hides behind compute issued after it:
        measured by ``--calibrate``, else the profile's ``collective_overlap`` (1: the device's
        own engines)."""
        measured = (self.measured or {}).get("collective_overlap")
        return float(measured if measured is not None else self.overlap)

    def transients(self) -> Dict[str, float]:
        """Bytes a collective's backend holds while it runs, per byte of the whole tensor
        (measured by --calibrate, else the profile's ``collective_transient``)."""
        measured = (self.measured or {}).get("collective_transient")
        return dict(measured if measured is not None else self.collective_transient)

    def describe(self) -> str:
        measured = self.measured or {}
        if measured:
            return (f"{self.title} ({self.name}; speeds measured on {measured.get('machine')} "
                    f"{measured.get('date')})")
        return f"{self.title} ({self.name}; datasheet speeds, efficiencies assumed)"


def _ring_factor(kind: str, ranks: int) -> float:
    """Bytes through each rank's link per byte recorded, for a ring of ``ranks``."""
    if kind == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter"):
        return float(ranks - 1)
    if kind == "all_to_all":
        return (ranks - 1) / ranks
    return 1.0


def _interpolate(points: Sequence[Sequence[float]], x: float) -> float:
    """Piecewise linear in log(x), flat beyond the ends."""
    points = sorted((float(a), float(b)) for a, b in points)
    xs = [p[0] for p in points]
    if x <= xs[0]:
        return points[0][1] if len(points) == 1 else _line(points[0], points[1], x, clamp=True)
    if x >= xs[-1]:
        return points[-1][1] if len(points) == 1 else _line(points[-2], points[-1], x,
                                                             clamp=True)
    i = bisect.bisect_right(xs, x)
    return _line(points[i - 1], points[i], x, clamp=False)


def _line(a, b, x, clamp: bool) -> float:
    if clamp:
        return a[1] if x <= a[0] else b[1]
    if a[0] <= 0 or b[0] <= 0 or x <= 0:
        return a[1]
    t = (math.log(x) - math.log(a[0])) / (math.log(b[0]) - math.log(a[0]))
    return a[1] + t * (b[1] - a[1])


def load(name_or_path: str) -> Profile:
    """A profile by name (``h100``...) or from a JSON file; a bad one is refused naming what."""
    if os.sep in name_or_path or name_or_path.endswith(".json"):
        path = name_or_path
        if not os.path.isfile(path):
            raise ArgumentError(f"--device {name_or_path}: no such profile file. Give one of "
                                f"{', '.join(NAMES)}, or a file written by `mmp plan "
                                f"--calibrate`.")
    else:
        if name_or_path.lower() not in NAMES:
            raise ArgumentError(f"--device {name_or_path}: unknown device. The profiles are: "
                                f"{', '.join(NAMES)} (or a JSON file of the same fields, such "
                                f"as `mmp plan --calibrate` writes).")
        path = os.path.join(HERE, f"{name_or_path.lower()}.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"--device {name_or_path}: the profile {path} does not read as "
                            f"JSON ({exc}).") from exc
    return from_dict(data, path)


def from_dict(data: dict, path: str = "<profile>") -> Profile:
    if not isinstance(data, dict):
        raise ArgumentError(f"the device profile {path} is not a JSON object.")
    missing = [k for k in REQUIRED if k not in data]
    for link in ("intra_node", "inter_node"):
        for field in LINK_FIELDS:
            if isinstance(data.get("links"), dict) and field not in data["links"].get(link, {}):
                missing.append(f"links.{link}.{field}")
    if isinstance(data.get("peak_flops"), dict) and "32" not in data["peak_flops"]:
        missing.append("peak_flops.32")
    if missing:
        raise ArgumentError(f"the device profile {path} lacks the field"
                            f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}; every "
                            f"profile has {', '.join(REQUIRED)} (see "
                            f"megatron_musa_patch/lib/plan/profiles/h100.json).")
    return Profile(
        name=str(data["name"]), title=str(data["title"]), path=path,
        memory_bytes=int(data["memory_bytes"]),
        runtime_reserved_bytes=int(data["runtime_reserved_bytes"]),
        allocator_margin=float(data["allocator_margin"]),
        peak_flops={str(k): float(v) for k, v in data["peak_flops"].items()},
        memory_bandwidth=float(data["memory_bandwidth"]),
        op_overhead_s=float(data["op_overhead_s"]),
        gemm_efficiency=tuple((float(a), float(b)) for a, b in data["gemm_efficiency"]),
        memory_efficiency=float(data["memory_efficiency"]),
        links={k: {f: float(v[f]) for f in LINK_FIELDS} for k, v in data["links"].items()},
        sources=dict(data["sources"]), measured=data.get("measured"),
        collective_transient={str(k): float(v) for k, v in
                              (data.get("collective_transient") or {}).items()},
        shared_by_node_ranks=bool(data.get("shared_by_node_ranks", False)),
        allocation_block=int(data.get("allocation_block", 512)),
        overlap=float(data.get("collective_overlap", 1.0)))
