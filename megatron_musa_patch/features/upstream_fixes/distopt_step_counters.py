"""The distributed optimizer's per-parameter ``step`` without Apex/TE, around checkpoint loads.

``DistributedOptimizer.state_dict`` without Apex/TE reads ``step`` from the torch optimizer's
per-parameter state, which torch creates at the first step: loading a checkpoint (which builds
the state-dict template first) fails with a bare AssertionError, and a state whose moments
were filled before any step (upstream's ``init_state_fn``) with a bare KeyError. Its
``load_state_dict`` then gives every parameter *one shared* ``step`` tensor (torch's Adam
increments it once per parameter per step), and the parameter-state copy overwrites its value:
after loading, each parameter gets its own ``step`` holding the checkpoint's value. The legacy
format (``--ckpt-format torch``) saves the parameter state without that ``step`` and its loader
copies every key of the live state (KeyError): the loaded ``step`` is kept.
"""

from __future__ import annotations

import sys

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.core.hookspecs import hookimpl
from .adam_steps import shared_step
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "per-parameter optimizer steps survive checkpoint loads without Apex/TE")

DISTOPT = "megatron.core.optimizer.distrib_optimizer"
_NO_STEP_YET = "_mmp_no_step_yet"


@hookimpl
def mmp_register_patches(registry):
    def add(pid, method, impl, why):
        registry.add(FEATURE.patch(pid, f"{DISTOPT}:DistributedOptimizer.{method}", "wrap",
                                   impl, condition=_without_apex_or_te, why=why))

    add("state_dict_before_first_step", "state_dict", _state_dict_before_first_step,
        "the state dict of parameters that have not stepped yet (checkpoint loading asks for it "
        "before any step; init_state_fn fills moments only): step 0")
    add("load_state_dict", "load_state_dict", _load_state_dict_with_own_steps,
        "one step tensor per parameter, holding the checkpoint's step")
    add("legacy_param_state", "_set_main_param_and_optimizer_states", _keep_loaded_step,
        "--ckpt-format torch parameter state has no per-parameter step: keep the loaded one")


def _without_apex_or_te():
    module = sys.modules.get(DISTOPT)
    if module is not None and getattr(module, "HAVE_APEX_OR_TE", True):
        return "Apex or TE is installed"
    return True


def _state_dict_before_first_step(wrapped, instance, args, kwargs):
    """Record step 0 for what has not stepped yet, for the length of the call only.

    With no state at all, a placeholder entry carries it (non-tensor keys pass through torch's
    state_dict unchanged). A state without ``step`` (empty, or moments filled before any step by
    upstream's ``init_state_fn`` or a test) gets the step the stepped states share, else 0; it
    is taken off again so that torch's Adam finds the state as it was left."""
    import torch

    inner = instance.optimizer
    if not inner.state:
        inner.state[_NO_STEP_YET] = {"step": torch.tensor(0.0)}
        try:
            return wrapped(*args, **kwargs)
        finally:
            inner.state.pop(_NO_STEP_YET, None)
    without_step = [state for state in inner.state.values() if "step" not in state]
    step = shared_step(inner.state.values())
    if not without_step or step is None:  # several steps: upstream's own assertion says so
        return wrapped(*args, **kwargs)
    for state in without_step:
        state["step"] = torch.tensor(step)
    try:
        return wrapped(*args, **kwargs)
    finally:
        for state in without_step:
            state.pop("step", None)


def _load_state_dict_with_own_steps(wrapped, instance, args, kwargs):
    state_dict = call_arguments(wrapped, args, kwargs).get("state_dict")
    result = wrapped(*args, **kwargs)
    groups = state_dict.get("optimizer", {}).get("param_groups", []) if state_dict else []
    steps = {g["step"] for g in groups if g.get("step") is not None}
    if len(steps) == 1:
        import torch

        step = float(steps.pop())
        for param_state in instance.optimizer.state.values():
            if "step" in param_state:
                param_state["step"] = torch.tensor(step, dtype=torch.float32)
    return result


def _keep_loaded_step(wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    if not instance.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
        group_index, group_order = instance.model_param_group_index_map[call["model_param"]]
        main_param = instance.optimizer.param_groups[group_index]["params"][group_order]
        state = instance.optimizer.state[main_param]
        if "step" in state and "step" not in call["tensors"]:
            call["tensors"] = {**call["tensors"], "step": state["step"]}
    return wrapped(**call)
