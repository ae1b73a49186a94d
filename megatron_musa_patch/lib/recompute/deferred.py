"""The last linear layer of a block, in the recompute of ``--recompute-variance``: no forward.

While a block is recomputed in backward, its last ``RowParallelLinear`` (``linear_proj``,
``linear_fc2``) only has to hand back its backward: the input gradient and the weight gradient,
computed from the gradient arriving at its output and from its (recomputed) input. Its output
values are not needed -- the operations after it (bias add, dropout, residual add, the experts'
concatenation) do not read their input in backward -- so the layer's forward GEMM and its
tensor-parallel all-reduce are skipped, and the output is a zero placeholder of the right shape.

The backward is Megatron's own: the autograd functions below subclass
``LinearWithGradAccumulationAndAsyncCommunication`` / ``LinearWithFrozenWeight`` and inherit
their ``backward`` unchanged (``gradient_accumulation_fusion`` into ``main_grad``, the
``grad_added_to_main_grad`` protocol, weight-gradient deferral, the dgrad all-reduce). Their
``forward`` lets Megatron's own forward set up the backward context on a zero-row slice of the
input (no FLOPs, no communication), then saves the full input in its place.

This module imports megatron-core; it is imported when a variance recompute first runs.
"""

from __future__ import annotations

import inspect

import torch
from megatron.core.tensor_parallel import layers as _layers

from .blocks import MARK

_Linear = _layers.LinearWithGradAccumulationAndAsyncCommunication
_Frozen = _layers.LinearWithFrozenWeight


def _placeholder(like: torch.Tensor, input_: torch.Tensor, weight: torch.Tensor):
    return like.new_zeros((*input_.shape[:-1], weight.shape[0]))


class SkipForwardLinear(_Linear):
    """``LinearWithGradAccumulationAndAsyncCommunication`` without the forward GEMM."""

    @staticmethod
    def forward(ctx, input_, weight, *rest):  # the parameters of _Linear.forward
        empty = _Linear.forward(ctx, input_[:0], weight, *rest)  # Megatron sets up ctx
        ctx.save_for_backward(input_, weight)  # the full input, for the weight gradient
        return _placeholder(empty, input_, weight)


class SkipForwardFrozenLinear(_Frozen):
    """``LinearWithFrozenWeight`` without the forward GEMM (it saves only the weight)."""

    @staticmethod
    def forward(ctx, input_, weight, *rest):
        empty = _Frozen.forward(ctx, input_[:0], weight, *rest)
        return _placeholder(empty, input_, weight)


def _forward_parameters(function) -> list:
    """The autograd function's forward parameters after ``ctx``, in order."""
    return list(inspect.signature(function.forward).parameters)[1:]


def forward_impl(args, kwargs):
    """What ``RowParallelLinear._forward_impl(*args, **kwargs)`` returns, forward skipped.

    ``_forward_impl`` hands its arguments to ``linear_with_frozen_weight`` or
    ``linear_with_grad_accumulation_and_async_allreduce``; they are bound to that function's
    signature and passed to the autograd function in the order of its forward's own parameters
    (upstream names them alike; releases add some, e.g. 0.19's ``gtp_remat_size``).
    """
    weight = kwargs["weight"] if "weight" in kwargs else args[1]
    target = (_layers.linear_with_grad_accumulation_and_async_allreduce if weight.requires_grad
              else _layers.linear_with_frozen_weight)
    call = inspect.signature(target).bind(*args, **kwargs)
    call.apply_defaults()
    call = dict(call.arguments)
    if call.get("sequence_parallel"):
        raise NotImplementedError("a row-parallel layer never gathers its input (megatron-core "
                                  "passes sequence_parallel=False to its linear function)")
    call["tp_group"] = _layers.get_tensor_model_parallel_group_if_none(call.get("tp_group"))
    function, upstream = ((SkipForwardLinear, _Linear) if weight.requires_grad
                          else (SkipForwardFrozenLinear, _Frozen))
    out = function.apply(*(call[name] for name in _forward_parameters(upstream)))
    setattr(out, MARK, True)
    return out
