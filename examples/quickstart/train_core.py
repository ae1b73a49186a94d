"""The quickstart's megatron-core path: train the tiny Llama-style GPT on the prepared data
without a Megatron-LM checkout, save a checkpoint and resume from it.

    mmp run --standalone --nproc-per-node 2 train_core.py --data-path "$DATA_PATH" \\
        --tokenizer-model tok/ --tp 2 --iters 40 --save ckpt --save-at 20 --exit-interval 20
    mmp run ... train_core.py ... --load ckpt          # resumes at the saved iteration

This is not the stock ``pretrain_gpt.py``: it is megatron-core's own pieces put together by
hand (``GPTDataset`` through ``BlendedMegatronDatasetBuilder`` on the ``.bin/.idx`` pairs and
weights of ``DATA_PATH``, a Llama-style GPT on the local layer spec with the tokenizer's vocabulary,
DDP, the Megatron optimizer, the pipeline schedule, ``dist_checkpointing`` with
``--ckpt-format torch_dist``). It prints one line per iteration in the format of Megatron-LM's
training log, with tokens/s per device and MFU. ``--losses FILE`` writes {iteration: loss} so a
resumed run can be compared with an uninterrupted one.

Nothing but the standard library is imported at the top: a process that multiprocessing spawns
(dist_checkpointing's writer starts one on every rank) imports this file again as
``__mp_main__``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from types import SimpleNamespace



def parse(argv):
    p = argparse.ArgumentParser(prog="train_core.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-path", required=True, help="weighted prefixes (mmp data blend)")
    p.add_argument("--tokenizer-model", required=True, help="HuggingFace tokenizer directory")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=352, help="SwiGLU width (Llama: ~8/3 hidden)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--save", help="checkpoint directory")
    p.add_argument("--save-at", type=int, help="save after this iteration")
    p.add_argument("--exit-interval", type=int,
                   help="stop after this iteration (after its checkpoint), as Megatron-LM's flag")
    p.add_argument("--ckpt-format", choices=("torch_dist", "torch"), default="torch_dist",
                   help="torch_dist: megatron-core's dist_checkpointing; torch: one torch.save "
                        "file per rank (Megatron-LM's legacy format)")
    p.add_argument("--load", help="resume from this checkpoint directory")
    p.add_argument("--cache", help="dataset index cache directory")
    p.add_argument("--losses", help="rank 0 writes {iteration: loss} here")
    return p.parse_args(argv)


def startup_line(opts, vocab, world, device_name, peak, why=""):
    """The run's shape and the device peak that MFU divides by (``peak``: a ``Peak`` or None)."""
    from megatron_musa_patch.lib.metrics.figures import significant

    shown = (f"{significant(peak.tflops)} TFLOP/s ({peak.source})" if peak is not None
             else f"unknown ({why}), so no MFU")
    return (f"megatron-core path: {opts.layers} layers, hidden {opts.hidden}, vocab {vocab}, "
            f"TP{opts.tp} on {world} {device_name} ranks; device peak {shown}")


def build_tokenizer(model_dir):
    """What GPTDataset reads of the tokenizer (eod, the vocabulary size, and for its cache key
    ``unique_identifiers``): from the check that ``mmp data prepare`` recorded for this tokenizer
    when there is one (no transformers import: 3-5 s a rank here), else megatron-core's own
    builder."""
    from megatron_musa_patch.data import light, tokenizer

    parser = argparse.ArgumentParser()
    tokenizer.add_arguments(parser)
    args = parser.parse_args(["--tokenizer-type", "HuggingFaceTokenizer",
                              "--tokenizer-model", model_dir])
    ids = light.checked_ids(args)
    if ids is None:
        return tokenizer.build(args)
    return SimpleNamespace(eod=ids["eod"], vocab_size=ids["vocab_size"],
                           unique_identifiers={"tokenizer_check": ids["record"]})


def build_dataset(opts, tok, samples):
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    config = GPTDatasetConfig(
        random_seed=opts.seed, sequence_length=opts.seq, split="100,0,0",
        blend=get_blend_from_list(opts.data_path.split()), path_to_cache=opts.cache,
        tokenizer=tok, reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=True)
    train, _, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [samples, 0, 0], lambda: True, config).build()
    return train


def batches(dataset, opts, start_iteration, dp_rank, dp_size):
    """The global batch of each iteration from ``start_iteration + 1`` on: samples
    ``[it * gb, (it + 1) * gb)``, so a resumed run sees what the first run saw."""
    per_rank = opts.global_batch // dp_size
    for it in range(start_iteration, opts.iters):
        first = it * opts.global_batch + dp_rank * per_rank
        samples = [dataset[first + i] for i in range(per_rank)]
        yield it + 1, [_stack(samples[i:i + opts.micro_batch])
                       for i in range(0, per_rank, opts.micro_batch)]


def _stack(samples):
    import torch

    keys = ("tokens", "labels", "loss_mask", "position_ids")
    return {k: torch.stack([torch.as_tensor(s[k]) for s in samples]) for k in keys}


def forward_step(data_iterator, model, seq):
    import torch

    batch = {k: v.to("cuda") for k, v in next(data_iterator).items()}  # 'cuda': this device
    mask = torch.ones(1, 1, seq, seq, dtype=torch.bool, device="cuda").triu(1)
    output = model(batch["tokens"], batch["position_ids"], mask, labels=batch["labels"])
    loss_mask = batch["loss_mask"].float()

    def loss_func(output_tensor):
        loss = (output_tensor.float() * loss_mask).sum() / loss_mask.sum()
        return loss, {"lm loss": loss.detach().clone()}

    return output, loss_func


def build_model(opts, vocab):
    """A Llama-style GPT on the local spec: RMSNorm, SwiGLU, GQA, RoPE, no biases, fp32."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=opts.layers, hidden_size=opts.hidden, ffn_hidden_size=opts.ffn,
        num_attention_heads=opts.heads, num_query_groups=max(1, opts.heads // 2),
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        normalization="RMSNorm", add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, params_dtype=torch.float32,
        tensor_model_parallel_size=opts.tp, bias_dropout_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False)
    model = GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=vocab, max_sequence_length=opts.seq, pre_process=True, post_process=True,
        share_embeddings_and_output_weights=False, position_embedding_type="rope")
    return model, config


def checkpoint_state(model, optimizer, iteration, loading=False):
    model_sd = model.module.sharded_state_dict(prefix="")  # the GPTModel inside DDP
    return {"model": model_sd,
            "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=loading),
            "iteration": iteration}


def save(opts, model, optimizer, iteration, rank):
    import torch

    if rank == 0:
        os.makedirs(opts.save, exist_ok=True)  # dist_checkpointing wants it to exist
    torch.distributed.barrier()
    if opts.ckpt_format == "torch_dist":
        from megatron.core import dist_checkpointing

        dist_checkpointing.save(checkpoint_state(model, optimizer, iteration), opts.save)
    else:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "iteration": iteration}, os.path.join(opts.save, f"rank{rank:05d}.pt"))
    torch.distributed.barrier()


def load(opts, model, optimizer, rank) -> int:
    """Restores the model and optimizer from ``--load``; returns the saved iteration."""
    import torch

    if opts.ckpt_format == "torch_dist":
        from megatron.core import dist_checkpointing

        state = dist_checkpointing.load(checkpoint_state(model, optimizer, 0, loading=True),
                                        opts.load)
    else:
        path = os.path.join(opts.load, f"rank{rank:05d}.pt")
        if not os.path.isfile(path):
            raise SystemExit(f"train_core.py: --load {opts.load} has no {os.path.basename(path)}"
                             f" (saved with another --ckpt-format, or by another world size?)")
        state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["iteration"])


def main(argv=None):
    opts = parse(sys.argv[1:] if argv is None else argv)
    import megatron_musa_patch  # noqa: F401 - activates before Megatron is imported
    import torch
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from megatron_musa_patch import active_session
    from megatron_musa_patch.features.logs.throughput import throughput_fields
    from megatron_musa_patch.lib.metrics.peak_flops import lookup, measure_matmul

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.distributed.init_process_group(backend="nccl")  # the device's backend
    parallel_state.initialize_model_parallel(opts.tp, 1)
    torch.manual_seed(opts.seed)
    model_parallel_cuda_manual_seed(opts.seed)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()

    tok = build_tokenizer(opts.tokenizer_model)
    multiple = 128 * opts.tp  # Megatron-LM's --make-vocab-size-divisible-by x TP
    vocab = -(-tok.vocab_size // multiple) * multiple
    model, config = build_model(opts, vocab)
    model = DistributedDataParallel(config, DistributedDataParallelConfig(grad_reduce_in_fp32=True),
                                    model.to("cuda"))
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=opts.lr, weight_decay=0.01, clip_grad=1.0), [model])
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    config.no_sync_func = model.no_sync

    start = 0
    if opts.load:
        start = load(opts, model, optimizer, rank)
        if rank == 0:
            print(f"loaded checkpoint {opts.load} at iteration {start}", flush=True)

    dataset = build_dataset(opts, tok, opts.iters * opts.global_batch)
    # what pretrain_gpt's args would say, for the FLOPs count and the log fields
    margs = SimpleNamespace(
        num_layers=opts.layers, hidden_size=opts.hidden, ffn_hidden_size=config.ffn_hidden_size,
        num_attention_heads=opts.heads, group_query_attention=True,
        num_query_groups=config.num_query_groups, kv_channels=config.kv_channels,
        seq_length=opts.seq, padded_vocab_size=vocab, swiglu=True, world_size=world)
    device = active_session().device
    if device.name == "cpu":
        torch.distributed.barrier()
        peak, why = measure_matmul("fp32"), ""
    else:
        peak, why = lookup(torch.cuda.get_device_properties(0).name, "fp32")
    if rank == 0:
        print(startup_line(opts, vocab, world, device.name, peak, why), flush=True)

    dp_rank = parallel_state.get_data_parallel_rank()
    dp_size = parallel_state.get_data_parallel_world_size()
    forward_backward = get_forward_backward_func()
    losses = {}
    for iteration, micro in batches(dataset, opts, start, dp_rank, dp_size):
        begin = time.perf_counter()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        reduced = forward_backward(
            forward_step_func=partial(forward_step, seq=opts.seq), data_iterator=iter(micro),
            model=model, num_microbatches=len(micro), seq_length=opts.seq,
            micro_batch_size=opts.micro_batch, forward_only=False)
        ok, grad_norm, _ = optimizer.step()
        assert ok, "optimizer step was skipped"
        loss = torch.stack([r["lm loss"] for r in reduced]).mean().reshape(1)
        torch.distributed.all_reduce(loss, group=parallel_state.get_data_parallel_group())
        loss = float(loss.item()) / dp_size
        elapsed = time.perf_counter() - begin
        losses[iteration] = loss
        if rank == 0:
            fields = throughput_fields(margs, opts.global_batch, elapsed, peak)
            print(f" iteration {iteration:8d}/{opts.iters:8d} | elapsed time per iteration (ms):"
                  f" {elapsed * 1000:.1f} |{fields} global batch size: {opts.global_batch:5d} |"
                  f" lm loss: {loss:.6E} | grad norm: {grad_norm:.3f} |", flush=True)
        if opts.save and iteration == opts.save_at:
            begin = time.perf_counter()
            save(opts, model, optimizer, iteration, rank)
            if rank == 0:
                print(f"saved checkpoint {opts.save} at iteration {iteration} "
                      f"({opts.ckpt_format}, {time.perf_counter() - begin:.1f} s)", flush=True)
        if iteration == opts.exit_interval:
            break

    if rank == 0 and opts.losses:
        with open(opts.losses, "w") as f:
            json.dump(losses, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
