"""torch's Adam steps moments that megatron-core's ``init_state_fn`` filled before any step.

Without Apex/TE megatron-core falls back to torch's ``AdamW``, and its ``init_state_fn`` (which
checkpointing calls to lay out the state, and upstream's tests call to seed it) fills only the
moments (``exp_avg``, ``exp_avg_sq``). torch's Adam creates a parameter's ``step`` together with
its moments at that parameter's first step, so a state that has moments and no ``step`` stops
the next ``step()`` with a bare ``KeyError: 'step'``; TE's and Apex's ``FusedAdam`` keep the
step in the parameter group and step on. The fix gives each such state, right before
megatron-core steps the torch optimizer, the step the other states share, else 0: for moments
filled before any step, what torch's Adam itself would have made of a fresh state.
"""

from __future__ import annotations

from megatron_musa_patch.core.hookspecs import hookimpl
from .adam_steps import shared_step
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "torch's Adam steps moments init_state_fn filled before any step, as FusedAdam does")

OPTIMIZER = "megatron.core.optimizer.optimizer"


@hookimpl
def mmp_register_patches(registry):
    # every megatron-core optimizer steps its torch optimizer in one of these two (the
    # distributed one through MixedPrecisionOptimizer's)
    for owner in ("MixedPrecisionOptimizer", "FP32Optimizer"):
        registry.add(FEATURE.patch(
            owner, f"{OPTIMIZER}:{owner}.step_with_ready_grads", "wrap",
            _step_with_complete_states,
            why="torch's Adam wants a 'step' wherever it finds moments; init_state_fn fills "
                "the moments only"))


def _step_with_complete_states(wrapped, instance, args, kwargs):
    give_missing_steps(getattr(instance, "optimizer", None))
    return wrapped(*args, **kwargs)


def give_missing_steps(optimizer) -> None:
    """Give the states of ``optimizer`` (torch's Adam or AdamW) that have moments but no
    ``step`` the step the others share, else 0, as the tensor torch's Adam would make."""
    import torch

    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return
    states = optimizer.state
    without_step = [(group, p) for group in optimizer.param_groups for p in group["params"]
                    if states.get(p) and "step" not in states[p]]
    if not without_step:
        return
    step = shared_step(states.values())
    if step is None:  # steps that differ: torch's own KeyError stays, as upstream
        return
    for group, p in without_step:
        fused = bool(group.get("fused"))
        on_device = fused or bool(group.get("capturable"))
        states[p]["step"] = torch.tensor(step, dtype=_scalar_dtype(fused),
                                         device=p.device if on_device else None)


def _scalar_dtype(fused: bool):
    """The dtype torch's Adam keeps a step in: float32, or float64 under a float64 default
    dtype when not fused."""
    import torch

    if not fused and torch.get_default_dtype() == torch.float64:
        return torch.float64
    return torch.float32
