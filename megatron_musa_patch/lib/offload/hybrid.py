"""Patches on megatron-core's ``HybridDeviceOptimizer`` and the distributed optimizer's use of it.

Streams, events, ``torch.cuda.current_stream()`` and ``.to("cuda")`` in the upstream class are
looked up through ``torch.cuda`` when called, so the device layer already maps them to the
selected device (CPU: synchronous streams); what the class decides by itself is fixed here:

* ``split_param_groups_for(device)`` -- which parameters are stepped on the host, decided by the device row
  (``partition``), with host copies pinned where the row has page-locked memory.
* ``place_state`` -- each sub-optimizer's state on its parameters' device (upstream tells host
  from device optimizers by class, and both are ``torch.optim.AdamW`` without TE); moments in
  the dtypes a precision-aware sub-optimizer stores them in.
* ``keep_masters_in_step`` -- after a load, the tensors the sub-optimizers step on (host copies,
  fp32 masters) take the loaded master weights, and the state's ``master_param`` is that tensor
  again, so an in-place checkpoint load lands where the step reads. Upstream copies only into
  fp32 masters of 16-bit parameters (KeyError for fp32 ones) and leaves ``master_param`` on a
  tensor its post-load rebuild replaced.
* ``initialize_state`` -- the state a load needs, created without moving any weight.
* ``set_own_grads`` -- device-side fp32 parameters stepped as themselves get their gradient from
  ``decoupled_grad`` (the precision-aware path sets only that; upstream stepped them without).
* ``refresh_host_copies`` -- ``reload_model_params`` also refreshes fp32 host copies.

On the distributed optimizer:

* ``leaf_shards`` -- its fp32 shards are views of grad-requiring parameters, which a torch
  optimizer refuses ("can't optimize a non-leaf Tensor") when the hybrid optimizer is rebuilt on
  them: give it detached views of the same memory (with their tensor-parallel attributes).
* ``settle_loaded_state`` / ``place_state_after_load`` -- apply the two fixes above after each
  parameter's state is set from a checkpoint and after ``load_state_dict``.
* ``state_dict_without_classes`` -- the sub-optimizer classes stay out of checkpoints.
"""

from __future__ import annotations

import torch

from megatron_musa_patch.upstream.binding import call_arguments
from . import partition

_MODEL_PARALLEL_ATTRIBUTES = ("tensor_model_parallel", "partition_dim", "partition_stride",
                              "shared")


def _is_hybrid(optimizer) -> bool:
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    return isinstance(optimizer, HybridDeviceOptimizer)


# ------------------------------------------------------------------------ HybridDeviceOptimizer


def split_param_groups_for(device):
    """Replacement of ``HybridDeviceOptimizer._get_sub_optimizer_param_groups`` for the selected
    ``device`` (a ``DeviceMapping``): it decides what is on the accelerator."""

    def split_param_groups(self, offload_fraction):
        pin = bool(getattr(self, "pin_cpu_params", True)) and device.pinned_memory
        return partition.split(
            self.param_groups, offload_fraction,
            on_device=partition.on_device_of(device.torch_type),
            to_host=partition.host_tensor_maker(pin),
            fp32_masters=bool(self.param_update_in_fp32)).as_upstream()

    return split_param_groups


def place_state(self):
    """Replaces ``HybridDeviceOptimizer._move_new_state_to_right_device``."""
    for optimizer in self.sub_optimizers:
        for param in list(optimizer.state):
            _place(self, optimizer, param)


def _place(hybrid, optimizer, param) -> None:
    state = optimizer.state[param]
    owner_state = hybrid.state.get(hybrid.inner_param_to_orig_param.get(param, param))
    dtypes = getattr(optimizer, "state_dtypes", {})
    step_on_device = any(g.get("fused") or g.get("capturable") for g in optimizer.param_groups)
    for key, value in list(state.items()):
        if not torch.is_tensor(value) or key == "master_param":
            continue
        if key == "step":
            device, dtype = (param.device if step_on_device else value.device), value.dtype
        else:
            device, dtype = param.device, dtypes.get(key, value.dtype)
        if value.device != device or value.dtype != dtype:
            state[key] = value.to(device=device, dtype=dtype)
            if owner_state is not None and owner_state is not state:
                owner_state[key] = state[key]


def _sub_optimizer_of(hybrid, stepped):
    """The sub-optimizer stepping ``stepped`` (cached until the sub-optimizers are rebuilt)."""
    subs = hybrid.sub_optimizers
    key = tuple(id(o) for o in subs)
    cache = getattr(hybrid, "_mmp_sub_of", None)
    if cache is None or cache[0] != key:
        cache = (key, {id(p): o for o in subs for g in o.param_groups for p in g["params"]})
        hybrid._mmp_sub_of = cache
    return cache[1].get(id(stepped))


def keep_masters_in_step(self):
    """Replaces ``HybridDeviceOptimizer._update_fp32_params_by_new_state``."""
    for owner in list(self.state):
        settle(self, owner)


def settle(hybrid, owner) -> None:
    """The tensor stepped for ``owner`` holds the state's master weights, and ``master_param``
    is that tensor."""
    stepped = hybrid.param_to_inner_param.get(owner) if torch.is_tensor(owner) else None
    state = hybrid.state.get(owner) if stepped is not None else None
    if state is None:
        return
    master = state.get("master_param")
    if master is not None and master is not stepped:
        with torch.no_grad():
            stepped.copy_(master)
    if master is not None or hybrid.param_update_in_fp32:
        state["master_param"] = stepped


def initialize_state(self):
    """Replaces ``HybridDeviceOptimizer.dummy_step``, which creates the state before a load by
    stepping on random gradients and so moves every weight (host copies, fp32 masters and,
    through the copy-back, the model's own) one step away from the checkpoint -- for good when
    the model was loaded first (``--ckpt-format torch``). Here the tensors it steps on are first
    refreshed from the model's weights (the copy-back after the step would otherwise write stale
    host copies into a freshly loaded model), then the step sees zero gradients at learning
    rate 0: the state exists afterwards and no weight has changed."""
    self.update_fp32_param_by_new_param()
    missing = object()
    rates, grads = [], []
    for group in self.param_groups:
        rates.append(group["lr"])
        group["lr"] = 0.0
        for param in group["params"]:
            grads.append((param, getattr(param, "decoupled_grad", missing)))
            param.decoupled_grad = torch.zeros_like(param)
    try:
        self.step()
    finally:
        for group, rate in zip(self.param_groups, rates):
            group["lr"] = rate
        self.zero_grad()
        for param, previous in grads:
            if previous is missing:
                del param.decoupled_grad
            else:
                param.decoupled_grad = previous


def set_own_grads(wrapped, instance, args, kwargs):
    """Wraps ``HybridDeviceOptimizer._set_sub_optimizer_grads``."""
    result = wrapped(*args, **kwargs)
    if instance.gpu_optimizer is not None:
        masters = instance.fp32_param_to_orig_param
        for group in instance.gpu_optimizer.param_groups:
            for param in group["params"]:
                grad = getattr(param, "decoupled_grad", None)
                if grad is not None and param not in masters:
                    param.grad = grad
    return result


def refresh_host_copies(wrapped, instance, args, kwargs):
    """Wraps ``HybridDeviceOptimizer.update_fp32_param_by_new_param``."""
    result = wrapped(*args, **kwargs)
    with torch.no_grad():
        for owner, host in instance.gpu_params_map_cpu_copy.items():
            if owner not in instance.param_to_fp32_param:
                host.copy_(owner)
    return result


# ------------------------------------------------------------------------- DistributedOptimizer


def leaf_shards(wrapped, instance, args, kwargs):
    """Wraps ``DistributedOptimizer._build_model_and_main_param_groups`` (a classmethod)."""
    groups = wrapped(*args, **kwargs)
    config = kwargs.get("config", args[3] if len(args) > 3 else None)
    if not getattr(config, "optimizer_cpu_offload", False):
        return groups
    opt_group_ranges = kwargs.get("opt_group_ranges", args[2] if len(args) > 2 else None)
    shard_fp32_groups = groups[3]
    for shards, group_range in zip(shard_fp32_groups, opt_group_ranges):
        swapped = {}
        for i, shard in enumerate(shards):
            if shard.is_leaf:
                continue
            leaf = shard.detach()
            for name in _MODEL_PARALLEL_ATTRIBUTES:
                if hasattr(shard, name):
                    setattr(leaf, name, getattr(shard, name))
            shards[i] = swapped[id(shard)] = leaf
        params = group_range["orig_group"]["params"]
        params[:] = [swapped.get(id(p), p) for p in params]
    return groups


def settle_loaded_state(wrapped, instance, args, kwargs):
    """Wraps ``DistributedOptimizer._set_main_param_and_optimizer_states``."""
    result = wrapped(*args, **kwargs)
    hybrid = instance.optimizer
    if _is_hybrid(hybrid):
        model_param = call_arguments(wrapped, args, kwargs)["model_param"]
        group_index, group_order = instance.model_param_group_index_map[model_param]
        owner = hybrid.param_groups[group_index]["params"][group_order]
        settle(hybrid, owner)
        stepped = hybrid.param_to_inner_param.get(owner)
        optimizer = _sub_optimizer_of(hybrid, stepped)
        if optimizer is not None and stepped in optimizer.state:
            _place(hybrid, optimizer, stepped)
    return result


def place_state_after_load(wrapped, instance, args, kwargs):
    """Wraps ``DistributedOptimizer.load_state_dict``: the step counters it (and the
    ``upstream_fixes`` feature) set are host tensors; fused device optimizers want them on the
    device."""
    result = wrapped(*args, **kwargs)
    if _is_hybrid(getattr(instance, "optimizer", None)):
        place_state(instance.optimizer)
    return result


#: HybridDeviceOptimizer defaults that torch copies into every param group: classes (and
#: partials of them), which ``torch.load(weights_only=True)`` refuses in a checkpoint
_CLASS_KEYS = ("cpu_optimizer_cls", "gpu_optimizer_cls")


def state_dict_without_classes(wrapped, instance, args, kwargs):
    """Wraps ``DistributedOptimizer.state_dict``: the optimizer classes are rebuilt from the
    config, not read back, so they stay out of the checkpoint (``--ckpt-format torch`` loads
    it with ``weights_only=True``)."""
    result = wrapped(*args, **kwargs)
    if _is_hybrid(getattr(instance, "optimizer", None)):
        for group in result.get("optimizer", {}).get("param_groups", []):
            for key in _CLASS_KEYS:
                group.pop(key, None)
    return result

