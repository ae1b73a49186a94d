"""CPU-offload optimizer and precision-aware optimizer on every device, without TransformerEngine.

Upstream's own flags, no new ones: ``--optimizer-cpu-offload``, ``--optimizer-offload-fraction F``,
``--overlap-cpu-optimizer-d2h-h2d``, ``--use-precision-aware-optimizer``, ``--main-grads-dtype``,
``--main-params-dtype``, ``--exp-avg-dtype``, ``--exp-avg-sq-dtype`` (Megatron-LM copies them onto
the OptimizerConfig; megatron-core users set the same attributes there).

* Offload: megatron-core's ``HybridDeviceOptimizer`` with its device decisions made by the
  device row, so the fraction F of the parameters is stepped on the host on MUSA, CPU and CUDA
  (``megatron_musa_patch/lib/offload/hybrid.py``); its streams and events are the device's.
* Precision-aware without offload and without TE: ``PrecisionAwareAdamW`` takes the place of
  TE's ``FusedAdam`` (``offload/precision_adam.py``); with offload it is the sub-optimizer class
  when the moments are to be stored in 16 bits.
* Checks: the flag combinations that cannot work, and dtypes that are not stored safely without
  TE's scaled state (``offload/dtypes.py``), are refused naming the flag and the fix -- for
  Megatron-LM's flags before its own validation, and on the OptimizerConfig for megatron-core.
"""

from __future__ import annotations

import functools
import sys

import torch

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.upstream.conditions import te_installed
from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.flag_needs import FlagNeed
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.lib.offload import dtypes as dtype_rules
from megatron_musa_patch.lib.offload import hybrid
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.device.rows import OFF_CUDA


HYBRID = "megatron.core.optimizer.cpu_offloading.hybrid_optimizer:HybridDeviceOptimizer."
DISTOPT = "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer."
OPTIMIZER = "megatron.core.optimizer"
FLAG_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
               "fp8": torch.uint8}


def te_missing() -> bool:
    return not te_installed()


# after the distributed-optimizer fixes: its wrappers of the optimizer's state methods sit inside
# theirs
FEATURE = feature(
    __name__,
    "optimizer CPU offload (HybridDeviceOptimizer) on every device; the precision-aware "
    "optimizer without TransformerEngine",
    flag_needs=(
        FlagNeed("--optimizer-cpu-offload", devices=OFF_CUDA,
                 because="upstream's HybridDeviceOptimizer tells device from host tensors by "
                         ".is_cuda, so off CUDA it offloads nothing and then fails"),
        FlagNeed("--use-precision-aware-optimizer",
                 when=lambda args: getattr(args, "use_precision_aware_optimizer", False)
                 and te_missing(),
                 because="upstream's precision-aware Adam is TransformerEngine's FusedAdam"),
    ),
    after=("upstream_fixes.distopt_load_no_grad",
           "upstream_fixes.distopt_step_counters",
           "upstream_fixes.optimizer_lr_unset"),
    aliases=("cpu_offload",))


@hookimpl
def mmp_register_patches(registry, device):
    def add(pid, target, kind, impl, why):
        registry.add(FEATURE.patch(pid, target, kind, impl, why=why))

    add("split", HYBRID + "_get_sub_optimizer_param_groups", "replace",
        hybrid.split_param_groups_for(device),
        f"the {device.name} row decides what is on the accelerator (not .is_cuda); offloaded "
        f"parameters get host copies of their own, pinned where the device has pinned memory")
    add("place_state", HYBRID + "_move_new_state_to_right_device", "replace", hybrid.place_state,
        "state follows its parameters (upstream tells host from device optimizers by class)")
    add("masters", HYBRID + "_update_fp32_params_by_new_state", "replace",
        hybrid.keep_masters_in_step,
        "loaded master weights reach the tensors the sub-optimizers step on (fp32 params too)")
    add("dummy_step", HYBRID + "dummy_step", "replace", hybrid.initialize_state,
        "the state a checkpoint load needs, without stepping the weights on random gradients")
    add("own_grads", HYBRID + "_set_sub_optimizer_grads", "wrap", hybrid.set_own_grads,
        "device-side fp32 shards stepped as themselves read the decoupled gradient")
    add("refresh", HYBRID + "update_fp32_param_by_new_param", "wrap",
        hybrid.refresh_host_copies, "reload_model_params refreshes fp32 host copies too")
    add("leaf_shards", DISTOPT + "_build_model_and_main_param_groups", "wrap",
        hybrid.leaf_shards, "fp32 shards as leaf views the hybrid optimizer can take")
    add("settle_loaded", DISTOPT + "_set_main_param_and_optimizer_states", "wrap",
        hybrid.settle_loaded_state, "a loaded parameter state lands where the step reads it")
    add("place_after_load", DISTOPT + "load_state_dict", "wrap", hybrid.place_state_after_load,
        "step counters and moments on their parameters' device after a load")
    add("state_dict", DISTOPT + "state_dict", "wrap", hybrid.state_dict_without_classes,
        "no optimizer classes in checkpoints (torch.load(weights_only=True) refuses them)")
    add("config", "megatron.core.optimizer.optimizer_config:OptimizerConfig.__post_init__",
        "wrap", _config_post_init,
        "precision-aware optimizer without TE; offload and dtype choices checked")
    add("builder", f"{OPTIMIZER}:_get_megatron_optimizer_based_on_param_groups", "wrap",
        functools.partial(_build_optimizer, device),
        "PrecisionAwareAdamW where upstream needs TE's FusedAdam")


# ----------------------------------------------------------------------------- flags


@hookimpl
def mmp_validate_args(args):
    offload = bool(getattr(args, "optimizer_cpu_offload", False))
    aware = bool(getattr(args, "use_precision_aware_optimizer", False))
    if not (offload or aware or _offload_only_flags(args) or _dtype_flags(args)):
        return
    problems = _flag_problems(args, offload, aware)
    if problems:
        raise ArgumentError(problems[0])


def _offload_only_flags(args):
    given = []
    if getattr(args, "overlap_cpu_optimizer_d2h_h2d", False):
        given.append("--overlap-cpu-optimizer-d2h-h2d")
    if getattr(args, "use_torch_optimizer_for_cpu_offload", False):
        given.append("--use-torch-optimizer-for-cpu-offload")
    if getattr(args, "optimizer_offload_fraction", 1.0) != 1.0:
        given.append("--optimizer-offload-fraction")
    return given


def _dtype_flags(args):
    return {attr: FLAG_DTYPES.get(getattr(args, attr), getattr(args, attr))
            for attr in dtype_rules.FLAGS if hasattr(args, attr)}


def _flag_problems(args, offload, aware):
    found = []
    dtypes = _dtype_flags(args)
    if offload:
        fraction = args.optimizer_offload_fraction
        if not 0.0 < fraction <= 1.0:
            found.append(f"--optimizer-offload-fraction {fraction} is outside (0, 1]: it is the "
                         f"share of the optimizer state moved to the host (1.0 = all). Without "
                         f"offload, remove --optimizer-cpu-offload instead.")
        if not args.use_distributed_optimizer:
            found.append("--optimizer-cpu-offload needs --use-distributed-optimizer (the hybrid "
                         "optimizer steps the distributed optimizer's shards): add it.")
        if not aware:
            found.append("--optimizer-cpu-offload needs --use-precision-aware-optimizer (the "
                         "hybrid optimizer takes the precision-aware code path): add it.")
        if args.optimizer != "adam":
            found.append(f"--optimizer-cpu-offload supports --optimizer adam, not "
                         f"{args.optimizer}.")
    else:
        for flag in _offload_only_flags(args):
            found.append(f"{flag} has no effect without --optimizer-cpu-offload: add "
                         f"--optimizer-cpu-offload or remove {flag}.")
    if aware:
        if not args.use_distributed_optimizer:
            found.append("--use-precision-aware-optimizer needs --use-distributed-optimizer: "
                         "add it.")
        if args.optimizer != "adam":
            found.append(f"--use-precision-aware-optimizer supports --optimizer adam, not "
                         f"{args.optimizer}.")
        if offload or te_missing():
            found += dtype_rules.problems(**dtypes, model_dtype=_model_dtype(args),
                                          offload=offload)
    else:
        for attr, dtype in dtypes.items():
            if dtype != torch.float32:
                found.append(f"{dtype_rules.FLAGS[attr]} {dtype_rules.name(dtype)} needs "
                             f"--use-precision-aware-optimizer (without it the optimizer state "
                             f"is fp32): add it or remove {dtype_rules.FLAGS[attr]}.")
    return found


def _model_dtype(args_or_config):
    if getattr(args_or_config, "bf16", False):
        return torch.bfloat16
    if getattr(args_or_config, "fp16", False):
        return torch.float16
    return torch.float32


# ----------------------------------------------------------------------------- OptimizerConfig


def _config_post_init(wrapped, instance, args, kwargs):
    """Upstream's check demands TE's FusedAdam for the precision-aware optimizer unless the
    optimizer is offloaded; without TE ``PrecisionAwareAdamW`` takes its place, so that check is
    skipped (by presenting the offload flag for its duration) and ours run instead."""
    config = instance
    ours = (config.use_precision_aware_optimizer and not config.optimizer_cpu_offload
            and te_missing())
    if ours:
        config.optimizer_cpu_offload = True
    try:
        result = wrapped(*args, **kwargs)
    finally:
        if ours:
            config.optimizer_cpu_offload = False
    _check_config(config)
    return result


def _check_config(config):
    found = []
    if config.optimizer_cpu_offload:
        fraction = config.optimizer_offload_fraction
        if not 0.0 < fraction <= 1.0:
            found.append(f"OptimizerConfig.optimizer_offload_fraction={fraction} "
                         f"(--optimizer-offload-fraction) is outside (0, 1] with "
                         f"optimizer_cpu_offload=True: set the share of the optimizer state to "
                         f"move to the host (1.0 = all).")
        for attr in ("use_distributed_optimizer", "use_precision_aware_optimizer"):
            if not getattr(config, attr):
                found.append(f"OptimizerConfig.optimizer_cpu_offload=True needs {attr}=True "
                             f"(--{attr.replace('_', '-')}).")
        if not config.decoupled_weight_decay:
            found.append("OptimizerConfig.optimizer_cpu_offload=True needs "
                         "decoupled_weight_decay=True (AdamW).")
    if config.use_precision_aware_optimizer and (config.optimizer_cpu_offload or te_missing()):
        found += dtype_rules.problems(
            main_params_dtype=config.main_params_dtype, main_grads_dtype=config.main_grads_dtype,
            exp_avg_dtype=config.exp_avg_dtype, exp_avg_sq_dtype=config.exp_avg_sq_dtype,
            model_dtype=_model_dtype(config), offload=config.optimizer_cpu_offload)
    if found:
        raise ArgumentError(found[0])


# ----------------------------------------------------------------------------- optimizer classes


def _build_optimizer(device, wrapped, instance, args, kwargs):
    config = call_arguments(wrapped, args, kwargs).get("config")
    module = sys.modules[OPTIMIZER]
    swaps = optimizer_classes(config, module)
    saved = {name: getattr(module, name) for name in swaps}
    try:
        for name, value in swaps.items():
            setattr(module, name, value)
        optimizer = wrapped(*args, **kwargs)
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
    if getattr(config, "optimizer_cpu_offload", False):
        _report(optimizer, config, device)
    return optimizer


def _report(optimizer, config, row):
    """One line on global rank 0: what this rank steps on the host, counted from the optimizer."""
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return
    from megatron_musa_patch.lib.offload.counting import placement

    placed = placement(optimizer)
    total = placed["host_params"] + placed["device_params"]
    print(f"megatron_musa_patch: optimizer offload on rank 0: {placed['host_params']} of {total} "
          f"parameter shards ({placed['host_numel']} of "
          f"{placed['host_numel'] + placed['device_numel']} elements, "
          f"{100 * placed['host_share']:.1f}%) stepped on the host by "
          f"{placed['host_optimizers']} host optimizer(s) "
          f"(--optimizer-offload-fraction {config.optimizer_offload_fraction}); host copies "
          f"{'pinned' if placed['pinned'] else 'not pinned'} ({row.name} device); copy "
          f"overlap {'on' if config.overlap_cpu_optimizer_d2h_h2d else 'off'}", flush=True)


def optimizer_classes(config, module):
    """Module globals of ``megatron.core.optimizer`` to present while it builds the optimizer."""
    from megatron_musa_patch.lib.offload.precision_adam import PrecisionAwareAdamW

    if config is None or not config.use_precision_aware_optimizer or config.optimizer != "adam":
        return {}
    if config.optimizer_cpu_offload:
        moments = {"exp_avg_dtype": config.exp_avg_dtype,
                   "exp_avg_sq_dtype": config.exp_avg_sq_dtype}
        if all(d == torch.float32 for d in moments.values()):
            return {}  # upstream's torch AdamW (fused) on the host, unchanged
        sub = PrecisionAwareAdamW.configured(**moments)
        swaps = {"CPUAdam": sub}
        if module.USING_PYTORCH_OPTIMIZER:
            swaps["Adam"] = sub
        return swaps
    if te_missing():
        # the TE branch it now takes also asks is_te_min_version (TypeError without TE)
        return {"Adam": PrecisionAwareAdamW, "USING_PYTORCH_OPTIMIZER": False,
                "is_te_min_version": _no_te_version}
    return {}


def _no_te_version(*args, **kwargs):
    return False
