"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) on megatron-core's own 1F1B.

1F1B sends a backward pass's input gradient to the previous stage only after the pass has also
computed its weight gradients, and each stage of the cool-down waits for the next gradient with
nothing to do. ZB-H1 splits the backward pass into ``B`` (the input gradient, which the previous
stage waits for) and ``W`` (the weight gradient, which nothing waits for until the step ends):

* after each ``B`` its input gradient is sent first, and only then does its ``W`` run, so
  gradients travel up the pipeline at ``B``'s pace while a stage computes weight gradients;
* nothing is held past the next forward pass, so the peak of memory, set by the forward passes
  in flight, stays 1F1B's (holding each ``W`` one pass longer gains one pass of the bubble and
  costs one pass's linear inputs and output gradients at the peak);
* when the data-parallel buckets reduce during the last backward pass
  (``--overlap-grad-reduce``), that pass computes its ``W`` inside it.

The placement is this schedule's, within megatron-core's own calls (its 1F1B order and its
combined send-receive calls, unchanged), so it removes less of 1F1B's idle time than the paper's
handcrafted ZB-H1 (a third of it with equal F, B and W, where the paper's removes two thirds);
the planner simulates it (``lib/plan/schedule.py``) and docs/features/pipeline.md says how much.
``ZeroBubbleH1`` is told of each backward pass and each gradient sent
(``features/pipeline/zero_bubble.py`` wraps those calls).
"""

from __future__ import annotations

from .weight_gradients import WeightGradients


class ZeroBubbleH1:
    """One schedule call's ZB-H1 decisions (the same on every stage)."""

    def __init__(self, store: WeightGradients, microbatches: int, reduce_in_last_backward: bool):
        self.store = store
        self.microbatches = microbatches
        self.reduce_in_last_backward = reduce_in_last_backward
        self.backwards = 0

    def backward(self, run_backward):
        """One backward pass (``run_backward()``), its ``W`` held back until its gradient is
        sent."""
        microbatch = self.backwards
        self.backwards += 1
        if microbatch == self.microbatches - 1 and self.reduce_in_last_backward:
            self.store.flush()  # the buckets reduce as this pass finishes them: all W first
            return run_backward()
        with self.store.deferring(microbatch):
            return run_backward()

    def after_gradient_sent(self) -> None:
        """The input gradient of the last ``B`` is on its way: its ``W`` runs now."""
        self.store.flush()

    def finish(self) -> None:
        """Before the gradients are reduced: every held-back ``W``."""
        self.store.flush()


def theoretical_bubble(stages: int, microbatches: int, forward: float = 1.0,
                       backward_input: float = 1.0, backward_weight: float = 1.0,
                       schedule: str = "1f1b") -> float:
    """A stage's idle share of the step with uniform stages (the paper's bubble formulas):
    1F1B idles ``(p-1)(F+B+W)``, ZB-H1 ``(p-1)(F+B-W)``, out of that plus ``m(F+B+W)``."""
    p, m = stages, microbatches
    work = m * (forward + backward_input + backward_weight)
    if schedule == "1f1b":
        bubble = (p - 1) * (forward + backward_input + backward_weight)
    elif schedule == "zb-h1":
        bubble = max((p - 1) * (forward + backward_input - backward_weight), 0.0)
    else:
        raise ValueError(f"unknown schedule {schedule!r}: 1f1b or zb-h1")
    return bubble / (work + bubble) if work + bubble else 0.0
