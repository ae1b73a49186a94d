"""Where the upstream objects the layer patches live, per release range.

Each logical name maps to its locations: ``(range, target, flavour, rebind)``. ``flavour`` names
what kind of object is there when it changed (the feature picks the matching implementation);
``rebind`` lists modules that hold ``from <module> import <name>`` copies. A name that exists
only in some releases has entries for those alone: the others skip the patch, saying why.

A location's range is a fact about upstream and may be open (">=0.18": there from 0.18 on); the
records made from it (:func:`patches`) are cut to the range their feature was verified on.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

from .ranges import Range


@dataclasses.dataclass(frozen=True)
class Location:
    range: str
    target: str
    flavour: str = ""
    rebind: Tuple[str, ...] = ()


TARGETS: Dict[str, Tuple[Location, ...]] = {
    # 0.18 moved it into argument_utils; arguments re-exports it, and 0.19's pretrain_gpt.py
    # builds the model's config through gpt_config_from_args, which calls it there
    "core_transformer_config_from_args": (
        Location(">=0.16.1,<0.18", "megatron.training.arguments:core_transformer_config_from_args"),
        Location(">=0.18", "megatron.training.argument_utils:core_transformer_config_from_args",
                 rebind=("megatron.training.arguments", "gpt_builders", "__main__",
                         "megatron.post_training.model_builder")),
    ),
    # 0.18 logs MoE losses through a tracker that reports the names it is given, then clears
    "moe_metrics_report": (
        Location(">=0.16.1,<0.18", "megatron.core.transformer.moe.moe_utils:track_moe_metrics"),
        Location(">=0.18", "megatron.core.transformer.moe.moe_logging:MoEMetricsTracker.report"),
    ),
    # the tracker file is opened through msc_utils.open_file, from 0.19 through maybe_msc.open
    "checkpoint_tracker_open": (
        Location(">=0.16.1,<0.19", "megatron.training.checkpointing:open_file", "open_file"),
        Location(">=0.19", "megatron.core.msc_utils:MaybeMultiStorageClient.__getattr__",
                 "maybe_msc"),
    ),
    # a module whose body calls torch.compile (InferenceTopKRouter's routing, from 0.17), which
    # imports torch._dynamo and inductor with it: reached from `import megatron.core`
    "compile_at_import": (
        Location(">=0.17", "megatron.core.transformer.moe.router:*"),
    ),
    # the triton kernels of the MoE paged stash, imported by megatron.core itself from 0.18
    "paged_stash_kernels": (
        Location(">=0.18,<0.19", "megatron.core.transformer.moe.paged_stash:*"),
        Location(">=0.19", "megatron.core.transformer.moe.ops.paged_stash:*"),
    ),
    # what tools/preprocess_data.py builds its tokenizer with (mmp data prepare does the same)
    "build_tokenizer": (
        Location(">=0.16.1,<0.17",
                 "megatron.core.tokenizers.text.utils.build_tokenizer:build_tokenizer"),
        Location(">=0.17", "megatron.core.tokenizers.utils.build_tokenizer:build_tokenizer"),
    ),
    # removed in 0.17: the local spec's --moe-grouped-gemm experts, the grouped_gemm glue,
    # Megatron-LM's legacy fused kernels, and the unguarded triton import of batch-invariant mode
    "grouped_mlp_forward": (
        Location(">=0.16.1,<0.17", "megatron.core.transformer.moe.experts:GroupedMLP.forward"),),
    # the grouped_gemm glue as GroupedMLP's module calls it (experts.gg.ops.gmm)
    "grouped_mlp_gemm_module": (
        Location(">=0.16.1,<0.17", "megatron.core.transformer.moe.experts:gg"),),
    "grouped_gemm_util": (
        Location(">=0.16.1,<0.17", "megatron.core.transformer.moe.grouped_gemm_util"),),
    "legacy_fused_kernels_load": (
        Location(">=0.16.1,<0.17", "megatron.legacy.fused_kernels:load"),),
    "batch_invariant_kernels": (
        Location(">=0.16.1,<0.17",
                 "megatron.core.transformer.custom_layers.batch_invariant_kernels:*"),),
}

#: why a name is missing outside its ranges, for ``mmp doctor``
GONE: Dict[str, str] = {
    "grouped_mlp_forward": "GroupedMLP was removed in 0.17 (the local spec's --moe-grouped-gemm "
                           "experts are SequentialMLP there)",
    "grouped_gemm_util": "grouped_gemm_util was removed in 0.17",
    "grouped_mlp_gemm_module": "GroupedMLP (and its grouped_gemm glue) was removed in 0.17",
    "legacy_fused_kernels_load": "megatron.legacy.fused_kernels was removed in 0.17",
    "batch_invariant_kernels": "upstream guards this triton import from 0.17",
    "paged_stash_kernels": "megatron.core imports the paged stash's triton kernels from 0.18",
    "compile_at_import": "up to 0.16 no module of megatron.core calls torch.compile as it is "
                         "imported",
}


def variants(name: str) -> List[Location]:
    """The locations of ``name``, one per release range."""
    return list(TARGETS[name])


def gone(name: str) -> str:
    return GONE.get(name, "")


def load(name: str):
    """The object ``name`` names in the installed megatron-core (imported now)."""
    import importlib

    from . import installed as installed_versions

    installed = installed_versions.megatron_core_version()
    for location in variants(name):
        if installed is None or installed in Range.parse(location.range):
            module, _, attribute = location.target.partition(":")
            return getattr(importlib.import_module(module), attribute)
    raise ImportError(f"{name} has no location for megatron-core {installed} "
                      f"(upstream/targets.py)")
