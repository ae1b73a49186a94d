"""MT-Megatron's RMSNorm recompute variants: norm outputs not kept, recomputed in backward.

* ``--q-rms-recompute`` (``config.q_rms_recompute``; MLA): the outputs of MLA's q and kv
  RMSNorms (``q_layernorm``, ``kv_layernorm``, the up-projections' inputs) are released after
  ``get_query_key_value_tensors`` and recomputed from the norms' inputs when backward reaches
  the query (q) or the key (kv). MT-Megatron checkpoints norm + up-projection for the same
  saving; here only the norm re-runs.
* ``--mlp-rms-recompute`` (``config.mlp_rms_recompute``): on MoE layers, the pre-MLP RMSNorm's
  output and the shared expert are not kept -- the norm output is released (``norm_output``),
  the shared expert checkpointed as under ``--mlp-recompute`` (its fc2 skipped with
  ``--recompute-variance``; overlapped with the dispatch, its activations released:
  ``overlap``). MT-Megatron recomputes exactly these on MoE layers; on dense layers the flag acts
  only together with ``--mlp-recompute``, which already recomputes the whole block.
* ``--mla-rms-recompute`` needs ``--attn-recompute`` (MT-Megatron's own rule), whose checkpoint
  already recomputes what it names (the pre-attention RMSNorm and the q/kv down projections):
  nothing to do here.

Where ``--attn-recompute`` / ``--mlp-recompute`` already recompute a block, these do nothing in
it. The graph is the one of the run without recompute, so gradients are bitwise equal.
"""

from __future__ import annotations

from . import overlap
from .norm_output import NormOutput
from .wrappers import (_has_norm, _training_call, _with_norm_recompute, checkpoint_block,
                       last_linear, verify)


def _on(config, name) -> bool:
    return bool(getattr(config, name, False))


# ----------------------------------------------------------------------------- --q-rms-recompute


def mla_qkv_norms(require, wrapped, instance, args, kwargs):
    """``MLASelfAttention.get_query_key_value_tensors``: release the q/kv norm outputs."""
    config = instance.config
    if not _on(config, "q_rms_recompute") or _on(config, "attn_recompute") or \
            not _training_call(instance, kwargs):
        return wrapped(*args, **kwargs)
    verify(require, config)
    seen = {}
    handles = []
    for name in ("q_layernorm", "kv_layernorm"):
        norm = getattr(instance, name, None)
        if _has_norm(norm):
            handles.append(norm.register_forward_hook(
                lambda module, inputs, output, name=name: seen.setdefault(name, []).append(
                    (module, inputs, output))))
    try:
        out = wrapped(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    query, key = out[0], out[1]
    for name, until in (("q_layernorm", query), ("kv_layernorm", key)):
        calls = seen.get(name, [])
        if len(calls) == 1 and until is not None and until.requires_grad:
            NormOutput.release(*calls[0], until=until)
    return out


# ----------------------------------------------------------------------------- --mlp-rms-recompute


def _mlp_rms_only(config) -> bool:
    """--mlp-rms-recompute where --mlp-recompute does not already recompute more."""
    return _on(config, "mlp_rms_recompute") and not _on(config, "mlp_recompute")


def pre_mlp_norm(require, wrapped, instance, args, kwargs):
    """``TransformerLayer._forward_mlp`` of a MoE layer: the pre-MLP norm output released
    (``--recompute-variance`` alone already does it)."""
    config = instance.config
    if not (_mlp_rms_only(config) and instance.is_moe_layer) or \
            _on(config, "recompute_variance") or not _training_call(instance, kwargs):
        return wrapped(*args, **kwargs)
    verify(require, config)
    return _with_norm_recompute(wrapped, args, kwargs, instance.pre_mlp_layernorm)


def shared_expert(require, wrapped, instance, args, kwargs):
    """``MLP.forward`` of a shared expert: checkpointed, as ``--mlp-recompute`` does."""
    from .wrappers import _is_shared_expert

    config = instance.config
    if not _mlp_rms_only(config) or not _is_shared_expert(instance) or \
            not _training_call(instance):
        return wrapped(*args, **kwargs)
    verify(require, config)
    defer = (last_linear(instance, "linear_fc2"),) if _on(config, "recompute_variance") else ()
    return checkpoint_block(wrapped, args, kwargs, defer)


def _overlap_active(require, instance) -> bool:
    if not _mlp_rms_only(instance.config) or not _training_call(instance):
        return False
    verify(require, instance.config)
    return True


def overlapped_shared_fc1(require, wrapped, instance, args, kwargs):
    return overlap.fc1_and_activation(wrapped, instance, args, kwargs,
                                      active=_overlap_active(require, instance))


def overlapped_shared_fc2(require, wrapped, instance, args, kwargs):
    return overlap.fc2(wrapped, instance, args, kwargs,
                       active=_overlap_active(require, instance))
