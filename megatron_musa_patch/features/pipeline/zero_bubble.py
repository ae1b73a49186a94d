"""``--enable-zero-bubble`` (and MT-Megatron's ``ENABLE_ZERO_BUBBLE=1``): the ZB-H1 pipeline
schedule on megatron-core's own 1F1B (``lib/pipeline/zero_bubble.py``).

The records wrap what megatron-core's non-interleaved schedule calls: the schedule itself (one
ZB-H1 decision object per training call, from the model's TransformerConfig), ``backward_step``
(the ``W`` of a backward pass held back), the point-to-point calls that send an input gradient
(then the held ``W`` runs), ``finish_embedding_wgrad_compute`` (anything still held before the
gradients are reduced) and the linear layers' backward (``B`` without ``W``).
"""

from __future__ import annotations

import functools
import sys

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.lib.pipeline import weight_gradients
from megatron_musa_patch.lib.pipeline.run import RUN_KEY, PipelineRun
from megatron_musa_patch.lib.pipeline.zero_bubble import ZeroBubbleH1

FEATURE = feature(__name__, "--enable-zero-bubble (ENABLE_ZERO_BUBBLE=1): the ZB-H1 schedule")

SCHEDULES = "megatron.core.pipeline_parallel.schedules:"
P2P = "megatron.core.pipeline_parallel.p2p_communication:P2PCommunicator."
LINEAR = "megatron.core.tensor_parallel.layers:LinearWithGradAccumulationAndAsyncCommunication."
MT_SWITCH = "ENABLE_ZERO_BUBBLE"


@hookimpl
def mmp_register_patches(session, registry):
    run = session.state_for(RUN_KEY, PipelineRun)

    def add(part, target, impl, why):
        registry.add(FEATURE.patch(part, target, "wrap", functools.partial(impl, run), why=why))

    add("schedule", SCHEDULES + "forward_backward_pipelining_without_interleaving", _schedule,
        "--enable-zero-bubble: ZB-H1's decisions for the call; every held W before it returns")
    add("backward_step", SCHEDULES + "backward_step", _backward_step,
        "--enable-zero-bubble: a backward pass's weight gradients held back for a later slot")
    for call in ("send_backward", "send_backward_recv_forward"):
        add(f"after_{call}", P2P + call, _after_gradient_sent,
            "--enable-zero-bubble: the held weight gradient runs once the input gradient is "
            "sent")
    add("before_reduce", SCHEDULES + "finish_embedding_wgrad_compute", _before_reduce,
        "--enable-zero-bubble: every held weight gradient before the gradients are reduced")
    add("linear_backward", LINEAR + "backward", _linear_backward,
        "--enable-zero-bubble: the input gradient alone, the weight gradient queued")


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group(title="zero-bubble pipeline (megatron_musa_patch)")
    group.add_argument("--enable-zero-bubble", action="store_true",
                       help="ZB-H1 schedule: each backward pass's weight-gradient GEMMs run "
                            "after its input gradient is sent, so gradients travel up the "
                            "pipeline sooner; 1F1B's peak memory. Needs pipeline parallelism "
                            "without virtual stages and --gradient-accumulation-fusion. "
                            "MT-Megatron's ENABLE_ZERO_BUBBLE=1 sets it.")
    return parser


@hookimpl
def mmp_validate_args(args, session):
    switch = session.settings.mt_switch_on(MT_SWITCH)
    if switch and not getattr(args, "enable_zero_bubble", False):
        if args.pipeline_model_parallel_size < 2:  # MT's scripts set it whatever the layout
            said = session.state_for(f"{FEATURE.name}.said", set)
            if MT_SWITCH not in said:  # once, however often the arguments are validated
                said.add(MT_SWITCH)
                print(f"megatron_musa_patch: {MT_SWITCH}=1: no pipeline parallelism here, so "
                      f"no bubble to fill; the schedule is unchanged.", file=sys.stderr,
                      flush=True)
            return
        args.enable_zero_bubble = True
    if not getattr(args, "enable_zero_bubble", False):
        return
    problem = refusal(args, f"{MT_SWITCH}=1" if switch else "--enable-zero-bubble")
    if problem:
        raise ArgumentError(problem)


def refusal(args, given: str = "--enable-zero-bubble"):
    """Why ZB-H1 cannot run with these arguments, or None."""
    if args.pipeline_model_parallel_size < 2:
        return (f"{given}: fills the bubbles of a pipeline, and there is none at "
                f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size}: add "
                f"--pipeline-model-parallel-size 2 or more, or drop the switch.")
    if getattr(args, "virtual_pipeline_model_parallel_size", None) or getattr(
            args, "num_layers_per_virtual_pipeline_stage", None):
        return (f"{given}: ZB-H1 is the non-interleaved 1F1B schedule's variant; with virtual "
                f"pipeline stages the interleaved schedule runs: drop "
                f"--num-layers-per-virtual-pipeline-stage / "
                f"--virtual-pipeline-model-parallel-size, or the switch.")
    if not getattr(args, "gradient_accumulation_fusion", False):
        return weight_gradients.without_fusion(given)
    if getattr(args, "use_megatron_fsdp", False) or getattr(args, "use_custom_fsdp", False):
        return (f"{given}: Megatron-FSDP builds each main_grad in place during the backward "
                f"pass, so its weight gradients cannot be held back: drop one of the two.")
    return None


@hookimpl
def mmp_transformer_config(args, config):
    config.enable_zero_bubble = bool(getattr(args, "enable_zero_bubble", False))


# ----------------------------------------------------------------------------- the records


def _schedule(run: PipelineRun, wrapped, instance, args, kwargs):
    from megatron.core.utils import get_model_config

    model = kwargs["model"]  # the schedules take keyword arguments only
    chunk = model[0] if isinstance(model, list) else model
    config = get_model_config(chunk)
    if not getattr(config, "enable_zero_bubble", False) or kwargs.get("forward_only"):
        return wrapped(*args, **kwargs)
    ddp_config = getattr(chunk, "ddp_config", None)
    run.zero_bubble = ZeroBubbleH1(
        run.store, microbatches=kwargs["num_microbatches"],
        reduce_in_last_backward=bool(getattr(ddp_config, "overlap_grad_reduce", False)))
    try:
        result = wrapped(*args, **kwargs)
        run.zero_bubble.finish()  # when no finalize_model_grads_func asked for it earlier
        return result
    finally:
        run.store.clear()
        run.zero_bubble = None


def _backward_step(run: PipelineRun, wrapped, instance, args, kwargs):
    if run.zero_bubble is None:
        return wrapped(*args, **kwargs)
    return run.zero_bubble.backward(lambda: wrapped(*args, **kwargs))


def _after_gradient_sent(run: PipelineRun, wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    if run.zero_bubble is not None:
        run.zero_bubble.after_gradient_sent()
    return result


def _before_reduce(run: PipelineRun, wrapped, instance, args, kwargs):
    if run.zero_bubble is not None:
        run.zero_bubble.finish()
    return wrapped(*args, **kwargs)


def _linear_backward(run: PipelineRun, wrapped, instance, args, kwargs):
    ctx, grad_output = args
    return weight_gradients.linear_backward(run.store, wrapped, ctx, grad_output)
