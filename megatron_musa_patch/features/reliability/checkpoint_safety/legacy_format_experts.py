"""The legacy format (``--ckpt-format torch``) with MoE experts split unlike the dense layers.

Megatron-LM writes that format only on expert-data-parallel rank 0. With experts split unlike
the dense layers (``--expert-tensor-parallel-size`` other than ``--tensor-model-parallel-size``)
that group spans tensor-parallel ranks, so their dense shards are never saved and the checkpoint
loads nowhere (found only at the next ``--load``). That combination is refused before training,
with the fix.
"""

from __future__ import annotations

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "--ckpt-format torch refused where it would leave tensor-parallel shards unsaved",
    aliases=("checkpoint_safety.legacy_format_experts",))


@hookimpl
def mmp_validate_args(args, session):
    if getattr(args, "ckpt_format", "torch_dist") != "torch" or not getattr(args, "num_experts", 0):
        return
    if session.upstream("legacy_checkpoint_saves_every_shard", "megatron.training"):
        return  # fixed upstream: every (tp, ep) shard has a writer
    if not (getattr(args, "save", None) or getattr(args, "load", None)):
        return
    tp = getattr(args, "tensor_model_parallel_size", 1) or 1
    etp = getattr(args, "expert_tensor_parallel_size", None) or tp
    if etp != tp:
        raise ArgumentError(
            f"--ckpt-format torch with --expert-tensor-parallel-size {etp} and "
            f"--tensor-model-parallel-size {tp}: Megatron-LM's legacy format is written only by "
            f"expert-data-parallel rank 0, which here leaves out tensor-parallel ranks, so their "
            f"shards would never be saved and the checkpoint could not be loaded. Use "
            f"--ckpt-format torch_dist (the default), or --expert-tensor-parallel-size {tp}.")
