"""The patches: wrappers around upstream methods that read the layer's config when called.

* ``TransformerLayer._forward_attention`` -- ``--attn-recompute``: the whole attention block
  (input norm, self-attention with its output projection, bias-dropout-add) is one checkpoint;
  with ``--recompute-variance`` its recompute skips ``linear_proj``'s forward. Variance alone:
  the input norm's output is released and recomputed (``norm_output``).
* ``TransformerLayer._forward_mlp`` -- ``--mlp-recompute`` on a dense layer: the same for the MLP
  block (pre-MLP norm, fc1, activation, fc2, bias-dropout-add), skipping ``linear_fc2``. On a
  MoE layer, and for variance alone: the pre-MLP norm's output is released and recomputed; the
  MoE experts and shared experts are checkpointed by the two wrappers below, so the router and
  the token dispatch (its collectives) run once.
* ``SequentialMLP/GroupedMLP/TEGroupedMLP.forward`` and ``MLP.forward`` on a shared expert -- the
  expert computation and the shared experts under ``--mlp-recompute`` (variance: every local
  expert's ``linear_fc2`` and the shared expert's; a shared expert's gate stays outside the
  checkpoint, keeping the fc2 output its gradient needs).
* ``RowParallelLinear._forward_impl`` and ``reduce_from_tensor_model_parallel_region`` (in
  ``tensor_parallel.layers``) -- a deferred linear skips its GEMM and all-reduce.

Outside training (``module.training`` false, no autograd, an inference context) every wrapper
calls upstream unchanged. Each wrapper takes ``require`` first, bound by the feature:
``require(flag)`` refuses a flag set on a config whose feature is off or broken, with the
session's one paragraph (this package knows no feature names).
"""

from __future__ import annotations

import sys

import torch

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.base.errors import ArgumentError, FeatureUnavailableError
from . import overlap, rules
from .blocks import MARK, checkpoint_block, deferred_ids

# ----------------------------------------------------------------------------- helpers


def _flags(config):
    return (getattr(config, "attn_recompute", False), getattr(config, "mlp_recompute", False),
            getattr(config, "recompute_variance", False))


def _training_call(module, kwargs=None) -> bool:
    if not (module.training and torch.is_grad_enabled()):
        return False
    return not (kwargs and (kwargs.get("inference_context") is not None
                            or kwargs.get("inference_params") is not None))


def verify(require, config) -> None:
    """The rules, once per combination of settings on this config (users may change them);
    ``require(flag)`` refuses a flag whose feature cannot serve it (the feature binds it)."""
    key = (tuple(rules.requested(config)), getattr(config, "recompute_granularity", None),
           getattr(config, "recompute_method", None), getattr(config, "recompute_num_layers", None),
           tuple(getattr(config, "recompute_modules", None) or ()))
    if getattr(config, "_mmp_recompute_verified", None) == key:
        return
    found = rules.problems(config, check_impl=False)
    if found:
        raise ArgumentError(found[0])
    for flag in rules.requested(config):
        require(flag)
    config._mmp_recompute_verified = key


def last_linear(owner, name: str):
    """The block's last linear layer, which ``--recompute-variance`` does not re-run."""
    from megatron.core.tensor_parallel.layers import RowParallelLinear

    linear = getattr(owner, name, None)
    if not isinstance(linear, RowParallelLinear):
        raise FeatureUnavailableError(
            f"--recompute-variance applies the backward of megatron-core's RowParallelLinear "
            f"without its forward, but {type(owner).__name__}.{name} is "
            f"{type(linear).__name__}. Use megatron-core's local layer spec (--transformer-impl "
            f"local) or drop --recompute-variance.")
    return linear


def _has_norm(norm) -> bool:
    from megatron.core.transformer.identity_op import IdentityOp

    return norm is not None and not isinstance(norm, IdentityOp)


def _with_norm_recompute(wrapped, args, kwargs, norm):
    """``wrapped(*args, **kwargs)``; the output of ``norm`` inside it is not kept for backward
    but recomputed from the norm's input (``norm_output``)."""
    if not _has_norm(norm):
        return wrapped(*args, **kwargs)
    from .norm_output import NormOutput

    seen = []
    handle = norm.register_forward_hook(lambda module, inputs, output: seen.append((inputs,
                                                                                     output)))
    try:
        out = wrapped(*args, **kwargs)
    finally:
        handle.remove()
    first = out[0] if isinstance(out, (tuple, list)) else out
    if len(seen) == 1 and isinstance(first, torch.Tensor) and first.requires_grad:
        NormOutput.release(norm, *seen[0], until=first)
    return out


# ----------------------------------------------------------------------------- layer blocks


def forward_attention(require, wrapped, instance, args, kwargs):
    attn, _, variance = _flags(instance.config)
    if not (attn or variance) or not _training_call(instance, kwargs):
        return wrapped(*args, **kwargs)
    verify(require, instance.config)
    if attn:
        defer = (last_linear(instance.self_attention, "linear_proj"),) if variance else ()
        return checkpoint_block(wrapped, args, kwargs, defer)
    return _with_norm_recompute(wrapped, args, kwargs, instance.input_layernorm)


def forward_mlp(require, wrapped, instance, args, kwargs):
    _, mlp, variance = _flags(instance.config)
    if not (mlp or variance) or not _training_call(instance, kwargs):
        return wrapped(*args, **kwargs)
    verify(require, instance.config)
    if mlp and not instance.is_moe_layer:
        defer = (last_linear(instance.mlp, "linear_fc2"),) if variance else ()
        return checkpoint_block(wrapped, args, kwargs, defer)
    return _with_norm_recompute(wrapped, args, kwargs, instance.pre_mlp_layernorm)


# ----------------------------------------------------------------------------- MoE


def experts_forward(require, wrapped, instance, args, kwargs):
    _, mlp, variance = _flags(instance.config)
    if not mlp or not _training_call(instance):
        return wrapped(*args, **kwargs)
    verify(require, instance.config)
    defer = ()
    if variance:
        defer = _experts_last_gemm(instance)
    return checkpoint_block(wrapped, args, kwargs, defer)


def _experts_last_gemm(instance):
    """What the variance recompute of the experts skips: every local expert's ``linear_fc2``
    (SequentialMLP), or the grouped fc2 GEMM on ``weight2`` (GroupedMLP, see ``grouped``)."""
    experts = getattr(instance, "local_experts", None)
    if experts is not None:
        return tuple(last_linear(expert, "linear_fc2") for expert in experts)
    weight = getattr(instance, "weight2", None)
    if isinstance(weight, torch.Tensor):
        return (weight,)
    raise FeatureUnavailableError(
        f"--recompute-variance with --mlp-recompute skips the experts' last GEMM in the "
        f"recompute; {type(instance).__name__} (TransformerEngine's grouped linear) brings its "
        f"own backward. Use megatron-core's local layer spec (--transformer-impl local), or drop "
        f"--recompute-variance.")


def shared_experts_forward(require, wrapped, instance, args, kwargs):
    """``MLP.forward``, on a MoE layer's shared expert only: ``SharedExpertMLP.forward`` calls it
    and then multiplies by its optional gate, which so stays outside the checkpoint -- that
    product's backward reads the fc2 output, and with the gate's own use of the norm output
    outside, the gradient sums into the norm output keep the order of the run without
    recompute (checkpointing the gated forward whole changes their order in the last bits)."""
    _, mlp, variance = _flags(instance.config)
    if not mlp or not _is_shared_expert(instance) or not _training_call(instance):
        return wrapped(*args, **kwargs)
    verify(require, instance.config)
    defer = (last_linear(instance, "linear_fc2"),) if variance else ()
    return checkpoint_block(wrapped, args, kwargs, defer)


def overlapped_shared_fc1(require, wrapped, instance, args, kwargs):
    """``SharedExpertMLP.linear_fc1_forward_and_act`` (``--moe-shared-expert-overlap``)."""
    return overlap.fc1_and_activation(wrapped, instance, args, kwargs,
                                      active=_overlap_recomputed(require, instance))


def overlapped_shared_fc2(require, wrapped, instance, args, kwargs):
    """``SharedExpertMLP.linear_fc2_forward`` (``--moe-shared-expert-overlap``)."""
    return overlap.fc2(wrapped, instance, args, kwargs,
                       active=_overlap_recomputed(require, instance))


def _overlap_recomputed(require, instance) -> bool:
    if not getattr(instance.config, "mlp_recompute", False) or not _training_call(instance):
        return False
    verify(require, instance.config)
    return True


def _is_shared_expert(module) -> bool:
    shared = sys.modules.get("megatron.core.transformer.moe.shared_experts")
    return shared is not None and isinstance(module, shared.SharedExpertMLP)


# ----------------------------------------------------------------------------- deferred linear


def row_parallel_forward_impl(wrapped, instance, args, kwargs):
    if id(instance) not in deferred_ids():
        return wrapped(*args, **kwargs)
    from .deferred import forward_impl

    return forward_impl(args, kwargs)


def reduce_passes_deferred(wrapped, instance, args, kwargs):
    """The all-reduce after a deferred linear: its backward is the identity, its forward is
    not needed (the output is a placeholder)."""
    tensor = call_arguments(wrapped, args, kwargs)["input_"]
    if getattr(tensor, MARK, False):
        return tensor
    return wrapped(*args, **kwargs)
