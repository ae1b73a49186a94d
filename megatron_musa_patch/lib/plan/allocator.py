"""The CPU allocator's own count of live bytes, as torch's profiler reports it: the measurement
the planner is checked against (it involves none of the planner's accounting)."""

from __future__ import annotations


def peak_allocated(prof) -> int:
    """The most bytes the allocator held at once while ``prof`` (a ``torch.profiler.profile``
    with ``profile_memory=True``) recorded, counted from its start, in the recording thread."""
    from torch._C._profiler import _EventType

    peak, todo = 0, list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        node = todo.pop()
        if node.tag == _EventType.Allocation:
            peak = max(peak, node.extra_fields.total_allocated)
        todo.extend(node.children)
    return peak
