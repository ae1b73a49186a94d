"""The weight-gradient half of a backward pass, held back to run later (zero-bubble schedules).

A linear layer's backward is two products: the input gradient (``B``: the previous stage waits
for it) and the weight gradient (``W``: only the optimizer needs it, at the end of the step).
While ``WeightGradients.deferring()`` is open, megatron-core's
``LinearWithGradAccumulationAndAsyncCommunication.backward`` computes ``B`` alone -- through
upstream's own deferral switch (``grad_output_buffer``, which keeps the output gradient instead
of using it) -- and the ``W`` it skipped is queued, one group per micro-batch, to run when the
schedule has a slot for it. ``W`` accumulates into the parameter's ``main_grad`` with the same
call upstream would have made (its ``fused_weight_gradient_mlp_cuda`` function, the gathered
input under sequence parallelism), so the values are upstream's, and groups run oldest first,
so each ``main_grad`` sums its micro-batches in the order 1F1B sums them.

Only what accumulates into ``main_grad`` is held back (``--gradient-accumulation-fusion``, not
Megatron-FSDP): other layers (norms, embeddings, grouped experts) compute their ``W`` in ``B``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from typing import Callable, Deque, Dict, Hashable, List, Optional, Tuple

import torch


class WeightGradients:
    """The held-back ``W`` groups of one rank, oldest first."""

    def __init__(self):
        #: (micro-batch, its W products) per held-back backward pass
        self.pending: Deque[Tuple[int, List[Callable[[], None]]]] = collections.deque()
        #: groups a schedule runs by name (the V schedules: ``(stage, micro-batch)``)
        self.named: Dict[Hashable, Tuple[int, List[Callable[[], None]]]] = {}
        self._group: Optional[List[Callable[[], None]]] = None
        #: called around each group that runs (the timeline's span), or None
        self.around: Optional[Callable] = None

    @property
    def collecting(self) -> bool:
        return self._group is not None

    @contextlib.contextmanager
    def deferring(self, microbatch: int = -1, name: Optional[Hashable] = None):
        """One backward pass whose ``W`` is held back as one group: oldest first, or, given a
        ``name``, until ``run(name)``."""
        self._group = []
        try:
            yield
        finally:
            group, self._group = self._group, None
            if group and name is not None:
                self.named[name] = (microbatch, group)
            elif group:
                self.pending.append((microbatch, group))

    def defer(self, weight_gradient: Callable[[], None]) -> None:
        self._group.append(weight_gradient)

    def run_oldest(self) -> bool:
        """Run the oldest held-back group; False when none is held."""
        if not self.pending:
            return False
        self._run(*self.pending.popleft())
        return True

    def run(self, name: Hashable) -> bool:
        """Run the group held back under ``name``; False when none is (a pass without
        deferrable layers)."""
        if name not in self.named:
            return False
        self._run(*self.named.pop(name))
        return True

    def flush(self) -> None:
        while self.run_oldest():
            pass
        for name in list(self.named):
            self.run(name)

    def clear(self) -> None:
        """Drop what is held (a schedule call that failed)."""
        self.pending.clear()
        self.named.clear()

    def _run(self, microbatch: int, group: List[Callable[[], None]]) -> None:
        span = self.around("W", microbatch) if self.around else contextlib.nullcontext()
        with span:
            for weight_gradient in group:
                weight_gradient()


def without_fusion(given: str) -> str:
    """The refusal of a schedule that holds weight gradients back (``given``: its flag) when
    ``--no-gradient-accumulation-fusion`` leaves no ``main_grad`` to add them into."""
    return (f"{given}: the weight gradients held back are added into the parameters' "
            f"main_grad, which is --gradient-accumulation-fusion: drop "
            f"--no-gradient-accumulation-fusion.")


def deferrable(ctx) -> bool:
    """Whether upstream's linear backward can hand its ``W`` over for this call."""
    if not getattr(ctx, "gradient_accumulation_fusion", False):
        return False
    if getattr(ctx, "main_grad", None) is None or getattr(ctx, "grad_output_buffer", 1) is not None:
        return False  # no main_grad to add into, or upstream already defers it (the embedding)
    if getattr(ctx, "gtp_remat_size", 1) > 1:
        return False
    _, weight = ctx.saved_tensors
    return not hasattr(weight, "__fsdp_param__")


def linear_backward(store: WeightGradients, backward, ctx, grad_output):
    """Upstream's ``backward(ctx, grad_output)``; inside ``store.deferring()``, without ``W``,
    which is queued on ``store``."""
    if not store.collecting or not deferrable(ctx):
        return backward(ctx, grad_output)
    input_, weight = ctx.saved_tensors
    main_grad = ctx.main_grad
    # upstream's own switch: "keep the output gradient for later, skip the weight gradient"
    ctx.grad_output_buffer, ctx.wgrad_deferral_limit = [], 0
    grads = backward(ctx, grad_output)
    (kept,) = ctx.grad_output_buffer
    store.defer(functools.partial(weight_gradient, input_, kept, main_grad,
                                  ctx.sequence_parallel, ctx.tp_group))
    return grads


@torch.no_grad()  # as inside autograd's backward: the saved input still requires grad
def weight_gradient(input_: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor,
                    sequence_parallel: bool, tp_group) -> None:
    """``main_grad += grad_output^T @ input`` as upstream's backward would have added it."""
    from megatron.core.tensor_parallel import layers

    total_input = input_
    if sequence_parallel:  # the input is this rank's share of the sequence: gather it again
        total_input = torch.empty((input_.shape[0] * tp_group.size(), *input_.shape[1:]),
                                  dtype=input_.dtype, device=input_.device)
        layers.dist_all_gather_func(total_input, input_, group=tp_group)
    grad_output, total_input = layers.prepare_input_tensors_for_wgrad_compute(grad_output,
                                                                              total_input)
    fused = layers.fused_weight_gradient_mlp_cuda
    if main_grad.dtype == torch.float32:
        fused.wgrad_gemm_accum_fp32(total_input, grad_output, main_grad)
    else:
        fused.wgrad_gemm_accum_fp16(total_input, grad_output, main_grad)
