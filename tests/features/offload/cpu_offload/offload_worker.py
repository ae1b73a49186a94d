"""One rank of the offload checks (run under torchrun by
tests/features/offload/cpu_offload/test_megatron_core.py).

Trains the harness's tiny megatron-core GPT (tests/harness/tiny_gpt.py, local spec) with the
distributed optimizer once per optimizer configuration, in one process: every run starts from the
same weights (seeds reset) and sees the same batches. Per run rank 0 records the per-step losses and
where the optimizer state lives (``megatron_musa_patch.lib.offload.counting``); the overlap runs
count the events recorded on the hybrid optimizer's copy streams. A ``resume`` run trains half the
steps, saves model and optimizer the way Megatron-LM does (``torch_dist`` with either
distributed-optimizer layout, or ``--ckpt-format torch``: model first, then the optimizer and its
parameter state), builds a fresh model and optimizer from *other* initial weights, loads, and trains
the rest; the optimizer state after loading is compared with the state that was saved, tensor by
tensor, wherever it lives, and so are the model weights.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tests.harness import tiny_gpt  # activates the layer before Megatron is imported

import torch  # noqa: E402

from megatron_musa_patch.lib.offload.counting import hybrid_optimizers, placement  # noqa: E402

FP = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

#: run name -> OptimizerConfig attributes (the megatron-core spelling of the flags)
RUNS = {
    "base": {},
    "f1": dict(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0),
    "f0.5": dict(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5),
    "f1+overlap": dict(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0,
                       overlap_cpu_optimizer_d2h_h2d=True),
    "f0.5+overlap": dict(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5,
                         overlap_cpu_optimizer_d2h_h2d=True),
    "aware": dict(use_precision_aware_optimizer=True),
    "aware+moments16": dict(use_precision_aware_optimizer=True, exp_avg_dtype="bf16",
                            exp_avg_sq_dtype="bf16"),
    "aware+master16": dict(use_precision_aware_optimizer=True, main_params_dtype="fp16"),
    "f0.5+moments16": dict(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5,
                           exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"),
}


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--runs", default="base,f1,f0.5")
    p.add_argument("--resume", default="",
                   help="runs to repeat with a save/load half-way, as name:format with format "
                        "dp_reshardable or fully_reshardable (torch_dist checkpoints, the "
                        "distributed optimizer's two layouts) or torch (--ckpt-format torch)")
    p.add_argument("--ckpt", required=True, help="directory for the resume checkpoints")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def optimizer_config(name, opts):
    from megatron.core.optimizer import OptimizerConfig

    extra = {k: FP.get(v, v) for k, v in RUNS[name].items()}
    if extra.get("optimizer_cpu_offload"):
        extra["use_precision_aware_optimizer"] = True  # as Megatron-LM requires
    return OptimizerConfig(optimizer="adam", lr=1e-2, weight_decay=0.01, clip_grad=1.0,
                           bf16=opts.bf16, use_distributed_optimizer=True, **extra)


def build(name, opts, model_opts, seed):
    from megatron.core.transformer.module import Float16Module

    tiny_gpt.seed(seed)
    model, config = tiny_gpt.build_model(model_opts, True, True)
    if opts.bf16:
        config.bf16 = True
        config.params_dtype = config.pipeline_dtype = torch.bfloat16
        model = Float16Module(config, model)
    models, optimizer = tiny_gpt.wrap([model.to("cuda")], config, optimizer_config(name, opts))
    return models[0], optimizer


def train(model, optimizer, step_batches, model_opts):
    return tiny_gpt.train_steps([model], optimizer, step_batches, model_opts)[0]


def count_copy_events(optimizer):
    """Counts events recorded on the hybrid optimizer's own copy streams (overlap runs)."""
    counts = {"d2h": 0, "h2d": 0, "own_streams": True, "stream_type": None}
    current = torch.cuda.current_stream()
    for hybrid in hybrid_optimizers(optimizer):
        for label, stream in (("d2h", hybrid._d2h_stream), ("h2d", hybrid._h2d_stream)):
            counts["own_streams"] &= stream is not current
            counts["stream_type"] = f"{type(stream).__module__}.{type(stream).__qualname__}"
            original = stream.record_event

            def record(*args, _label=label, _original=original, **kwargs):
                counts[_label] += 1
                return _original(*args, **kwargs)

            stream.record_event = record
    return counts


def state_snapshot(optimizer):
    """Every tensor of every hybrid/inner optimizer state, in parameter order, as host copies."""
    snap = []
    inners = list(hybrid_optimizers(optimizer)) or [optimizer.optimizer]
    for inner in inners:
        for group in inner.param_groups:
            for param in group["params"]:
                state = inner.state.get(param, {})
                snap.append({k: v.detach().to("cpu", copy=True) for k, v in state.items()
                             if torch.is_tensor(v)})
    return snap


def snapshot_diff(a, b):
    """Largest absolute difference over all state tensors (inf if the structure differs)."""
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        if x.keys() != y.keys():
            return float("inf")
        for key in x:
            if x[key].dtype != y[key].dtype or x[key].shape != y[key].shape:
                return float("inf")
            worst = max(worst, (x[key].double() - y[key].double()).abs().max().item()
                        if x[key].numel() else 0.0)
    return worst


def state_dtypes(optimizer):
    found = {}
    for inner in list(hybrid_optimizers(optimizer)) or [optimizer.optimizer]:
        subs = getattr(inner, "sub_optimizers", [inner])
        for sub in subs:
            for state in sub.state.values():
                for key, value in state.items():
                    if torch.is_tensor(value) and key != "step":
                        found.setdefault(key, set()).add(str(value.dtype).replace("torch.", ""))
    return {k: sorted(v) for k, v in found.items()}


def checkpoint(model, optimizer, loading, sharding):
    model_sd = model.module.sharded_state_dict()
    return {"model": model_sd, "optimizer": optimizer.sharded_state_dict(
        model_sd, is_loading=loading, metadata={"distrib_optim_sharding_type": sharding})}


def resume(name, fmt, opts, model_opts, step_batches):
    from megatron.core import dist_checkpointing

    half = len(step_batches) // 2
    path = os.path.join(opts.ckpt, f"{name}-{fmt}".replace("+", "_"))
    if torch.distributed.get_rank() == 0:
        os.makedirs(path, exist_ok=True)
    torch.distributed.barrier()
    model, optimizer = build(name, opts, model_opts, seed=1234)
    first = train(model, optimizer, step_batches[:half], model_opts)
    saved = state_snapshot(optimizer)
    saved_weights = weights(model)
    if fmt != "torch":
        dist_checkpointing.save(checkpoint(model, optimizer, False, fmt), path)
    else:  # Megatron-LM's --ckpt-format torch: model, optimizer state dict, parameter state
        rank = torch.distributed.get_rank()
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                   os.path.join(path, f"rank{rank}.pt"))
        optimizer.save_parameter_state(os.path.join(path, f"param_state{rank}.pt"))
    del model, optimizer
    model, optimizer = build(name, opts, model_opts, seed=4321)  # other weights: load must win
    fresh_weights = weights(model)
    if fmt != "torch":
        state = dist_checkpointing.load(checkpoint(model, optimizer, True, fmt), path)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    else:  # the model first, as Megatron-LM loads it
        state = torch.load(os.path.join(path, f"rank{rank}.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        optimizer.load_parameter_state(os.path.join(path, f"param_state{rank}.pt"))
    loaded = state_snapshot(optimizer)
    loaded_weights = weights(model)
    rest = train(model, optimizer, step_batches[half:], model_opts)
    return {"losses": first + rest, "state_roundtrip_max_diff": snapshot_diff(saved, loaded),
            "state_tensors": sum(len(s) for s in saved),
            "fresh_weights_differ": not _equal(saved_weights, fresh_weights),
            "loaded_weights_equal": _equal(saved_weights, loaded_weights),
            "placement": placement(optimizer)}


def weights(model):
    return [p.detach().to("cpu", copy=True) for p in model.parameters()]


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def main(argv=None):
    opts = parse(sys.argv[1:] if argv is None else argv)
    model_opts = tiny_gpt.options(tp=opts.tp, steps=opts.steps, distributed_optimizer=True)
    tiny_gpt.init_parallel(model_opts)
    step_batches = list(tiny_gpt.rank_batches(model_opts))

    results = {}
    for name in [n for n in opts.runs.split(",") if n]:
        model, optimizer = build(name, opts, model_opts, seed=1234)
        events = count_copy_events(optimizer)
        losses = train(model, optimizer, step_batches, model_opts)
        results[name] = {"losses": losses, "placement": placement(optimizer),
                         "events": events, "state_dtypes": state_dtypes(optimizer)}
        del model, optimizer
    for spec in [n for n in opts.resume.split(",") if n]:
        name, fmt = spec.split(":")
        results[f"{name} resume {fmt}"] = resume(name, fmt, opts, model_opts, step_batches)

    if torch.distributed.get_rank() == 0:
        with open(opts.out, "w") as f:
            json.dump({"results": results, "world_size": torch.distributed.get_world_size(),
                       "tp": opts.tp, "bf16": opts.bf16}, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
