"""MoE with experts that are not split like the dense layers but without expert parallelism
(``--expert-model-parallel-size 1`` and ``--expert-tensor-parallel-size`` other than
``--tensor-model-parallel-size``, e.g. TP2 with ETP1): each tensor-parallel rank runs every
expert on its own tokens, but upstream marks expert parameters for the expert-data-parallel
reduction only when EP > 1, so their gradients are reduced over the dense data-parallel group,
which leaves out the other tensor-parallel ranks: the experts silently diverge across them.
Those parameters are marked as expert-parallel (``allreduce = False``), so the gradient buffers,
the optimizer and the norm treat them as upstream does with EP > 1."""

from __future__ import annotations

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.upstream.facts import fixed_upstream
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "EP1 with ETP != TP: expert gradients reduced over the expert-data-parallel group")


@hookimpl
def mmp_register_patches(registry):
    until, ends = fixed_upstream("experts_split_unlike_dense_reduced_over_expert_dp",
                                 since="0.16.1")
    registry.add(FEATURE.patch(
        "", "megatron.core.transformer.moe.moe_layer:MoELayer.__init__", "wrap",
        _mark_experts, megatron=until, ends=ends,
        why="EP1 with ETP != TP: expert gradients are reduced over the expert-data-parallel "
            "group (upstream leaves out the tensor-parallel ranks)"))


def _mark_experts(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    config = instance.config
    tp = config.tensor_model_parallel_size
    etp = config.expert_tensor_parallel_size or tp
    if config.expert_model_parallel_size == 1 and etp != tp and instance.experts is not None:
        for param in instance.experts.parameters():
            param.allreduce = False
