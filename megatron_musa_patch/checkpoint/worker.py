"""The Megatron side of a conversion, run on each rank of a layout under ``mmp run``.

It builds the model exactly as stock ``pretrain_gpt.py`` does -- Megatron's own argument parsing
and initialisation, the checkout's ``model_provider`` with ``gpt_builder`` -- and moves weights
only through Megatron's own ``load_checkpoint`` / ``save_checkpoint``, so the checkpoint is one
stock ``pretrain_gpt.py`` writes and loads, in either format and any layout, on every release:

* ``fill``: any layout: each rank's part of the model from a Hugging Face directory (one tensor
  at a time, the rank's piece of it, the embedding padded to Megatron's vocabulary), then saved;
* ``reshard``: any layout: loaded (a ``torch_dist`` checkpoint reshards itself on load) and saved
  again in the format asked for;
* ``dump``: one rank: loaded, then every tensor handed to the Hugging Face writer.

    python -c "$ENTRY" --mode fill|reshard|dump --plan PLAN.json -- <Megatron flags>

(``ENTRY`` below: ``run`` with the garbage collector off while torch and megatron-core import)
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from .plan import Plan


def megatron_model(argv):
    """Initialise Megatron with ``argv`` (its flags) and build the model as pretrain_gpt.py
    does; returns (args, [model chunks])."""
    import inspect

    sys.argv = ["pretrain_gpt.py", *argv]
    if _flag(argv, "--tokenizer-type") == "NullTokenizer":
        _without_transformers()
    from megatron.core.enums import ModelType
    from megatron.training import get_args
    from megatron.training.initialize import initialize_megatron
    from megatron.training.training import get_model

    # pretrain_gpt.py's defaults; up to 0.18 initialize_megatron parses the arguments, from 0.19
    # pretrain_gpt.py parses them first (parse_and_validate_args) and hands over the result
    defaults = {"tokenizer_type": "GPT2BPETokenizer"}
    if "args_defaults" in inspect.signature(initialize_megatron).parameters:
        initialize_megatron(args_defaults=defaults)
    else:
        from megatron.training.arguments import parse_and_validate_args

        parse_and_validate_args(args_defaults=defaults)
        initialize_megatron()
    args = get_args()
    # every mode fills or loads every weight: drawing random ones first is wasted work (a third
    # of a 1B import); core_transformer_config_from_args hands it to the model's config
    args.perform_initialization = False
    from gpt_builders import gpt_builder  # the checkout's, as pretrain_gpt.py imports them
    from model_provider import model_provider

    model = get_model(functools.partial(model_provider, gpt_builder),
                      ModelType.encoder_or_decoder, wrap_with_ddp=False)
    return args, model


def _flag(argv, name: str):
    """The value of Megatron flag ``name`` in ``argv`` (the last one given), None without it."""
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == name]
    return values[-1] if values else None


def _without_transformers() -> None:
    """transformers kept out of this process. From 0.19, megatron-core builds even a
    NullTokenizer through its tokenizer package, whose Hugging Face tokenizer imports
    transformers when it is installed: a large share of a conversion's start-up
    (docs/benchmarks.md, checkpoint conversion), for a library a conversion with the NullTokenizer never calls (the conversion reads and
    writes safetensors itself). ``None`` in ``sys.modules`` makes its import fail as when it is
    not installed (Python's documented way), which megatron-core handles (``HAVE_TRANSFORMERS``)."""
    if "transformers" not in sys.modules:
        sys.modules["transformers"] = None


def fill(plan: Plan, model) -> None:
    """Copy this rank's pieces of the Hugging Face tensors into its part of the model, one
    tensor at a time, reading only the tensors it holds a piece of; each safetensors file is
    unmapped once its last such tensor is read, so a rank holds its part of the model and at
    most about one file's pages besides."""
    import torch

    from . import families, shards
    from .families.rows import COLUMN, Copy, Rename
    from .families.table import Bound
    from .hf import HFCheckpoint
    from .progress import bar

    source = HFCheckpoint(plan.hf_dir)
    config = source.config
    family = families.family_of(config)
    chunk = shards.unwrapped(model[0])
    state = {k: v for k, v in chunk.state_dict(keep_vars=True).items()
             if isinstance(v, torch.Tensor)}
    local = {whole: name for name, whole in shards.global_names(chunk).items()}
    wanted: list = []
    elsewhere = set()  # what other ranks hold, or none
    for pair in family.mappings(config):
        held = resolve(pair.megatron, local)
        if isinstance(pair.row, Copy):
            if _checks_copies():
                wanted.append(pair)
        elif held in local:
            wanted.append(Bound(held, pair.hf, pair.row))
        else:
            elsewhere.add(pair.megatron)
    nowhere = sorted(_held_by_no_rank(elsewhere))
    if nowhere:
        raise SystemExit(f"mmp checkpoint: the Megatron model has no {', '.join(nowhere[:3])} "
                         f"(the mapping and the model's flags disagree)")
    if families.tied(config) and families.OUTPUT in local:  # the last stage's copy (PP > 1)
        wanted.append(Bound(families.OUTPUT, ("model.embed_tokens.weight",),
                            Rename("", "", COLUMN)))
    # the copies compared first: a checkpoint that cannot be held is refused before filling
    wanted.sort(key=lambda pair: not isinstance(pair.row, Copy))
    get = source.reading([n for pair in wanted for n in pair.hf] +
                         [pair.row.same_as for pair in wanted if isinstance(pair.row, Copy)])
    seen = set()
    with bar(total=len(wanted), desc="import-hf", unit="tensor") as progress:
        for pair, whole in family.converted(config, _counted(wanted, progress), get):
            name = local[pair.megatron]
            target = state[name]
            tensor = shards.piece(pair.megatron, whole, target.shape, pair.row,
                                  vocabulary=pair.megatron in (families.EMBEDDING,
                                                               families.OUTPUT))
            if tuple(tensor.shape) != tuple(target.shape):
                raise SystemExit(f"mmp checkpoint: {pair.megatron}: Hugging Face gives "
                                 f"{tuple(whole.shape)}, this rank's piece of which is "
                                 f"{tuple(tensor.shape)}; the Megatron model holds "
                                 f"{tuple(target.shape)}")
            with torch.no_grad():  # into the model's own memory: the file can then be unmapped
                target.copy_(tensor)
            del whole, tensor
            seen.add(name)
    missing = sorted(set(state) - seen)
    if missing:
        raise SystemExit(f"mmp checkpoint: the mapping left Megatron tensors unfilled: "
                         f"{', '.join(missing[:5])}")


def _counted(items, progress):
    """``items``, each counted on ``progress`` as it is taken."""
    for item in items:
        progress.update(1)
        yield item


def _held_by_no_rank(elsewhere: set) -> set:
    """Of the names this rank does not hold, those no rank holds."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return elsewhere
    each = [None] * dist.get_world_size()
    dist.all_gather_object(each, elsewhere)
    return set.intersection(*each)


def _checks_copies() -> bool:
    """The rank that compares the Hugging Face copies of a tensor (one rank does)."""
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


#: a module megatron-core renamed: (the mapping's name, the later release's)
RENAMED = (("mtp.layers.", ".transformer_layer.", ".mtp_model_layer."),)  # MTP's layer, 0.19


def resolve(name: str, present) -> str:
    """The mapping's name of a tensor as this release's model calls it."""
    if name in present:
        return name
    for scope, old, new in RENAMED:
        if name.startswith(scope) and old in name and name.replace(old, new, 1) in present:
            return name.replace(old, new, 1)
    return name


def dump(plan: Plan, model) -> None:
    """Every tensor of the one-rank model, mapped to Hugging Face names, into the writer."""
    import torch

    from . import families
    from .errors import ConversionError
    from .hf import HFWriter
    from .progress import bar

    config = plan.hf_config
    state = {k: v for k, v in model[0].state_dict().items() if isinstance(v, torch.Tensor)}
    rows = int(config["vocab_size"])

    def held(name):
        """(this release's name, the model's tensor without Megatron's vocabulary padding)"""
        name = resolve(name, state)
        tensor = state[name]
        if name in (families.EMBEDDING, families.OUTPUT):
            tensor = tensor[:rows]
        return name, tensor

    def get(name):
        name, tensor = held(name)
        if name.endswith("router.expert_bias"):  # kept in float32 on both sides
            return tensor.detach().to(torch.float32)
        return tensor.detach().to(getattr(torch, plan.dtype))

    used = set()

    def shape_only(name):
        name, tensor = held(name)
        used.add(name)
        return torch.empty(tensor.shape, device="meta")

    # the count, and what the mapping asks for, from the mapping over shapes alone (tensors on
    # the meta device), before anything is written
    expected = sum(1 for _ in families.to_hf(config, shape_only))
    left = unexported(state, used)
    if left:
        raise ConversionError(
            f"mmp checkpoint export-hf: the checkpoint's model holds {len(left)} tensor(s) the "
            f"{config.get('architectures', ['?'])[0]} mapping has no Hugging Face name for: "
            f"{', '.join(left[:5])}{' ...' if len(left) > 5 else ''}. Exported without them, "
            f"the Hugging Face model would not compute what the Megatron one does. They come "
            f"from flags the checkpoint was trained with that this Hugging Face architecture "
            f"has no weights for (the args stored in the checkpoint name them, e.g. "
            f"--qk-layernorm on a family without query/key norms): train without them, or "
            f"export to a family that has them. Nothing was written.")
    writer = HFWriter(plan.hf_out, max_shard_bytes=plan.max_shard_bytes, tmp=plan.hf_tmp)
    try:
        handed: dict = {}
        with bar(total=expected, desc="export-hf", unit="tensor") as progress:
            for name, tensor in families.to_hf(config, get):
                writer.add(name, _own_storage(tensor, handed))
                progress.update(1)
        writer.finish(config, [Path(p) for p in plan.side_files])
    except BaseException:
        writer.abandon()
        raise


def _without_crc32() -> None:
    """torch.save (which writes every record of either format) computes a CRC32 over each
    tensor's bytes, a good part of a large save, and torch.load never checks it
    (torch documents loading such files; a corrupted record loads alike with or without)."""
    import torch

    if hasattr(torch.serialization, "set_crc32_options"):
        torch.serialization.set_crc32_options(False)


#: threads a rank saving a whole model alone writes its torch_dist files with: megatron-core
#: 0.16's default; from 0.17 the default is one (two files written at once, with
#: upstream_fixes.writer_threads_together, save faster: docs/benchmarks.md)
WRITER_THREADS = 2


def _save_context(args):
    """The ``checkpointing_context`` of the step's save: for a ``torch_dist`` checkpoint saved by
    one rank, megatron-core's default strategy with ``WRITER_THREADS`` where its default has
    fewer; otherwise None, Megatron's own choice (several ranks already write side by side, and
    keep the strategy Megatron makes for them, split over the data-parallel ranks)."""
    import torch.distributed as dist

    if args.ckpt_format != "torch_dist" or (dist.is_initialized() and dist.get_world_size() > 1):
        return None
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    strategy = get_default_save_sharded_strategy("torch_dist")
    if strategy.thread_count >= WRITER_THREADS:
        return None
    strategy.thread_count = WRITER_THREADS
    return {"save_strategy": strategy}


def unexported(state: dict, used: set) -> list:
    """The model's tensors the export mapping did not ask for (a tensor it does not know would
    otherwise be dropped without a word); the output layer of a model that ties it to the
    embedding is none of them (it is not in the state)."""
    return sorted(name for name in state if name not in used)


def _own_storage(tensor, handed: dict):
    """``tensor`` as the writer may take it, copied only where it must be: where it is not
    contiguous (q, k and v of the fused QKV, interleaved by group) or where its bytes overlap a
    tensor already handed out (the MTP layers' copies of the embedding and output head are the
    model's own): safetensors refuses tensors whose memory overlaps. Contiguous pieces of one
    buffer that do not overlap (gate and up of the fused fc1, nearly half of a 1B Llama's bytes;
    the embedding without Megatron's padding rows) are written from where they lie, as
    safetensors allows, not copied first. ``handed``: each storage's byte ranges given out (a
    copy's own memory is nobody else's: it is not kept)."""
    import torch

    first = tensor.storage_offset() * tensor.element_size()
    last = first + tensor.numel() * tensor.element_size()
    taken = handed.setdefault(tensor.untyped_storage().data_ptr(), [])
    if tensor.is_contiguous() and not any(begin < last and first < end for begin, end in taken):
        taken.append((first, last))
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


#: the worker's entry, what ``mmp checkpoint`` runs with ``python -c`` (see ``run``). Python's
#: cyclic garbage collector is off from its first line: importing torch and megatron-core makes
#: a great many objects, and the collections they set off took a noticeable share of the
#: start-up; ``main`` turns it on again once the model is built
ENTRY = "import gc; gc.disable(); from megatron_musa_patch.checkpoint.worker import run; run()"


def _collect_from_here() -> None:
    """Garbage collection on again, for what the conversion makes; what start-up made stays out
    of every collection (frozen: it lives as long as the process)."""
    import gc

    gc.freeze()
    gc.enable()


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, megatron_argv = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    parser = argparse.ArgumentParser(prog="megatron_musa_patch.checkpoint.worker")
    parser.add_argument("--mode", choices=("fill", "reshard", "dump"), required=True)
    parser.add_argument("--plan", required=True, help="JSON written by mmp checkpoint")
    opts = parser.parse_args(own)
    plan = Plan.read(opts.plan)
    args, model = megatron_model(megatron_argv)
    _collect_from_here()
    from megatron.training.checkpointing import load_checkpoint, save_checkpoint

    if opts.mode == "fill":
        fill(plan, model)
    else:
        load_checkpoint(model, None, None, strict=True)
    if opts.mode == "dump":
        dump(plan, model)
        return 0
    # saved in the format asked for, which may not be the one loaded (as upstream's
    # --ckpt-convert-format does it)
    args.ckpt_format = plan.save_format or args.ckpt_format
    args.use_dist_ckpt = args.ckpt_format != "torch"
    _without_crc32()
    save_checkpoint(0, model, None, None, 0, checkpointing_context=_save_context(args))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    return 0


def run() -> None:
    """The entry ``mmp checkpoint`` starts (``ENTRY``): ``python -c`` with it, not ``-m`` with
    the module: a process started with ``spawn`` imports the parent's main module again, and
    this one would bring the package, torch and megatron-core with it (seconds) for a helper that
    needs none of them (Megatron's checkpoint writer spawns one where the feature
    ``startup.forked_write_queue`` is switched off)."""
    from megatron_musa_patch.base.errors import MegatronMusaPatchError

    try:
        code = main()
    except MegatronMusaPatchError as exc:  # a refusal found while filling: one paragraph
        print(exc.render(prog="mmp checkpoint"), file=sys.stderr)
        code = exc.exit_code
    _leave(code)


def _leave(code: int) -> None:
    """The process ends here, without the interpreter's shutdown: it would collect and free every
    object torch and megatron-core made and run their exit handlers for nothing a conversion
    needs. Every file it wrote is closed by now (the
    checkpoint's also synced, by Megatron's writer), so the kernel holds all of it; what is left
    is the output in Python's buffers, flushed here, and the helper processes it started, ended
    here: Megatron's writer spawns its results manager where ``startup.forked_write_queue`` forked none
    (a step that saves another format than the one it loads), and that manager, which the
    shutdown would have stopped, would outlive the step holding its output open. The ranks of a
    layout have passed their last barrier."""
    import multiprocessing
    import os

    for child in multiprocessing.active_children():
        child.kill()  # SIGKILL: none of the layer's signal handlers runs in it
        child.join()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
