"""One rank of a planned job, run by ``mmp plan`` in its own process: the release's training step
on fake tensors (``lib/plan/fake_world.py``), measured by ``lib/plan/tracker.py``.

``python -m megatron_musa_patch.cli.plan_worker REQUEST_JSON RESULT_JSON``. The request names the
script and its arguments, the job's world (``world_size``, ``nproc_per_node``), the rank and the
most micro-batches to run (``microbatch_cap``). The rank activates the layer on the CPU row, parses
and validates the arguments with Megatron's parser for that world, builds model and optimizer with
the script's own ``model_provider`` through Megatron's ``setup_model_and_optimizer``, and runs two
of Megatron's ``train_step`` with the script's ``forward_step``: the first creates the optimizer's
state, the second is the step that repeats. Its result: memory (the peak, and the model's,
gradients' and optimizer's own bytes), the work per phase of the second step, its collectives.

The peak does not depend on how many micro-batches past the pipeline's warm-up run (each stage
holds at most its warm-up's activations), so at most ``microbatch_cap`` run; the step time scales
the per-micro-batch work to the job's count.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import os
import runpy
import sys
import time
from collections import Counter


def main(argv) -> int:
    request_path, result_path = argv
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    try:
        result = run(request)
    except PlanRefusal as exc:
        result = {"error": str(exc), "kind": "refused"}
    except Exception as exc:  # noqa: BLE001 - said by the planner with the rank's traceback
        import traceback

        result = {"error": f"{type(exc).__name__}: {exc}", "kind": "failed",
                  "traceback": traceback.format_exc()[-6000:]}
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


class PlanRefusal(Exception):
    """The arguments, as Megatron's parser or validation says (one paragraph)."""


def _environment(request) -> None:
    from megatron_musa_patch.device.names import CPU

    os.environ.update({
        "WORLD_SIZE": str(request["world_size"]), "RANK": str(request["rank"]),
        "LOCAL_WORLD_SIZE": str(request["nproc_per_node"]),
        "LOCAL_RANK": str(request["rank"] % request["nproc_per_node"]),
        "MEGATRON_MUSA_PATCH_DEVICE": CPU, "MEGATRON_MUSA_PATCH_ARGS_CHECK": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
    })


def run(request) -> dict:
    begin = time.monotonic()
    _environment(request)
    import torch

    from megatron_musa_patch.lib.plan import fake_world
    from megatron_musa_patch.lib.plan.tracker import Tracker

    recorder = fake_world.Recorder()
    recorder.transients = dict(request.get("transients") or {})
    recorder.compiled_as_eager = bool(request.get("compiled_as_eager"))
    stack = contextlib.ExitStack()
    stack.enter_context(fake_world.applied(recorder))

    from megatron_musa_patch import activation

    session = activation.activate()
    fake_world.groups_on_fake_backend()
    script = os.path.abspath(request["script"])
    sys.argv = [script, *request["script_args"]]
    if os.path.dirname(script) not in sys.path:
        sys.path.append(os.path.dirname(script))
    session.lm_path = activation.order_sys_path(session.lm_path)
    release = session.versions().get("megatron-core") or ""

    call, namespace, source = _script(script)
    args = _parsed_args(call, namespace, release)
    real_microbatches = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
    layout = {"tp": args.tensor_model_parallel_size, "pp": args.pipeline_model_parallel_size,
              "dp": args.data_parallel_size, "cp": getattr(args, "context_parallel_size", 1),
              "ep": getattr(args, "expert_model_parallel_size", 1),
              "micro_batch_size": args.micro_batch_size,
              "global_batch_size": args.global_batch_size, "seq_length": args.seq_length}
    pp = args.pipeline_model_parallel_size
    cap = max(int(request.get("microbatch_cap", 0)) or 2 * pp, 1)
    simulated = min(real_microbatches, cap)
    if pp > 1 and simulated % pp and real_microbatches >= pp:
        simulated = min(real_microbatches, -(-simulated // pp) * pp)
    args.global_batch_size = simulated * args.micro_batch_size * args.data_parallel_size
    for name in ("load", "pretrained_checkpoint", "save"):
        setattr(args, name, None)
    args.rampup_batch_size = None
    if not getattr(args, "train_iters", None) and not getattr(args, "train_samples", None):
        args.train_iters = 2  # the scheduler wants a length; the plan's memory does not

    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet):
        from megatron.training import global_vars
        from megatron.training import initialize as megatron_init

        global_vars.set_global_variables(args, build_tokenizer=True)
        fake_world.init_fake_world(request["rank"], request["world_size"])
        _call(megatron_init._initialize_distributed, get_embedding_ranks=None,
              get_position_embedding_ranks=None, store=None)
        megatron_init._set_random_seed(args.seed, args.data_parallel_random_init)

    from megatron.core import parallel_state

    stage = parallel_state.get_pipeline_model_parallel_rank()
    with contextlib.redirect_stdout(quiet):
        passed = _pretrain_arguments(source, namespace, args)

    from torch._subclasses.fake_tensor import FakeTensorMode

    _moe_routing_balanced(args)
    tracker = Tracker()
    if getattr(args, "num_experts", None):
        tracker.density = args.moe_router_topk / args.num_experts
    recorder.tracker = tracker
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    marks = {}
    with fake, tracker, contextlib.redirect_stdout(quiet):
        from megatron.core.utils import get_model_config
        from megatron.training import training

        tracker.phase = recorder.phase = "setup"
        model, optimizer, scheduler = _call(
            training.setup_model_and_optimizer, model_provider_func=passed.get("model_provider"),
            model_type=passed["model_type"], cfg_container=passed.get("cfg_container"),
            pg_collection=_mpu_groups())
        memory = _static_memory(model, optimizer)
        marks["setup_peak"] = tracker.peak
        config = get_model_config(model[0])
        forward_backward = _phased_schedule(tracker, recorder)
        _wire_config(args, config, model, optimizer, training)
        iterator = _batches(args, len(model))
        step_peaks = []
        for iteration in range(2):
            if iteration == 1:
                tracker.work.clear()
                tracker.calls.clear()
                recorder.comms.clear()
                memory = _static_memory(model, optimizer)  # the optimizer's state now exists
            tracker.mark()
            _call(training.train_step,
                  forward_step_func=_phase(passed["forward_step_func"], "forward", tracker,
                                           recorder),
                  data_iterator=iterator, model=model, optimizer=optimizer,
                  opt_param_scheduler=scheduler, config=config,
                  forward_backward_func=forward_backward, iteration=iteration)
            step_peaks.append((tracker.peak, tracker.peak_rounded))
        stack.close()

    comms = Counter()
    nproc = request["nproc_per_node"]
    for c in recorder.comms:
        nodes = len({r // nproc for r in c.ranks}) if c.ranks else 1
        comms[(c.op, c.nbytes, len(c.ranks), nodes, c.phase, c.overlapped)] += 1
    return {
        "megatron_core": release, "torch": torch.__version__,
        "rank": request["rank"], "stage": stage, **layout,
        "dtype_bits": 16 if (args.bf16 or args.fp16) else 32,
        "vpp": getattr(args, "virtual_pipeline_model_parallel_size", None) or 1,
        "microbatches": real_microbatches, "microbatches_run": simulated,
        "forward_calls": tracker.calls.get("forward", 0), "peak_phase": tracker.peak_phase,
        # the second step repeats; the first also creates the optimizer's state
        "memory": {**memory, "setup_peak": marks["setup_peak"],
                   "first_step_peak": step_peaks[0][0], "steady_peak": step_peaks[1][0],
                   "step_peak": max(p for p, _ in step_peaks),
                   "step_peak_rounded": max(r for _, r in step_peaks)},
        "work": {phase: [[*key, n] for key, n in counter.items()]
                 for phase, counter in tracker.work.items()},
        "comms": [[*key, n] for key, n in comms.items()],
        "model_flops_per_iteration": _model_flops(args, real_microbatches),
        "megatron_theoretical": _theoretical(args, real_microbatches),
        "tokens_per_iteration": real_microbatches * args.micro_batch_size *
        args.data_parallel_size * args.seq_length,
        "world_size": request["world_size"],
        "seconds": round(time.monotonic() - begin, 2),
    }


# ------------------------------------------------------------------------------ the script
def _script(script: str):
    from megatron_musa_patch.cli.megatron_entry import entry_call

    with open(script, encoding="utf-8") as f:
        source = f.read()
    call = entry_call(source)
    if _pretrain_call(source) is None:
        raise PlanRefusal(_rendered(
            f"{script} does not call Megatron's pretrain() in its `if __name__ == "
            f"\"__main__\":` block; mmp plan reads the model and the step from that call (a "
            f"stock pretrain_gpt.py does)."))
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        namespace = runpy.run_path(script, run_name="__mmp_plan__")
    return call, namespace, source


def _pretrain_call(source: str):
    """The ``pretrain(...)`` call of the script's ``__main__`` block and that block."""
    from megatron_musa_patch.cli.megatron_entry import called_name, is_main_guard

    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and is_main_guard(node.test):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call) and called_name(inner) == "pretrain":
                    return inner, node
    return None


def _pretrain_arguments(source: str, namespace: dict, args) -> dict:
    """What the script passes ``pretrain``, by its parameters' names: the statements of the
    ``__main__`` block before the call run in the script's namespace (a release whose script
    builds a config container from the arguments, as 0.19's does, needs them), with the parsing
    statement's result bound to the arguments already parsed."""
    from megatron.training import training

    from megatron_musa_patch.cli.megatron_entry import called_name

    call, block = _pretrain_call(source)
    parsing = ("parse_and_validate_args", "initialize_megatron", "get_args")
    for statement in block.body:
        if any(inner is call for inner in ast.walk(statement)):
            break
        calls = [n for n in ast.walk(statement) if isinstance(n, ast.Call)]
        if any(called_name(c) in parsing for c in calls):
            for target in getattr(statement, "targets", []):
                if isinstance(target, ast.Name):
                    namespace[target.id] = args
            continue
        exec(compile(ast.Module(body=[statement], type_ignores=[]), "<__main__ block>", "exec"),
             namespace)
    bound = inspect.signature(training.pretrain).bind_partial(
        *[_evaluate(a, namespace) for a in call.args],
        **{kw.arg: _evaluate(kw.value, namespace) for kw in call.keywords if kw.arg})
    return dict(bound.arguments)


def _parsed_args(call, namespace, release: str):
    from megatron_musa_patch.cli import args_check_worker as check

    provider, defaults, ignore_unknown = check._entry_arguments(call, namespace)
    verdict = check._parse_and_validate(provider, defaults, ignore_unknown, release)
    if verdict.status == "refused":
        raise PlanRefusal(verdict.text.replace("mmp run:", "mmp plan:"))
    if verdict.status != "ok":
        raise PlanRefusal(_rendered(f"Megatron could not check these arguments: {verdict.text}"))
    from megatron.training import arguments

    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        args = arguments.parse_args(provider, ignore_unknown_args=ignore_unknown)
        arguments.validate_args(args, defaults)
    return args


def _evaluate(node, namespace):
    return eval(compile(ast.Expression(body=node), "<pretrain call>", "eval"), namespace)


def _mpu_groups():
    """The process groups as Megatron's own ``pretrain`` hands them down, where it does."""
    try:
        from megatron.core.process_groups_config import ProcessGroupCollection
    except ImportError:
        return None
    maker = getattr(ProcessGroupCollection, "use_mpu_process_groups", None)
    return maker() if maker is not None else None


def _call(function, **kwargs):
    """``function`` with the keywords its release takes."""
    accepted = inspect.signature(function).parameters
    return function(**{k: v for k, v in kwargs.items() if k in accepted})


# ------------------------------------------------------------------------------ the step
def _wire_config(args, config, model, optimizer, training) -> None:
    """What Megatron's ``train()`` sets on the model config before its first step: the loss
    scale, the gradient reduction at the end of the step, and the overlap hooks when asked."""
    config.grad_scale_func = optimizer.scale_loss
    config.timers = None
    chunks = list(model)

    def one_or_list(values):
        return values[0] if len(values) == 1 else values

    if getattr(args, "overlap_grad_reduce", False) and hasattr(chunks[0], "no_sync"):
        config.no_sync_func = one_or_list([c.no_sync for c in chunks])
        if getattr(args, "align_grad_reduce", False):
            config.grad_sync_func = one_or_list([c.start_grad_sync for c in chunks])
    if getattr(args, "overlap_param_gather", False) and getattr(args, "align_param_gather",
                                                                False):
        config.param_sync_func = one_or_list([c.start_param_sync for c in chunks])
    config.finalize_model_grads_func = training.finalize_model_grads


def _phase(function, name, tracker, recorder):
    def in_phase(*args, **kwargs):
        before = tracker.phase
        tracker.phase = recorder.phase = name
        tracker.calls[name] = tracker.calls.get(name, 0) + 1
        try:
            return function(*args, **kwargs)
        finally:
            tracker.phase = recorder.phase = before

    return in_phase


def _phased_schedule(tracker, recorder):
    """Megatron's schedule for this layout, with its backward steps, the gradients' reduction
    and the optimizer's step each in their own phase."""
    from megatron.core.optimizer import MegatronOptimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func, schedules
    from megatron.training import training

    tracker.calls = {}
    schedules.backward_step = _phase(schedules.backward_step, "backward", tracker, recorder)
    training.finalize_model_grads = _phase(training.finalize_model_grads, "grad_sync", tracker,
                                           recorder)
    for cls in {MegatronOptimizer, *_subclasses(MegatronOptimizer)}:
        if "step" in cls.__dict__:
            cls.step = _phase(cls.__dict__["step"], "optimizer", tracker, recorder)
    schedule = get_forward_backward_func()

    def forward_backward(**kwargs):
        tracker.phase = recorder.phase = "schedule"
        try:
            return schedule(**kwargs)
        finally:
            tracker.phase = recorder.phase = "other"

    return forward_backward


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _batches(args, chunks: int):
    """What the stock GPT dataset yields, for every micro-batch (contents do not matter)."""
    import torch

    b, s = args.micro_batch_size, args.seq_length

    def batches():
        while True:
            batch = {"tokens": torch.zeros(b, s, dtype=torch.long),
                     "labels": torch.zeros(b, s, dtype=torch.long),
                     "loss_mask": torch.ones(b, s, dtype=torch.float),
                     "position_ids": torch.arange(s).unsqueeze(0).expand(b, s).contiguous()}
            if getattr(args, "create_attention_mask_in_dataloader", True):
                batch["attention_mask"] = torch.ones(b, 1, s, s, dtype=torch.bool)
            else:
                batch["attention_mask"] = None
            yield {k: batch[k] for k in ("tokens", "labels", "loss_mask", "attention_mask",
                                         "position_ids")}

    if chunks == 1:
        return batches()
    return [batches() for _ in range(chunks)]


def _moe_routing_balanced(args) -> None:
    """MoE token counts are data: on fake tensors there are none. The planned rank routes its
    tokens evenly (token t to experts t*k .. t*k+k-1, modulo the experts), which is what the
    load-balancing losses aim at; the all-to-all dispatcher's counts and splits are computed for
    real from that routing. Other dispatchers select tokens by value and are refused."""
    if not getattr(args, "num_experts", None):
        return
    kind = getattr(args, "moe_token_dispatcher_type", "allgather")
    if kind != "alltoall":
        raise PlanRefusal(_rendered(
            f"--moe-token-dispatcher-type {kind}: mmp plan plans MoE with the alltoall "
            f"dispatcher (its token counts computed from balanced routing); plan with "
            f"--moe-token-dispatcher-type alltoall (what DeepSeek, Qwen-MoE and MT-Megatron's "
            f"recipes use)."))
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    original = MoEAlltoAllTokenDispatcher.preprocess

    def preprocess(self, routing_map):
        tokens, experts = routing_map.shape
        k = self.config.moe_router_topk
        with unset_fake_temporarily():
            chosen = (torch.arange(tokens).unsqueeze(1) * k + torch.arange(k)) % experts
            balanced = torch.zeros(tokens, experts, dtype=torch.bool).scatter_(1, chosen, True)
            return original(self, balanced)

    MoEAlltoAllTokenDispatcher.preprocess = preprocess
    from megatron.core.transformer.moe import token_dispatcher

    moved = token_dispatcher.maybe_move_tensor_to_cpu

    def on_host(tensor, as_numpy=False, record_stream=False):
        # the counts are host values already: an op under the fake mode would make them fake
        if torch.is_tensor(tensor) and not isinstance(tensor, FakeTensor):
            with unset_fake_temporarily():  # .numpy() under the fake mode reads no data
                return tensor.numpy() if as_numpy else tensor
        return moved(tensor, as_numpy=as_numpy, record_stream=record_stream)

    token_dispatcher.maybe_move_tensor_to_cpu = on_host


def _rendered(text: str) -> str:
    from megatron_musa_patch.base.errors import MegatronMusaPatchError

    return MegatronMusaPatchError(text).render(prog="mmp plan")


# ------------------------------------------------------------------------------ the figures
def _static_memory(model, optimizer) -> dict:
    from megatron_musa_patch.lib.plan.tracker import storage_bytes

    params = [p for chunk in model for p in chunk.parameters()]
    weights, weight_keys = storage_bytes(params)
    grads, grad_keys = storage_bytes([getattr(p, "main_grad", None) for p in params],
                                     exclude=weight_keys)
    state = []
    for inner in _torch_optimizers(optimizer):
        for group in inner.param_groups:
            state.extend(group["params"])
        for value in inner.state.values():
            state.extend(v for v in value.values() if hasattr(v, "untyped_storage"))
    state.extend(_main_param_shards(optimizer))
    optim, _ = storage_bytes(state, exclude=weight_keys | grad_keys)
    return {"weights": weights, "gradients": grads, "optimizer": optim,
            "parameters": sum(p.numel() for p in params)}


def _torch_optimizers(optimizer):
    for megatron_optimizer in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(megatron_optimizer, "optimizer", None)
        if inner is None:
            continue
        subs = getattr(inner, "sub_optimizers", None)  # the CPU-offload optimizer's parts
        yield from (subs if subs else [inner])


def _main_param_shards(optimizer):
    for megatron_optimizer in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        for name in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups",
                     "shard_fp32_groups"):
            for group in getattr(megatron_optimizer, name, None) or []:
                yield from group


def _model_flops(args, microbatches: int):
    from megatron.training import training

    batch = microbatches * args.micro_batch_size * args.data_parallel_size
    try:
        return float(training.num_floating_point_operations(args, batch))
    except Exception:  # noqa: BLE001 - a model its helper does not cover
        return None


def _theoretical(args, microbatches: int):
    """Megatron's own estimate (``theoretical_memory_usage``), first pipeline stage."""
    try:
        from megatron.training import theoretical_memory_usage as theory

        quiet = io.StringIO()
        with contextlib.redirect_stdout(quiet):
            weights_optimizer = theory.compute_weight_and_optimizer_memory(args)
            activations = theory.compute_activation_memory(args, microbatches)
        return {"weights_and_optimizer": float(weights_optimizer),
                "activations": float(activations),
                "total": float(weights_optimizer + activations)}
    except Exception as exc:  # noqa: BLE001 - shown as unavailable, with why
        return {"unavailable": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
