"""``--num-layers-per-virtual-pipeline-stage L`` with ``--decoder-first-pipeline-num-layers`` /
``--decoder-last-pipeline-num-layers`` (an uneven pipeline), as the MT-Megatron tutorial's
training group passes them.

megatron-core 0.16's Megatron-LM asserts "please use --num-virtual-stages-per-pipeline-rank" for
that pair (a traceback at start-up). Where every pipeline stage's layers split into the same
number of virtual stages of L layers, that number is what the flag means: it is passed on as
``--num-virtual-stages-per-pipeline-rank``. Otherwise the run stops with one paragraph naming the
stages' sizes and the flag to give instead.
"""

from __future__ import annotations

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.flag_needs import FlagNeed
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature


def _uneven_with_layers_per_stage(args) -> bool:
    return (getattr(args, "num_layers_per_virtual_pipeline_stage", None) is not None
            and getattr(args, "num_virtual_stages_per_pipeline_rank", None) is None
            and getattr(args, "pipeline_model_parallel_layout", None) is None
            and (getattr(args, "decoder_first_pipeline_num_layers", None) is not None
                 or getattr(args, "decoder_last_pipeline_num_layers", None) is not None))


FEATURE = feature(
    __name__,
    "--num-layers-per-virtual-pipeline-stage with an uneven pipeline "
    "(--decoder-first/last-pipeline-num-layers): virtual stages per rank",
    flag_needs=(FlagNeed(
        "--num-layers-per-virtual-pipeline-stage", when=_uneven_with_layers_per_stage,
        because="with --decoder-first/last-pipeline-num-layers; Megatron-LM asserts for that pair",
        instead="give --num-virtual-stages-per-pipeline-rank instead"),))


def stage_layers(num_layers: int, stages: int, first, last):
    """Layers of each pipeline stage, as Megatron splits an uneven pipeline (None: not even)."""
    given = [n for n in (first, last) if n is not None]
    rest = stages - len(given)
    remaining = num_layers - sum(given)
    if rest < 0 or remaining < 0 or (rest and remaining % rest) or (not rest and remaining):
        return None
    middle = [remaining // rest] * rest if rest else []
    return ([first] if first is not None else []) + middle + ([last] if last is not None else [])


@hookimpl
def mmp_validate_args(args):
    if not _uneven_with_layers_per_stage(args):
        return
    per_virtual = args.num_layers_per_virtual_pipeline_stage
    layers = stage_layers(args.num_layers, args.pipeline_model_parallel_size,
                          args.decoder_first_pipeline_num_layers,
                          args.decoder_last_pipeline_num_layers)
    if layers is None:
        return  # Megatron-LM's own checks name the uneven split that does not add up
    chunks = {n // per_virtual for n in layers if n % per_virtual == 0}
    if len(chunks) != 1 or any(n % per_virtual for n in layers) or 0 in chunks:
        raise ArgumentError(
            f"--num-layers-per-virtual-pipeline-stage {per_virtual} with an uneven pipeline "
            f"(--decoder-first/last-pipeline-num-layers; stages of {layers} layers): every "
            f"pipeline rank needs the same number of virtual stages, and {per_virtual}-layer "
            f"virtual stages do not split these stages alike. Give "
            f"--num-virtual-stages-per-pipeline-rank N instead (each stage's layers divisible "
            f"by N).")
    virtual = chunks.pop()
    if virtual > 1 and args.pipeline_model_parallel_size <= 2 and \
            not getattr(args, "overlap_p2p_comm", True):
        raise ArgumentError(
            f"--num-layers-per-virtual-pipeline-stage {per_virtual} makes {virtual} virtual stages "
            f"per rank (an interleaved schedule), which with --no-overlap-p2p-communication needs "
            f"--pipeline-model-parallel-size 3 or more (Megatron-LM's rule: with 2 stages a "
            f"forward and a backward send between the same two ranks would share one batch). Drop "
            f"--no-overlap-p2p-communication, use 3 or more pipeline stages, or make each stage "
            f"one virtual stage.")
    args.num_virtual_stages_per_pipeline_rank = virtual
    args.num_layers_per_virtual_pipeline_stage = None
