"""Upstream bugs on paths NVIDIA's own setups rarely take (every device, CUDA included).

Without TransformerEngine / Apex:

* ``CheckpointWithoutOutput(fp8=False)`` sets ``self.fp8 = fp8 is not None`` (True), so its
  forward takes the fp8 branch and hits ``FP8GlobalStateManager`` (NameError without TE).
* ``moe_utils`` imports ``te_general_gemm`` only inside its TE ``try`` and then tests
  ``te_general_gemm is not None`` (NameError without TE).
* ``OptimizerConfig.__post_init__`` calls ``is_te_min_version`` for the precision-aware
  optimizer; without TE that compares ``None`` with a version (TypeError).
* ``DistributedOptimizer.state_dict`` without Apex/TE reads ``step`` from the torch optimizer's
  per-parameter state, which torch creates at the first step: loading a checkpoint (which builds
  the state-dict template first) fails with a bare AssertionError; its ``load_state_dict``
  then gives every parameter *one shared* ``step`` tensor (torch's Adam increments it once
  per parameter per step), and the parameter-state copy overwrites its value: after loading,
  each parameter gets its own ``step`` holding the checkpoint's value. The legacy format
  (``--ckpt-format torch``) saves the parameter state without that ``step`` and its loader
  copies every key of the live state (KeyError): the loaded ``step`` is kept.

On every device, with the local spec:

* MoE experts with biases (no ``--disable-bias-linear``, ``SequentialMLP``): ``MLP.forward`` adds
  the probability-scaled fc2 bias *in place* to the fc2 output, which is the tensor the
  tensor-parallel reduction's autograd function returned as-is (at any TP size); autograd
  refuses ("Output 0 of _ReduceFromModelParallelRegion is a view and is being modified
  inplace"). The bias is added out of place instead: the same sum, one new tensor.

* MoE with experts that are not split like the dense layers but without expert parallelism
  (``--expert-model-parallel-size 1`` and ``--expert-tensor-parallel-size`` other than
  ``--tensor-model-parallel-size``, e.g. TP2 with ETP1): each tensor-parallel rank runs every
  expert on its own tokens, but upstream marks expert parameters for the expert-data-parallel
  reduction only when EP > 1, so their gradients are reduced over the dense data-parallel group,
  which leaves out the other tensor-parallel ranks: the experts silently diverge across them.
  Those parameters are marked as expert-parallel (``allreduce = False``), so the gradient
  buffers, the optimizer and the norm treat them as upstream does with EP > 1.

With the fp32 distributed optimizer:

* its main parameters are views of the (grad-requiring) model parameters, so loading a
  checkpoint's parameter state with ``copy_`` fails ("a view of a leaf Variable that requires
  grad is being used in an in-place operation"): the copy runs under ``torch.no_grad()``.
"""

from __future__ import annotations

import importlib.util
import sys

from ..hookspecs import hookimpl
from ..registry import Patch

FEATURE = "upstream_fixes"
REQUIRED = False
DESCRIPTION = "fixes for upstream bugs without TE/Apex and in fp32 distributed-optimizer resume"


def _te_missing():
    return True if importlib.util.find_spec("transformer_engine") is None else "TE is installed"


@hookimpl
def mmp_register_patches(registry, device):
    registry.add(Patch(
        "upstream.checkpoint_without_output_fp8",
        "megatron.core.tensor_parallel.random:CheckpointWithoutOutput.__init__", "wrap",
        _checkpoint_without_output_init, FEATURE, condition=_te_missing,
        why="fp8=False/None means no fp8; without TE there is no fp8 at all"))
    registry.add(Patch(
        "upstream.moe_te_general_gemm", "megatron.core.transformer.moe.moe_utils:te_general_gemm",
        "attribute", None, FEATURE, create=True, condition=_moe_utils_lacks_gemm,
        why="define the name the router tests for (None: use torch.mm)"))
    registry.add(Patch(
        "upstream.expert_bias_out_of_place", "megatron.core.transformer.mlp:MLP.forward", "wrap",
        _expert_bias_out_of_place, FEATURE,
        why="MoE experts with biases: the scaled fc2 bias is added out of place (upstream's "
            "in-place add on the TP reduction's output fails in autograd)"))
    registry.add(Patch(
        "upstream.experts_reduced_over_expert_dp",
        "megatron.core.transformer.moe.moe_layer:MoELayer.__init__", "wrap",
        _mark_experts_for_expert_dp, FEATURE,
        why="EP1 with ETP != TP: expert gradients are reduced over the expert-data-parallel "
            "group (upstream leaves out the tensor-parallel ranks)"))
    registry.add(Patch(
        "upstream.distopt_state_dict_before_first_step",
        "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.state_dict", "wrap",
        _state_dict_before_first_step, FEATURE, condition=_distopt_without_apex_or_te,
        why="checkpoint loading asks for the state dict before any step: step 0"))
    registry.add(Patch(
        "upstream.distopt_load_state_dict_steps",
        "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.load_state_dict", "wrap",
        _load_state_dict_with_own_steps, FEATURE, condition=_distopt_without_apex_or_te,
        why="one step tensor per parameter, holding the checkpoint's step"))
    registry.add(Patch(
        "upstream.distopt_load_param_state_no_grad",
        "megatron.core.optimizer.distrib_optimizer:"
        "DistributedOptimizer._set_main_param_and_optimizer_states", "wrap", _without_grad,
        FEATURE, why="fp32 main params are views of grad-requiring params: copy without autograd"))
    registry.add(Patch(
        "upstream.distopt_legacy_param_state_step",
        "megatron.core.optimizer.distrib_optimizer:"
        "DistributedOptimizer._set_main_param_and_optimizer_states", "wrap", _keep_loaded_step,
        FEATURE, condition=_distopt_without_apex_or_te,
        why="--ckpt-format torch parameter state has no per-parameter step: keep the loaded one"))
    registry.add(Patch(
        "upstream.optimizer_config_te_version",
        "megatron.core.optimizer.optimizer_config:is_te_min_version", "wrap",
        _false_without_te, FEATURE, condition=_te_missing,
        why="no TE means no TE version is new enough"))


def _distopt_without_apex_or_te():
    module = sys.modules.get("megatron.core.optimizer.distrib_optimizer")
    if module is not None and getattr(module, "HAVE_APEX_OR_TE", True):
        return "Apex or TE is installed"
    return True


_NO_STEP_YET = "_mmp_no_step_yet"


def _state_dict_before_first_step(wrapped, instance, args, kwargs):
    """Before the first step the torch optimizer has no state: record step 0 through a
    placeholder entry (non-tensor keys pass through torch's state_dict unchanged)."""
    inner = instance.optimizer
    if inner.state:
        return wrapped(*args, **kwargs)
    import torch

    inner.state[_NO_STEP_YET] = {"step": torch.tensor(0.0)}
    try:
        return wrapped(*args, **kwargs)
    finally:
        inner.state.pop(_NO_STEP_YET, None)


def _load_state_dict_with_own_steps(wrapped, instance, args, kwargs):
    state_dict = kwargs.get("state_dict", args[0] if args else None)
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


def _without_grad(wrapped, instance, args, kwargs):
    import torch

    with torch.no_grad():
        return wrapped(*args, **kwargs)


def _keep_loaded_step(wrapped, instance, args, kwargs):
    call = dict(zip(("model_param", "tensors"), args), **kwargs)
    if not instance.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
        group_index, group_order = instance.model_param_group_index_map[call["model_param"]]
        main_param = instance.optimizer.param_groups[group_index]["params"][group_order]
        state = instance.optimizer.state[main_param]
        if "step" in state and "step" not in call["tensors"]:
            call["tensors"] = {**call["tensors"], "step": state["step"]}
    return wrapped(**call)


def _checkpoint_without_output_init(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    fp8 = kwargs.get("fp8", args[0] if args else False)
    module = sys.modules["megatron.core.tensor_parallel.random"]
    instance.fp8 = bool(getattr(module, "HAVE_TE", False)) and fp8 not in (None, False)


def _moe_utils_lacks_gemm():
    module = sys.modules.get("megatron.core.transformer.moe.moe_utils")
    if module is not None and "te_general_gemm" in vars(module):
        return "moe_utils defines te_general_gemm"
    return True


def _false_without_te(wrapped, instance, args, kwargs):
    return False


def _mlp_call(hidden_states, per_token_scale=None, **kwargs):
    return hidden_states, per_token_scale


def _expert_bias_out_of_place(wrapped, instance, args, kwargs):
    """Upstream's MLP.forward with fc2's separate bias held back from it (so its in-place add is
    skipped) and added out of place to the result, scaled per token as upstream does."""
    _, per_token_scale = _mlp_call(*args, **kwargs)
    fc2 = getattr(instance, "linear_fc2", None)
    if per_token_scale is None or fc2 is None or "forward" in vars(fc2):
        return wrapped(*args, **kwargs)
    held = []
    forward = fc2.forward

    def forward_holding_bias(*fc2_args, **fc2_kwargs):
        output, bias = forward(*fc2_args, **fc2_kwargs)
        held.append(bias)
        return output, None

    fc2.forward = forward_holding_bias  # this call only: the instance attribute is removed below
    try:
        output, output_bias = wrapped(*args, **kwargs)
    finally:
        del fc2.forward
    bias = held[-1] if held else None
    if bias is not None:
        output = output + bias.unsqueeze(0) * per_token_scale.unsqueeze(-1)
    return output, output_bias


def _mark_experts_for_expert_dp(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    config = instance.config
    tp = config.tensor_model_parallel_size
    etp = config.expert_tensor_parallel_size or tp
    if config.expert_model_parallel_size == 1 and etp != tp and instance.experts is not None:
        for param in instance.experts.parameters():
            param.allreduce = False
