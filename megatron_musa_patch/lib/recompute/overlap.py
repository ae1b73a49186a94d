"""``--mlp-recompute`` on a shared expert overlapped with the token dispatch.

With ``--moe-shared-expert-overlap`` the shared expert does not run as one ``forward`` but in
pieces that the alltoall dispatcher calls between its communications (``pre_forward_comm``,
``linear_fc1_forward_and_act`` during dispatch, ``linear_fc2_forward`` and
``post_forward_comm`` during combine), on its own stream. A checkpoint around the expert would
have to span the dispatch and undo the overlap. Instead the pieces run as upstream schedules them
and the activations between them are released (``released``): after ``linear_fc2_forward``
the fc1 output and the activation output are freed, and when backward reaches fc2's output they
are recomputed -- fc1 and the activation once more, without autograd, from the fc1 input that fc1
keeps for its weight gradient anyway. The graph is untouched, so gradients are bitwise those of
the run without recompute; the expert keeps only its input, as under ``forward``.
"""

from __future__ import annotations

import weakref

import torch

from . import released

#: pending fc1 pieces per shared expert, between its fc1 and fc2 calls of one forward
_pending: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fc1_and_activation(wrapped, instance, args, kwargs, *, active: bool):
    """``SharedExpertMLP.linear_fc1_forward_and_act``: remember its input and outputs."""
    if not active:
        return wrapped(*args, **kwargs)
    fc1_input = instance.cached_fc1_input
    # 0.19's pieces check a state machine; the recompute replays fc1 from the state it ran in
    state = getattr(instance, "_overlap_state", None)
    seen = []
    hook = instance.linear_fc1.register_forward_hook(
        lambda module, inputs, output: seen.append(output[0] if isinstance(output, tuple)
                                                   else output))
    try:
        result = wrapped(*args, **kwargs)
    finally:
        hook.remove()
    if len(seen) == 1 and isinstance(fc1_input, torch.Tensor):
        _pending[instance] = (wrapped, fc1_input, seen[0], instance.cached_fc2_input, state)
    return result


def fc2(wrapped, instance, args, kwargs, *, active: bool):
    """``SharedExpertMLP.linear_fc2_forward``: then release what fc1 and the activation made."""
    result = wrapped(*args, **kwargs)
    # only the wrapper that recorded the pieces takes them (two features may wrap this)
    pending = _pending.pop(instance, None) if active else None
    if pending is not None:
        fc1_wrapped, fc1_input, fc1_output, activation, state = pending
        released.release(
            (fc1_output, activation),
            lambda: _recompute(instance, fc1_wrapped, fc1_input, state),
            until=instance.cached_fc2_output, keep=(fc1_input,))
    return result


def _recompute(instance, fc1_wrapped, fc1_input, state):
    """fc1 and the activation once more (no autograd), with the module's cached state kept."""
    saved = instance.cached_fc1_input, instance.cached_fc2_input
    saved_state = getattr(instance, "_overlap_state", None)
    seen = []
    hook = instance.linear_fc1.register_forward_hook(
        lambda module, inputs, output: seen.append(output[0] if isinstance(output, tuple)
                                                   else output))
    try:
        instance.cached_fc1_input = fc1_input
        if state is not None:
            instance._overlap_state = state
        fc1_wrapped()
        fresh = (seen[0], instance.cached_fc2_input)
    finally:
        hook.remove()
        instance.cached_fc1_input, instance.cached_fc2_input = saved
        if state is not None:
            instance._overlap_state = saved_state
    stream = getattr(instance, "stream", None)
    if stream is not None:  # upstream ran them on the expert's stream
        torch.cuda.current_stream().wait_stream(stream)
    return fresh
