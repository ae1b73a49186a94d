"""One rank of a measured run for ``bench_plan.py``: the script as ``__main__``, its memory
measured and written to ``MMP_PLAN_MEASURE_DIR/rank<R>.json``:

* ``allocator`` (the measurement): c10's CPU allocator's own allocation and free events,
  reported to torch's profiler (every tensor's storage, the kernels' own buffers too); live
  bytes summed from the events in order. Nothing of the planner's is involved. The profiler
  records the events of the thread that started it only, so a tensor freed in another thread
  (gloo's, when it drops the last reference to a collective's tensor) stays counted:
  ``allocator_per_step`` then rises from step to step, and the peak is not a measurement.
* ``storages`` (with ``MMP_PLAN_MEASURE_STORAGES=1``, instead): the live storages of the real
  run's tensors, counted by the planner's own tracker on real tensors, whichever thread frees
  them. A dispatch mode makes torch.compile run its regions eagerly, so this run is not the
  normal one: a cross-check only.

``mmp run --nproc-per-node N benchmarks/plan_measure_rank.py pretrain_gpt.py ARGS...``. The
steady peak is the most from the second step on, with a garbage collection before each step (as
``--manual-gc-interval 1``): reference cycles hold tensors until Python's collector happens to
run, which otherwise makes a peak differ from run to run.
"""

import gc
import json
import os
import sys
import time

from torch.profiler import ProfilerActivity, profile


def allocator_peaks(prof, step_starts):
    """The most bytes live at once from the first step mark on, and within each step."""
    from torch._C._profiler import _EventType

    events = []
    todo = list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        node = todo.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size,
                           node.extra_fields.ptr, node))
        todo.extend(node.children)
    events.sort(key=lambda e: e[0])
    sizes, live, steady, where = {}, 0, 0, None
    per_step = [0] * len(step_starts)
    for when, size, ptr, node in events:
        if size > 0:
            sizes[ptr] = size
            live += size
        else:
            live -= sizes.pop(ptr, 0)
        step = sum(1 for start in step_starts if when >= start) - 1
        if step >= 0:
            per_step[step] = max(per_step[step], live)
            if live > steady:
                steady, where = live, node
    stack = []
    while where is not None:
        stack.append(where.name)
        where = where.parent
    return steady, per_step, stack[1:6]


def main() -> None:
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    from megatron.training import training

    from megatron_musa_patch.cli.plan_calibrate_step import run_as_main
    from megatron_musa_patch.lib.plan.tracker import Tracker

    storages = Tracker() if os.environ.get("MMP_PLAN_MEASURE_STORAGES") == "1" else None
    marks = {"calls": 0, "starts": [], "storage_steps": []}
    train_step = training.train_step

    def counted(*a, **k):
        marks["calls"] += 1
        if marks["calls"] >= 2:
            gc.collect()
            marks["starts"].append(time.time_ns())
            if storages is not None:
                storages.mark()
        out = train_step(*a, **k)
        if marks["calls"] >= 2 and storages is not None:
            marks["storage_steps"].append(storages.peak)
        return out

    training.train_step = counted
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    if storages is None:
        prof.start()
    else:
        storages.__enter__()
    code = 1
    try:
        code = run_as_main(script)
    finally:
        if storages is None:
            prof.stop()
            steady, per_step, where = allocator_peaks(prof, marks["starts"])
        else:
            storages.__exit__(None, None, None)
            steady, per_step, where = 0, [], []
        rank = int(os.environ.get("RANK", "0"))
        with open(os.path.join(os.environ["MMP_PLAN_MEASURE_DIR"], f"rank{rank}.json"),
                  "w") as f:
            json.dump({"rank": rank, "allocator_steady_peak": steady,
                       "allocator_per_step": per_step, "allocator_peak_inside": where,
                       "storages_steady_peak": max(marks["storage_steps"], default=0),
                       "storages_per_step": marks["storage_steps"]}, f)
    sys.exit(code)


if __name__ == "__main__":
    main()
