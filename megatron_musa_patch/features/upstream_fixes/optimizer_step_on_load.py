"""Loading moments saved before any step into torch's Adam, in the non-distributed optimizers.

torch's Adam/AdamW keep a per-parameter ``step``, which they create at their first step, and
their ``load_state_dict`` refuses a non-empty state without one (a bare ``KeyError: 'step'``).
megatron-core's ``FP32Optimizer`` and ``Float16OptimizerWithFloat16Params`` save the step once,
as ``common_step``, and only when it is truthy (``if step:``), and their ``init_state_fn``
(which a checkpoint load calls first) fills only the moments: so a checkpoint saved at step 0,
or from moments filled before any step, cannot be loaded without Apex/TE. TE's and Apex's
``FusedAdam`` keep the step in the parameter group and take it. The fix gives each such state the
step the others share, else 0 -- the step its checkpoint was saved at.
"""

from __future__ import annotations

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from .adam_steps import shared_step
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "torch's Adam loads moments saved before any step (at step 0), as FusedAdam does")

OPTIMIZER = "megatron.core.optimizer.optimizer"


@hookimpl
def mmp_register_patches(registry):
    for owner in ("FP32Optimizer", "Float16OptimizerWithFloat16Params"):
        registry.add(FEATURE.patch(
            owner, f"{OPTIMIZER}:{owner}.load_state_dict", "wrap",
            _load_with_steps,
            why="torch's Adam refuses a loaded state without 'step'; megatron-core saves none "
                "at step 0"))


def _load_with_steps(wrapped, instance, args, kwargs):
    import torch

    if isinstance(getattr(instance, "optimizer", None), (torch.optim.Adam, torch.optim.AdamW)):
        state_dict = call_arguments(wrapped, args, kwargs).get("state_dict")
        _give_missing_steps(_torch_state(state_dict))
    return wrapped(*args, **kwargs)


def _torch_state(state_dict):
    """The torch optimizer's ``state`` inside either class's state dict (Float16's nests it,
    under an older name in old checkpoints)."""
    if not isinstance(state_dict, dict):
        return None
    for holder in (state_dict, state_dict.get("optimizer"), state_dict.get("optimizer_state_dict")):
        if isinstance(holder, dict) and isinstance(holder.get("state"), dict):
            return holder["state"]
    return None


def _give_missing_steps(state):
    if not state or "common_step" in state:  # upstream restores that step itself
        return
    import torch

    per_param = [s for s in state.values() if isinstance(s, dict) and s]
    step = shared_step(per_param)
    if step is None:  # steps that differ: upstream's own check says so
        return
    for param_state in per_param:
        param_state.setdefault("step", torch.tensor(step))
