"""One rank of ``mmp plan --calibrate SCRIPT ARGS...``'s step measurement: the script as
``__main__`` (``mmp run`` starts it on every rank of the node), each training step timed whole
and its micro-batches' forward and backward passes (Megatron's ``forward_backward_func``) timed
apart, written to ``MMP_PLAN_CALIBRATE_STEP_OUT/rank<R>.json``.

The device is synchronised at both ends of each timed span, so what is timed is what the device
and the framework took, not what was queued.
"""

from __future__ import annotations

import inspect
import json
import os
import runpy
import sys
import time


def _synchronised_clock():
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def now() -> float:
        sync()
        return time.perf_counter()

    return now


def run_as_main(script: str) -> int:
    """``script`` as ``__main__`` (``sys.argv`` already its command line); its exit status."""
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return exc.code or 0
    return 0


def main() -> None:
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    from megatron.training import training

    now = _synchronised_clock()
    steps, passes = [], []
    train_step = training.train_step
    signature = inspect.signature(train_step)

    def timed_passes(forward_backward):
        def timed(*a, **k):
            begin = now()
            out = forward_backward(*a, **k)
            passes.append(now() - begin)
            return out

        return timed

    def timed_step(*a, **k):
        bound = signature.bind(*a, **k)
        bound.arguments["forward_backward_func"] = timed_passes(
            bound.arguments["forward_backward_func"])
        begin = now()
        out = train_step(*bound.args, **bound.kwargs)
        steps.append(now() - begin)
        return out

    training.train_step = timed_step
    code = 1
    try:
        code = run_as_main(script)
    finally:
        rank = int(os.environ.get("RANK", "0"))
        with open(os.path.join(os.environ["MMP_PLAN_CALIBRATE_STEP_OUT"], f"rank{rank}.json"),
                  "w", encoding="utf-8") as f:
            json.dump({"rank": rank, "steps_s": steps, "passes_s": passes}, f)
    sys.exit(code)


if __name__ == "__main__":
    main()
