"""A plan as text: the memory of each stage's busiest rank, the step time and its parts, the
levers and the layouts found."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .estimate import Estimate


def size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"


def seconds(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def layout_line(e: Estimate) -> str:
    lay = e.layout
    parts = [f"tp{lay.get('tp', 1)}", f"pp{lay.get('pp', 1)}"]
    if lay.get("vpp", 1) > 1:
        parts.append(f"vpp{lay['vpp']}")
    if lay.get("cp", 1) > 1:
        parts.append(f"cp{lay['cp']}")
    if lay.get("ep", 1) > 1:
        parts.append(f"ep{lay['ep']}")
    parts.append(f"dp{lay.get('dp', 1)}")
    return (f"{' '.join(parts)} | micro-batch {lay.get('micro_batch_size')}, global batch "
            f"{lay.get('global_batch_size')} ({lay.get('microbatches')} micro-batches per "
            f"pipeline), sequence {lay.get('seq_length')}")


def render(e: Estimate, script: str, release: str) -> str:
    lines = [f"{script} on {e.world_size} x {e.device.name} ({e.nodes} node"
             f"{'s' if e.nodes != 1 else ''} x {e.nproc_per_node}), megatron-core {release}",
             f"layout: {layout_line(e)}",
             f"device: {e.device.describe()}", "",
             "memory of each pipeline stage's busiest rank (allocated tensors):"]
    header = ("stage", "rank", "weights", "gradients", "optimizer", "activations", "peak",
              "+margin", "usable", "fits", "Megatron's estimate")
    rows: List[Tuple[str, ...]] = []
    for r in e.ranks:
        m = r.memory_bytes
        theory = r.megatron_theoretical or {}
        megatron = size(theory["total"]) if "total" in theory and r.stage == 0 else (
            "n/a" if r.stage == 0 else "")
        rows.append((str(r.stage), str(r.rank), size(m["weights"]), size(m["gradients"]),
                     size(m["optimizer"]), size(m["activations"]), size(m["peak"]),
                     size(m["with_allocator_margin"]), size(m["usable"]),
                     "yes" if r.fits else "NO", megatron))
    lines.extend(table(header, rows))
    lines.append("(activations: everything else live at the peak: activations, temporaries, "
                 "communication buffers; +margin: the allocator's reserve; Megatron's estimate: "
                 "its theoretical_memory_usage, first stage)")
    derived = [r.stage for r in e.ranks if r.interpolated]
    if derived:
        lines.append(f"(stages {derived[0]} to {derived[-1]}: from stages {derived[0] - 1} and "
                     f"{derived[-1] + 1}, which run the same layers, in proportion to the "
                     f"micro-batches each holds in flight; --every-stage plans each)")
    p = e.parts_s
    bubbles = ", ".join(f"{r.bubble:.0%}" for r in e.ranks)
    lines += ["", f"step time: {seconds(e.step_time_s)} = pipeline {seconds(p['pipeline'])} "
              f"+ gradient sync {seconds(p['grad_sync'])} + optimizer "
              f"{seconds(p['optimizer'])} + other {seconds(p['other'])}",
              f"pipeline bubble by stage: {bubbles} (1F1B with equal stages: "
              f"{e.theoretical_bubble:.0%})",
              f"throughput: {e.tokens_per_s:,.0f} tokens/s"
              + (f", MFU {e.mfu:.1%}" if e.mfu is not None else "")]
    lines.append(f"fits: {'yes' if e.fits else 'NO'}")
    return "\n".join(lines)


def render_levers(base: Estimate, levers: Sequence[Tuple[str, List[str], Optional[Estimate],
                                                          str]]) -> str:
    if not levers:
        return ""
    lines = ["", "levers (each planned again):"]
    for why, change, est, error in levers:
        pasted = " ".join(change)
        if est is None:
            lines.append(f"  {pasted}: {why} -- not possible: {error}")
            continue
        lines.append(f"  {pasted}: {why} -- peak {size(est.peak_bytes)} "
                     f"({_delta(est.peak_bytes, base.peak_bytes)}), step "
                     f"{seconds(est.step_time_s)} ({_delta(est.step_time_s, base.step_time_s)})"
                     f", {'fits' if est.fits else 'does not fit'}")
    return "\n".join(lines)


def render_search(found: Sequence[Tuple[str, List[str], Estimate]], considered: int,
                  dropped: Sequence[Tuple[str, str]], top: int) -> str:
    lines = ["", f"search: {considered} configurations planned (layout x micro-batch x "
             f"recompute), {len(found)} layouts fit"]
    for i, (label, change, est) in enumerate(found[:top], 1):
        lines.append(f"  {i}. {label}: step {seconds(est.step_time_s)}, "
                     f"{est.tokens_per_s:,.0f} tokens/s, peak {size(est.peak_bytes)}")
        lines.append(f"     {' '.join(change)}")
    for label, why in dropped:
        lines.append(f"  (not {label}: {why})")
    return "\n".join(lines)


def _delta(new: float, old: float) -> str:
    if not old:
        return "n/a"
    return f"{(new - old) / old:+.0%}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header)] + [fmt.format(*row) for row in rows]
