"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) on megatron-core's own 1F1B.

1F1B's stage ``i`` of ``p`` idles in its cool-down: after each backward pass it waits for the
next output gradient from stage ``i + 1``. ZB-H1 splits each backward pass into ``B`` (the input
gradient, which the stage before waits for) and ``W`` (the weight gradient, which nothing waits
for until the step ends) and moves ``W`` into those waits:

* in the steady state stage ``i`` holds back the ``W`` of up to ``p - 1 - i`` micro-batches
  (the last stage none), so the ``B`` the previous stage waits for leaves sooner;
* in the cool-down, before each wait for an output gradient, it runs the oldest held-back ``W``;
* what is still held runs before the gradients are reduced (``finish``), or, when the
  data-parallel buckets reduce during the last backward pass (``--overlap-grad-reduce``),
  before that pass (its ``W`` is not held).

Memory: the forward passes in flight are 1F1B's; on top, each held-back ``W`` keeps its linear
layers' inputs and output gradients until it runs (at stage ``i``, up to ``p - 1 - i``
micro-batches' worth; the paper bounds ZB-H1's peak by 1F1B's with the ``W`` pass's smaller
share of the activations). The schedule is megatron-core's own function,
its communication and its grad-sync calls unchanged; ``ZeroBubbleH1`` is told of each backward
pass and each cool-down wait (``features/pipeline/zero_bubble.py`` wraps those calls).
"""

from __future__ import annotations

from .weight_gradients import WeightGradients


class ZeroBubbleH1:
    """One schedule call's ZB-H1 decisions for stage ``stage`` of ``stages``."""

    def __init__(self, store: WeightGradients, stage: int, stages: int, microbatches: int,
                 reduce_in_last_backward: bool):
        self.store = store
        self.held = max(min(stages - 1 - stage, microbatches), 0)
        self.microbatches = microbatches
        self.reduce_in_last_backward = reduce_in_last_backward
        self.backwards = 0

    def backward(self, run_backward):
        """One backward pass (``run_backward()``), its ``W`` held back where the schedule has a
        slot for it later."""
        microbatch = self.backwards
        self.backwards += 1
        if microbatch == self.microbatches - 1 and self.reduce_in_last_backward:
            self.store.flush()  # the buckets reduce as this pass finishes them: all W first
            return run_backward()
        if not self.held:
            return run_backward()
        with self.store.deferring(microbatch):
            out = run_backward()
        while len(self.store.pending) > self.held:
            self.store.run_oldest()
        return out

    def before_gradient_wait(self) -> None:
        """The cool-down's wait for the next output gradient: the slot 1F1B leaves idle."""
        self.store.run_oldest()

    def finish(self) -> None:
        """Before the gradients are reduced: every held-back ``W``."""
        self.store.flush()


def theoretical_bubble(stages: int, microbatches: int, forward: float = 1.0,
                       backward_input: float = 1.0, backward_weight: float = 1.0,
                       schedule: str = "1f1b") -> float:
    """A stage's idle share of the step with uniform stages (the paper's bubble formulas):
    1F1B idles ``(p-1)(F+B+W)``, ZB-H1 ``(p-1)(F+B-2W)`` (not below 0), out of that plus
    ``m(F+B+W)``."""
    p, m = stages, microbatches
    work = m * (forward + backward_input + backward_weight)
    if schedule == "1f1b":
        bubble = (p - 1) * (forward + backward_input + backward_weight)
    elif schedule == "zb-h1":
        bubble = max((p - 1) * (forward + backward_input - 2 * backward_weight), 0.0)
    else:
        raise ValueError(f"unknown schedule {schedule!r}: 1f1b or zb-h1")
    return bubble / (work + bubble) if work + bubble else 0.0
