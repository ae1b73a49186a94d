"""``--pipeline-v-schedule zb-v|dualpipev``: the V-shaped schedules on megatron-core's virtual
pipeline (two model chunks per rank), ``lib/pipeline/v_shape.py`` and ``v_executor.py``.

The records place the chunks in the V and run the schedule:

* ``get_transformer_layer_offset``: chunk 1 of rank ``r`` holds stage ``2p-1-r`` (upstream's
  interleaved placement gives it stage ``p+r``), so its layers are those of rank ``p-1-r``'s
  second chunk; the global layer numbers, and so the checkpoints, are the layers' own;
* ``get_model`` (and, from 0.18, the model builders' ``build_virtual_pipeline_stages``): the
  loss and output layer go to rank 0's chunk 1 (``post_process``);
* ``is_pipeline_last_stage`` for a virtual stage: rank 0's chunk 1, so the data loader reads the
  labels there, and ``get_batch_on_this_tp_rank`` gives rank 0 every field (tokens for its first
  chunk, labels for its second); "the last pipeline rank" is unchanged, and the schedule hands
  it the losses, so Megatron's training loop reports them where it always does;
* ``forward_backward_pipelining_with_interleaving``: the V schedule's order (torch's planners),
  with megatron-core's own ``forward_step`` and ``backward_step``; the linear layers' backward
  of an ``I`` computes the input gradient alone and its weight gradients wait in
  ``lib/pipeline/weight_gradients.py`` for their ``W``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.core.feature import feature
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.records import VERIFIED
from megatron_musa_patch.lib.pipeline import v_shape, weight_gradients
from megatron_musa_patch.lib.pipeline.run import RUN_KEY, PipelineRun
from megatron_musa_patch.lib.pipeline.v_executor import VPipeline

# after the timeline: its wrapper of the interleaved schedule sits outside this one's
FEATURE = feature(__name__, "--pipeline-v-schedule zb-v|dualpipev: the V-shaped schedules",
                  after=("pipeline.timeline",))

SCHEDULES = "megatron.core.pipeline_parallel.schedules:"
OFFSET = "megatron.core.transformer.transformer_layer:get_transformer_layer_offset"
#: the modules that import the layer offset by name
OFFSET_USERS = ("megatron.core.transformer.transformer_block",
                "megatron.core.transformer.multi_token_prediction",
                "megatron.core.models.gpt.gpt_layer_specs",
                "megatron.core.models.gpt.heterogeneous.heterogeneous_layer_specs",
                "megatron.core.models.gpt.experimental_attention_variant_module_specs")
LINEAR = "megatron.core.tensor_parallel.layers:LinearWithGradAccumulationAndAsyncCommunication."
CHOICES = tuple(v_shape.SCHEDULES)


@hookimpl
def mmp_register_patches(session, registry):
    run = session.state_for(RUN_KEY, PipelineRun)

    def add(part, target, impl, why, **fields):
        registry.add(FEATURE.patch(part, target, "wrap", functools.partial(impl, run), why=why,
                                   **fields))

    # the orders come from torch.distributed.pipelining's planners (lib/pipeline/v_shape.py)
    add("schedule", SCHEDULES + "forward_backward_pipelining_with_interleaving", _schedule,
        "--pipeline-v-schedule: the V schedule runs the step instead of the interleaved one",
        torch=VERIFIED)
    # the same wrap as ZB-H1's (a second one passes through): each feature stands alone
    add("linear_backward", LINEAR + "backward", _linear_backward,
        "--pipeline-v-schedule: a backward pass left for W computes the input gradient alone")
    add("layer_offset", OFFSET, _layer_offset,
        "--pipeline-v-schedule: chunk 1 of rank r holds stage 2p-1-r", rebind=OFFSET_USERS)
    add("last_stage", "megatron.core.parallel_state:is_pipeline_last_stage", _last_stage,
        "--pipeline-v-schedule: the last virtual stage is rank 0's chunk 1")
    add("model", "megatron.training.training:get_model", _get_model,
        "--pipeline-v-schedule: rank 0's chunk 1 builds the output layer and the loss")
    for where, releases in (("megatron.training.utils", "<0.18"),
                            ("megatron.core.utils", ">=0.18")):
        add("batch", f"{where}:get_batch_on_this_tp_rank", _batch,
            "--pipeline-v-schedule: rank 0 reads the labels too (its chunk 1 has the loss)",
            megatron=releases)
    add("model_stages", "megatron.training.models.dist_utils:build_virtual_pipeline_stages",
        _build_stages, "--pipeline-v-schedule: rank 0's chunk 1 builds the output layer and "
        "the loss (the model builders' path)", megatron=">=0.18")


@hookimpl
def mmp_add_arguments(parser):
    group = parser.add_argument_group(title="V-shaped pipeline schedules (megatron_musa_patch)")
    group.add_argument("--pipeline-v-schedule", choices=CHOICES, default=None,
                       help="Place the two model chunks of each rank in a V (rank r holds "
                            "stages r and 2p-1-r) and run zb-v (zero-bubble V, Qi et al.) or "
                            "dualpipev (DeepSeek's DualPipe on the V): the weight-gradient GEMMs "
                            "fill the pipeline's bubbles. Needs "
                            "--num-virtual-stages-per-pipeline-rank 2, "
                            "--untie-embeddings-and-output-weights and "
                            "--gradient-accumulation-fusion.")
    return parser


@hookimpl
def mmp_validate_args(args, session):
    schedule = getattr(args, "pipeline_v_schedule", None)
    if not schedule:
        return
    problem = refusal(args)
    if problem:
        raise ArgumentError(problem)
    session.state_for(RUN_KEY, PipelineRun).v_schedule = schedule


def refusal(args):
    """Why the V schedules cannot run with these arguments, or None."""
    given = f"--pipeline-v-schedule {args.pipeline_v_schedule}"
    if args.pipeline_model_parallel_size < 2:
        return (f"{given}: a V needs a pipeline, and --pipeline-model-parallel-size is "
                f"{args.pipeline_model_parallel_size}: set it to 2 or more.")
    if chunks_per_rank(args) != 2:
        return (f"{given}: the V is two model chunks per rank: add "
                f"--num-virtual-stages-per-pipeline-rank 2 (or "
                f"--num-layers-per-virtual-pipeline-stage with half of each rank's layers).")
    if not getattr(args, "untie_embeddings_and_output_weights", False):
        return (f"{given}: the V puts the embedding and the output layer in two chunks of rank "
                f"0, and tying them across chunks is not supported: add "
                f"--untie-embeddings-and-output-weights.")
    if getattr(args, "enable_zero_bubble", False):
        return (f"{given}: --enable-zero-bubble is ZB-H1, the non-interleaved schedule's "
                f"variant; the V schedules are zero-bubble already: drop one of the two.")
    if not getattr(args, "gradient_accumulation_fusion", False):
        return weight_gradients.without_fusion(given)
    unsupported = [
        ("--mtp-num-layers", getattr(args, "mtp_num_layers", None)),
        ("--decoder-first-pipeline-num-layers",
         getattr(args, "decoder_first_pipeline_num_layers", None)),
        ("--decoder-last-pipeline-num-layers",
         getattr(args, "decoder_last_pipeline_num_layers", None)),
        ("--pipeline-model-parallel-layout",
         getattr(args, "pipeline_model_parallel_layout", None)),
        ("--account-for-embedding-in-pipeline-split",
         getattr(args, "account_for_embedding_in_pipeline_split", False)),
        ("--account-for-loss-in-pipeline-split",
         getattr(args, "account_for_loss_in_pipeline_split", False)),
        ("--defer-embedding-wgrad-compute", getattr(args, "defer_embedding_wgrad_compute", False)),
        ("--use-megatron-fsdp", getattr(args, "use_megatron_fsdp", False)
         or getattr(args, "use_custom_fsdp", False)),
    ]
    given_flags = [flag for flag, value in unsupported if value]
    if given_flags:
        return (f"{given}: not with {', '.join(given_flags)} (the V places the layers evenly, "
                f"two chunks per rank, and these change the placement or what a stage holds): "
                f"drop them, or the V schedule.")
    return None


def chunks_per_rank(args):
    """Model chunks per rank, from whichever of Megatron's virtual-pipeline flags is given
    (before or after Megatron's own validation derives the size)."""
    if getattr(args, "virtual_pipeline_model_parallel_size", None):
        return args.virtual_pipeline_model_parallel_size
    if getattr(args, "num_virtual_stages_per_pipeline_rank", None):
        return args.num_virtual_stages_per_pipeline_rank
    per_stage = getattr(args, "num_layers_per_virtual_pipeline_stage", None)
    if per_stage:
        return args.num_layers // args.pipeline_model_parallel_size // per_stage
    return 1


@hookimpl
def mmp_transformer_config(args, config):
    config.pipeline_v_schedule = getattr(args, "pipeline_v_schedule", None)


# ----------------------------------------------------------------------------- the placement


def _layer_offset(run: PipelineRun, wrapped, instance, args, kwargs):
    bound = _bind(wrapped, args, kwargs)
    config, vp_stage = bound.arguments["config"], bound.arguments.get("vp_stage")
    if not getattr(config, "pipeline_v_schedule", None) or vp_stage != 1:
        return wrapped(*args, **kwargs)
    from megatron.core import parallel_state

    rank = bound.arguments.get("pp_rank")
    if rank is None:
        rank = parallel_state.get_pipeline_model_parallel_rank()
    # stage 2p-1-r = p + (p-1-r): where the interleaved placement puts rank p-1-r's chunk 1
    return wrapped(config, vp_stage=1, pp_rank=config.pipeline_model_parallel_size - 1 - rank)


def _last_stage(run: PipelineRun, wrapped, instance, args, kwargs):
    if not run.v_schedule:
        return wrapped(*args, **kwargs)
    bound = _bind(wrapped, args, kwargs)
    from megatron.core import parallel_state

    if bound.arguments["ignore_virtual"] or \
            parallel_state.get_virtual_pipeline_model_parallel_world_size() is None:
        return wrapped(*args, **kwargs)
    vp_stage = bound.arguments.get("vp_stage")
    if vp_stage is None:
        vp_stage = parallel_state.get_virtual_pipeline_model_parallel_rank()
    return vp_stage == 1 and parallel_state.get_pipeline_model_parallel_rank() == 0


def _get_model(run: PipelineRun, wrapped, instance, args, kwargs):
    return _with_provider_in_the_v(run, "model_provider_func", wrapped, args, kwargs)


def _build_stages(run: PipelineRun, wrapped, instance, args, kwargs):
    return _with_provider_in_the_v(run, "build_model_func", wrapped, args, kwargs)


def _with_provider_in_the_v(run: PipelineRun, parameter, wrapped, args, kwargs):
    """Call ``wrapped`` with its model-building function told that the loss is rank 0's chunk
    1 (Megatron's builders pass each chunk's ``post_process`` and ``vp_stage`` by name)."""
    if not run.v_schedule:
        return wrapped(*args, **kwargs)
    from megatron.core import parallel_state

    bound = _bind(wrapped, args, kwargs)
    build = bound.arguments[parameter]

    @functools.wraps(build)
    def in_the_v(*a, **kw):
        if kw.get("vp_stage") is not None and "post_process" in kw:
            kw["post_process"] = (kw["vp_stage"] == 1
                                  and parallel_state.get_pipeline_model_parallel_rank() == 0)
        return build(*a, **kw)

    bound.arguments[parameter] = in_the_v
    return wrapped(*bound.args, **bound.kwargs)


def _batch(run: PipelineRun, wrapped, instance, args, kwargs):
    """Upstream reads a first stage's tokens and a last stage's labels; rank 0 holds both
    stages, so it reads (and its tensor-parallel peers receive) every field, as upstream does
    for a rank with MTP layers."""
    if not run.v_schedule:
        return wrapped(*args, **kwargs)
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_rank() == 0:
        bound = _bind(wrapped, args, kwargs)
        bound.arguments["mtp_on_this_rank"] = True
        return wrapped(*bound.args, **bound.kwargs)
    return wrapped(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _signature(function):
    return inspect.signature(function)


def _bind(wrapped, args, kwargs):
    bound = _signature(wrapped).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


def _linear_backward(run: PipelineRun, wrapped, instance, args, kwargs):
    ctx, grad_output = args
    return weight_gradients.linear_backward(run.store, wrapped, ctx, grad_output)


# ----------------------------------------------------------------------------- the schedule


def _schedule(run: PipelineRun, wrapped, instance, args, kwargs):
    from megatron.core.utils import get_model_config

    model = kwargs["model"]  # the schedules take keyword arguments only
    config = get_model_config(model[0])
    schedule = getattr(config, "pipeline_v_schedule", None)
    if not schedule:
        return wrapped(*args, **kwargs)
    try:
        return _run_v(run, schedule, config, kwargs)
    finally:
        run.store.clear()


def _run_v(run: PipelineRun, schedule: str, config, kwargs):
    from megatron.core import parallel_state

    model, forward_only = kwargs["model"], kwargs.get("forward_only", False)
    microbatches = kwargs["num_microbatches"]
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    ranks, rank = pp_group.size(), pp_group.rank()
    name = "forward-only" if forward_only else schedule
    if microbatches < v_shape.minimum_microbatches(name, ranks):
        raise ArgumentError(
            f"--pipeline-v-schedule {schedule}: {microbatches} micro-batches per step, and "
            f"{schedule} needs at least {v_shape.minimum_microbatches(name, ranks)} at "
            f"--pipeline-model-parallel-size {ranks} (one per stage): raise "
            f"--global-batch-size or lower --micro-batch-size.")
    plan = run.v_plans.get((name, ranks, microbatches))
    if plan is None:
        plan = run.v_plans[(name, ranks, microbatches)] = v_shape.orders(name, ranks,
                                                                         microbatches)
    steps = MegatronSteps(run, config, kwargs)
    transport = Transfers(run, pp_group, _tensor_shape(config, kwargs), config.pipeline_dtype,
                          _device(model))
    if config.timers is not None:
        config.timers("forward-backward", log_level=1).start(barrier=config.barrier_with_L1_time)
    steps.disable_grad_sync()
    if config.param_sync_func is not None and not forward_only:
        for chunk, sync in enumerate(_per_chunk(config.param_sync_func, model)):
            sync(model[chunk].parameters())
    VPipeline(rank, ranks, plan, steps, transport, keep_for_backward=not forward_only).run()
    run.store.flush()
    steps.enable_grad_sync()
    if config.grad_sync_func is not None and not forward_only:
        for chunk, sync in enumerate(_per_chunk(config.grad_sync_func, model)):
            sync(model[chunk].parameters())
    # the loss is rank 0's; Megatron's loop reads it on the last pipeline rank
    losses, tokens = _from_first_rank(steps.forward_data_store, steps.tokens, pp_group)
    if config.finalize_model_grads_func is not None and not forward_only:
        config.finalize_model_grads_func(
            model, tokens if config.calculate_per_token_loss else None,
            pg_collection=kwargs.get("pg_collection"),
            force_all_reduce=kwargs.get("force_all_reduce", False))
    if config.timers is not None:
        config.timers("forward-backward").stop()
    return losses


def _per_chunk(funcs, model):
    return funcs if isinstance(funcs, list) else [funcs] * len(model)


def _tensor_shape(config, kwargs):
    from megatron.core import parallel_state

    length = kwargs["seq_length"] // parallel_state.get_context_parallel_world_size()
    if config.sequence_parallel:
        length //= parallel_state.get_tensor_model_parallel_world_size()
    return (length, kwargs["micro_batch_size"], config.hidden_size)


def _device(model):
    return next(p for chunk in model for p in chunk.parameters()).device


def _from_first_rank(store, tokens, pp_group):
    """Rank 0's losses and token count on every rank of the pipeline."""
    import torch.distributed as dist

    device = tokens.device
    # a tensor pickles with its device: sent from the host, received onto this rank's device
    payload = [_moved((store, tokens), lambda t: t.cpu())]
    dist.broadcast_object_list(payload, src=dist.get_process_group_ranks(pp_group)[0],
                               group=pp_group, device=_collective_device(pp_group, device))
    return _moved(payload[0], lambda t: t.to(device))


def _moved(value, move):
    """``value`` (the loss function's dicts, lists and tuples of tensors), each tensor moved."""
    import torch

    if torch.is_tensor(value):
        return move(value)
    if isinstance(value, dict):
        return {k: _moved(v, move) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(v, move) for v in value)
    return value


def _collective_device(group, device):
    import torch.distributed as dist

    return device if dist.get_backend(group) != "gloo" else None


class MegatronSteps:
    """megatron-core's ``forward_step`` and ``backward_step`` for one schedule call, with the
    step's loss store, token count and grad-sync switch as its interleaved schedule keeps them."""

    def __init__(self, run: PipelineRun, config, kwargs):
        import torch
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel import schedules
        from megatron.core.utils import get_model_type

        self.run, self.config, self.kwargs = run, config, kwargs
        self.ranks = parallel_state.get_pipeline_model_parallel_world_size()
        self.model = kwargs["model"]
        self.schedules = schedules
        self.forward_data_store = []
        self.tokens = torch.zeros([], dtype=torch.int, device=_device(self.model))
        self.cp_size = parallel_state.get_context_parallel_world_size()
        self.model_type = get_model_type(self.model[0])
        self._backward_takes_model_type = "model_type" in _signature(
            inspect.unwrap(schedules.backward_step)).parameters
        no_sync = config.no_sync_func
        if isinstance(no_sync, list):
            funcs = no_sync

            def no_sync():
                stack = contextlib.ExitStack()
                for func in funcs:
                    stack.enter_context(func())
                return stack
        self._no_sync = no_sync or contextlib.nullcontext
        self._no_sync_context = None

    def disable_grad_sync(self):
        if self._no_sync_context is None:
            self._no_sync_context = self._no_sync()
            self._no_sync_context.__enter__()

    def enable_grad_sync(self):
        if self._no_sync_context is not None:
            self._no_sync_context.__exit__(None, None, None)
            self._no_sync_context = None

    def forward(self, chunk, microbatch, input_tensor, is_last):
        kwargs = self.kwargs
        first = self.schedules.check_first_val_step(kwargs.get("first_val_step"),
                                                    kwargs.get("forward_only", False),
                                                    microbatch == 0)
        self.run.forwards, self.run.chunk = microbatch, chunk  # the timeline's labels
        output, tokens = self.schedules.forward_step(
            kwargs["forward_step_func"], kwargs["data_iterator"][chunk], self.model[chunk],
            kwargs["num_microbatches"], input_tensor, self.forward_data_store, self.config,
            self.cp_size, collect_non_loss_data=kwargs.get("collect_non_loss_data", False),
            checkpoint_activations_microbatch=None, is_first_microbatch=first,
            current_microbatch=microbatch, vp_stage=chunk, is_last_stage=is_last)
        self.tokens += tokens
        return output

    def sent(self, output_tensor):
        if not self.kwargs.get("forward_only", False):
            self.schedules.deallocate_output_tensor(output_tensor,
                                                    self.config.deallocate_pipeline_outputs)

    def backward(self, chunk, stage, microbatch, input_tensor, output_tensor, output_grad,
                 weights_later):
        extra = {"model_type": self.model_type} if self._backward_takes_model_type else {}
        held = (self.run.store.deferring(microbatch, name=(stage, microbatch)) if weights_later
                else contextlib.nullcontext())
        self.run.backwards, self.run.chunk = microbatch, chunk
        with held:
            return self.schedules.backward_step(input_tensor=input_tensor,
                                                output_tensor=output_tensor,
                                                output_tensor_grad=output_grad,
                                                config=self.config, **extra)

    def weight(self, stage, microbatch):
        self.run.chunk = v_shape.chunk_of(stage, self.ranks)
        self.run.store.run((stage, microbatch))


class Transfers:
    """Sends and receives between the pipeline's ranks. Transfers up the pipeline (to a higher
    rank) use megatron-core's pipeline group, those down a second group of the same ranks, so
    neither direction's queue on a rank waits behind the other's."""

    def __init__(self, run: PipelineRun, pp_group, shape, dtype, device):
        import torch.distributed as dist

        self.dist = dist
        self.ranks = dist.get_process_group_ranks(pp_group)
        self.rank = pp_group.rank()
        self.up, self.down = pp_group, _down_group(run, pp_group)
        self.shape, self.dtype, self.device = shape, dtype, device
        self.sending = []

    def _group(self, peer):
        return self.up if peer > self.rank else self.down

    def post_receive(self, peer, message):
        import torch

        buffer = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        # what a peer above sends travels down the pipeline: on the downward group
        group = self.down if peer > self.rank else self.up
        return buffer, self.dist.irecv(buffer, src=self.ranks[peer], group=group)

    def wait(self, handle):
        buffer, work = handle
        work.wait()
        return buffer

    def send(self, tensor, peer, message):
        tensor = tensor.contiguous()
        self.sending.append((self.dist.isend(tensor, dst=self.ranks[peer],
                                             group=self._group(peer)), tensor))

    def finish(self):
        for work, _ in self.sending:
            work.wait()
        self.sending.clear()


def _down_group(run: PipelineRun, pp_group):
    """A second group for each pipeline, made once, together by every rank."""
    if run.down_group is not None:
        return run.down_group
    import torch.distributed as dist

    mine = dist.get_process_group_ranks(pp_group)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    for ranks in sorted({tuple(r) for r in every}):
        group = dist.new_group(list(ranks))
        if list(ranks) == mine:
            run.down_group = group
    return run.down_group
