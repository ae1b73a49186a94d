"""The two conversions of ``mmp checkpoint``: what is checked before anything is written (the
layout against the model's sizes, a config against the checkpoint's args), the flags each step
builds the model with (the vocabulary's included), and the worker steps, run as subprocesses on
CPU ranks into a temporary directory that is renamed at the end."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from megatron_musa_patch.base.env_names import AUTOACTIVATE_ENV, DEVICE_ENV
from megatron_musa_patch.upstream.checkpoint_files import (COMMON_STATE, DIST_METADATA,
                                                           RANK_STATE, TRACKER)

from . import processes, saved_args
from .errors import ConversionError
from .hf import check_new_dir, config_dtype, publish, tmp_prefix
from .plan import Layout, Plan
from .worker import ENTRY

FLAGS_FILE = "model_flags.txt"
REFERENCE = "hf_reference"
PLAN_FILE = "plan.json"
FORMATS = ("torch_dist", "torch")
#: the --seq-length model_flags.txt gives at most (a Hugging Face config carries none; the
#: model's whole context is rarely what a first run trains at)
SEQ_LENGTH_CAP = 4096


class StepFailed(Exception):
    """A worker step ended with a non-zero status (its own output said why)."""


# ----------------------------------------------------------------------------- import


def import_hf(hf_dir, save, layout: Layout, ckpt_format: str) -> None:
    """The Hugging Face directory ``hf_dir`` into the new checkpoint directory ``save``."""
    from . import families
    from .hf import HFCheckpoint

    source = HFCheckpoint(hf_dir)
    family = families.family_of(source.config)
    family.check(source.config)
    check_layout(source.config, family, layout)
    target = _new_dir(save, "--save")
    lm = _lm_path()
    vocabulary, note = _vocabulary_flags(source, layout.tp)
    flags = family.flags(source.config) + vocabulary
    step_flags = flags + _dtype_flags(source.config) + _fixed(source.config)
    # what the checkpoint's model flags name is its own copy of the tokenizer (the source
    # directory may go), and a sequence length (pretrain_gpt.py needs one)
    kept = [str(target / REFERENCE) if f == str(source.path.resolve()) else f for f in flags]
    sequence = _seq_length(source.config)
    plan = Plan(hf_dir=str(source.path))
    work = Path(tempfile.mkdtemp(prefix=tmp_prefix(target), dir=target.parent))
    try:
        final = work / "checkpoint"
        # each rank of the layout fills its own part from the Hugging Face files and saves it,
        # so no process holds more than its share (a torch_dist checkpoint reshards itself on
        # load: any layout's serves every layout; the torch format is the layout's own)
        run_step("fill", layout.ranks, plan, work, step_flags + layout.flags() +
                 ["--save", str(final), "--ckpt-format", ckpt_format], lm)
        (final / FLAGS_FILE).write_text(_flags_text(
            kept + ["--seq-length", str(sequence)], ckpt_format))
        reference = final / REFERENCE
        reference.mkdir()
        for path in source.side_files():
            shutil.copy2(path, reference / path.name)
        (reference / "config.json").write_text(json.dumps(source.config, indent=2) + "\n")
        if target.exists():
            target.rmdir()
        os.replace(final, target)
    finally:
        with processes.uninterrupted():
            shutil.rmtree(work, ignore_errors=True)
    print(f"mmp checkpoint: {source.path} -> {target} ({family.model_type}, {ckpt_format}, "
          f"{layout}). Its model flags ({target / FLAGS_FILE}):")
    print((target / FLAGS_FILE).read_text(), end="")
    positions = int(source.config.get("max_position_embeddings") or sequence)
    whence = "max_position_embeddings" if positions == sequence else \
        f"max_position_embeddings {positions}, capped at {SEQ_LENGTH_CAP}"
    print(f"(--seq-length {sequence}, which a Hugging Face config does not carry, is the "
          f"config's {whence}; a --seq-length after these flags wins.)")
    if note:
        print(note)
    if layout.tp > 1 and "--num-experts" in flags:
        print("(Megatron trains a MoE model with tensor parallelism only with "
              "--sequence-parallel: add it to the training flags.)")


def check_layout(config: dict, family, layout: Layout) -> None:
    """The layout splits this model the way Megatron needs (it would otherwise stop only when
    the checkpoint is first loaded)."""
    d = family.dims(config)
    experts = family.experts(config)
    rules = [("tensor", layout.tp, "num_attention_heads", d["heads"]),
             ("tensor", layout.tp, "num_key_value_heads", d["groups"]),
             ("tensor", layout.tp, "intermediate_size", int(config["intermediate_size"])),
             ("pipeline", layout.pp, "num_hidden_layers", d["layers"])]
    if experts:
        rules.append(("expert", layout.ep, "routed experts", experts))
    elif layout.ep > 1:
        raise ConversionError(
            f"--expert-model-parallel-size {layout.ep}: this model "
            f"({config['architectures'][0]}) has no experts. Leave it at 1.")
    for kind, size, field, value in rules:
        if value % size:
            raise ConversionError(
                f"--{kind}-model-parallel-size {size} does not divide the model's "
                f"{field} ({value}): Megatron splits it evenly across those ranks. Choose a "
                f"size that divides {value}. Nothing was written.")


def _seq_length(config: dict) -> int:
    return min(int(config.get("max_position_embeddings") or SEQ_LENGTH_CAP), SEQ_LENGTH_CAP)


def _vocabulary_flags(source, tp: int):
    """The tokenizer (the directory's own, or none) and a padding divisor that makes Megatron's
    padded vocabulary the checkpoint's rows exactly, at this tensor-parallel size; and a note
    for the summary where the directory's tokenizer could not be used."""
    rows = int(source.config["vocab_size"])
    note = ""
    if (source.path / "tokenizer.json").is_file() or (source.path / "tokenizer.model").is_file():
        size = _tokenizer_size(source.path)
        if size is not None:
            tokenizer = ["--tokenizer-type", "HuggingFaceTokenizer",
                         "--tokenizer-model", str(source.path.resolve())]
            return tokenizer + ["--make-vocab-size-divisible-by",
                                str(vocab_divisor(rows, size, tp))], note
        note = ("(The directory's tokenizer does not load without its own code "
                "(trust_remote_code), which Megatron's HuggingFaceTokenizer does not run: the "
                "flags name the NullTokenizer. Give your tokenizer's --tokenizer-type and "
                "--tokenizer-model after them.)")
    # NullTokenizer --vocab-size N has N + 1 tokens up to 0.18 (the legacy tokenizer adds the
    # end of document) and N from 0.19: the divisor is chosen to pad either to the rows
    tokenizer = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(rows - 1)]
    return tokenizer + ["--make-vocab-size-divisible-by",
                        str(vocab_divisor(rows, rows - 1, tp))], note


def vocab_divisor(rows: int, size: int, tp: int) -> int:
    """``--make-vocab-size-divisible-by`` for a checkpoint of ``rows`` embedding rows and a
    tokenizer of ``size`` tokens: Megatron pads ``size`` up to a multiple of divisor * tp, which
    is ``rows`` for every tensor-parallel size from 1 (the import's fill) to ``tp`` when divisor
    * tp divides ``rows`` and the divisor is above ``rows - size``. The divisor that keeps the
    most tensor-parallel sizes (powers of two up to 8) is preferred."""
    for ways in (8, 4, 2, 1):
        if rows % ways == 0 and ways % tp == 0 and size > rows - rows // ways:
            return rows // ways
    return 128  # Megatron's default: the padded vocabulary gets zero rows beyond the model's


def _tokenizer_size(path: Path) -> Optional[int]:
    """The directory's tokenizer's size; None where it loads only with its own code."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConversionError(
            f"--hf-dir {path} has a tokenizer, and reading its size needs transformers "
            f"({exc}); pip install 'megatron-musa-patch[data]'.") from exc
    try:
        # never its own code, and never a question on the terminal about running it
        return len(AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                                 trust_remote_code=False))
    except (ValueError, OSError, ImportError) as exc:
        if any(path.glob("tokenization_*.py")):  # its own code (Kimi's tiktoken tokenizer)
            return None
        raise ConversionError(f"--hf-dir {path}: its tokenizer does not load ({exc}). Fix or "
                              f"remove its tokenizer files. Nothing was written.") from None


def _dtype_flags(config: dict) -> List[str]:
    dtype = config_dtype(config)
    return {"bfloat16": ["--bf16"], "float16": ["--fp16"]}.get(dtype, [])


def _fixed(config: dict) -> List[str]:
    """What Megatron's argument checks need beyond the model, and what a conversion must not
    do (build an optimizer state, draw data)."""
    sequence = min(int(config.get("max_position_embeddings", 128)), 128)
    return ["--micro-batch-size", "1", "--seq-length", str(sequence), "--train-iters", "1",
            "--lr", "0", "--save-interval", "1", "--no-save-optim", "--no-save-rng", "--mock-data",
            "--distributed-backend", "gloo", "--use-cpu-initialization"]


def _flags_text(flags: List[str], ckpt_format: str) -> str:
    lines, i = [], 0
    while i < len(flags):
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            lines.append(f"{flags[i]} {flags[i + 1]}")
            i += 2
        else:
            lines.append(flags[i])
            i += 1
    lines += [f"--ckpt-format {ckpt_format}"]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- export


def export_hf(load, hf_dir, hf_config: Optional[str], max_shard_size: float) -> None:
    """The checkpoint directory ``load`` into the new Hugging Face directory ``hf_dir``, with the
    config ``hf_config`` names (else the one import-hf kept, else one made from the checkpoint's
    args) and safetensors files of at most ``max_shard_size`` GB."""
    from . import families

    load = Path(load)
    args = checkpoint_args(load)
    reference = _reference(load, args)
    config = _export_config(hf_config, reference, args)
    family = families.family_of(config)
    family.check(config)
    _check_built_alike(family, args)
    target = Path(hf_dir).resolve()
    check_new_dir(target, "--hf-dir")
    lm = _lm_path()
    layout = Layout.from_args(args)
    dtype = config_dtype(config)
    target.parent.mkdir(parents=True, exist_ok=True)
    written = Path(tempfile.mkdtemp(prefix=tmp_prefix(target), dir=target.parent))
    plan = Plan(hf_config=config, hf_out=str(target), hf_tmp=str(written),
                side_files=tuple(str(p) for p in _reference_side_files(reference)), dtype=dtype,
                max_shard_bytes=int(max_shard_size * (1 << 30)))
    work = Path(tempfile.mkdtemp(prefix=".mmp-export-", dir=target.parent))
    try:
        # the model flags made from the config as import-hf makes them, so the two directions
        # agree; the vocabulary exactly the checkpoint's padded one, whatever tokenizer it had
        common = family.flags(config) + _dtype_flags(config) + [
            "--no-load-optim", "--no-load-rng", "--finetune"] + _fixed(
            {"max_position_embeddings": args.max_position_embeddings})
        source = load
        if _format(load) == "torch" and layout != Layout():
            source = work / "layout_free"
            run_step("reshard", layout.ranks, dataclasses.replace(plan, save_format="torch_dist"),
                     work, common + _export_vocabulary(args.padded_vocab_size, layout.tp) +
                     layout.flags() +
                     ["--load", str(load), "--save", str(source), "--ckpt-format", "torch"], lm)
        run_step("dump", 1, plan, work, common + _export_vocabulary(args.padded_vocab_size, 1) +
                 Layout().flags() + ["--load", str(source), "--ckpt-format", _format(source)], lm)
        with processes.uninterrupted():  # the step wrote it; in place here, or not at all
            publish(written, target)
    finally:
        with processes.uninterrupted():
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(written, ignore_errors=True)  # renamed into place when it finished
    print(f"mmp checkpoint: {load} -> {target} ({config['architectures'][0]}, {dtype})")


def _check_built_alike(family, args) -> None:
    """A checkpoint whose network the installed megatron-core builds otherwise than the family's
    flags would (a family's ``check_built_alike``) is refused before anything is loaded."""
    if family.built_alike is not None:
        from megatron_musa_patch.upstream import installed

        family.check_built_alike(args, installed.megatron_core_version())


def _export_vocabulary(padded: int, tp: int) -> List[str]:
    """Exactly the checkpoint's padded vocabulary, whatever tokenizer it was trained with: a
    NullTokenizer of padded - 1 (0.19) or padded (up to 0.18, which adds the end of document)
    tokens, padded to a multiple of ``padded`` at this tensor-parallel size."""
    return ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(padded - 1),
            "--make-vocab-size-divisible-by", str(padded // tp)]


def checkpoint_args(load: Path):
    """The args stock pretrain_gpt.py stored in the checkpoint (either format): their plain
    values read from the pickle alone (``saved_args``), else through torch.load or
    megatron-core."""
    directory = _iteration_dir(load)
    if (directory / DIST_METADATA).is_file():  # torch_dist
        args = saved_args.read_torch_dist(directory)
        if args is not None:
            return args
        if (directory / COMMON_STATE).is_file():  # up to 0.18
            return _torch_loaded_args(directory / COMMON_STATE)
        from megatron.core.dist_checkpointing import load_common_state_dict  # 0.19: inside

        return load_common_state_dict(str(directory))["args"]
    files = sorted(directory.glob(f"mp_rank_*/{RANK_STATE}"))
    if not files:
        raise ConversionError(
            f"--load {load}: {directory} holds neither a torch_dist ({DIST_METADATA}) nor a "
            f"torch (mp_rank_*/{RANK_STATE}) checkpoint.")
    return saved_args.read(files[0]) or _torch_loaded_args(files[0])


def _torch_loaded_args(path: Path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["args"]


def _iteration_dir(load: Path) -> Path:
    tracker = load / TRACKER
    if not tracker.is_file():
        raise ConversionError(f"--load {load}: no {TRACKER} there (not a Megatron checkpoint "
                              f"directory, or one whose first save did not finish).")
    text = tracker.read_text(errors="replace").strip()
    if text != "release" and not text.isdigit():
        raise ConversionError(
            f"--load {load}: {TRACKER} holds {text[:40]!r}, not an iteration number or "
            f"'release' (a garbled or hand-edited file?). Write the iteration of the checkpoint "
            f"to load into it (the iter_* directories are the ones saved). Nothing was written.")
    name = "release" if text == "release" else f"iter_{int(text):07d}"
    directory = load / name
    if not directory.is_dir():
        raise ConversionError(f"--load {load}: {TRACKER} names iteration {text}, and {name} is "
                              f"not there. Nothing was written.")
    return directory


def _format(load: Path) -> str:
    return "torch_dist" if (_iteration_dir(load) / DIST_METADATA).is_file() else "torch"


def _export_config(hf_config: Optional[str], reference: Optional[Path], args) -> dict:
    from . import families
    from .hf import read_config

    if hf_config:
        config = read_config(hf_config)
        if config is None:
            raise ConversionError(f"--hf-config {hf_config}: no config.json there.")
    elif reference is not None:
        config = read_config(reference)
    else:
        base = {"vocab_size": int(args.padded_vocab_size),
                "dtype": "bfloat16" if args.bf16 else ("float16" if args.fp16 else "float32")}
        config = families.family_from_args(args).config_from_args(args, base)
    _check_against_args(config, args)
    return config


def _check_against_args(config: dict, args) -> None:
    pairs = {"num_hidden_layers": args.num_layers, "hidden_size": args.hidden_size,
             "num_attention_heads": args.num_attention_heads}
    wrong = {k: (config.get(k), v) for k, v in pairs.items() if config.get(k) != v}
    if wrong or int(config["vocab_size"]) > int(args.padded_vocab_size):
        raise ConversionError(
            f"the config does not describe the checkpoint's model (config vs checkpoint: "
            f"{wrong or {'vocab_size': (config['vocab_size'], args.padded_vocab_size)}}). Give "
            f"the config of this model with --hf-config, or none to make one from the "
            f"checkpoint's args.")


def _reference(load: Path, args) -> Optional[Path]:
    """What import-hf kept of the original model: in the checkpoint, or in the one a training
    run started from (its ``--load``, as the args stored by its saves say)."""
    for where in (load, Path(getattr(args, "load", None) or load)):
        if (where / REFERENCE / "config.json").is_file():
            return where / REFERENCE
    return None


def _reference_side_files(reference: Optional[Path]):
    return [p for p in sorted(reference.iterdir()) if p.name != "config.json"] \
        if reference is not None else []


# ----------------------------------------------------------------------------- running


def _new_dir(path, flag: str) -> Path:
    target = Path(path).resolve()
    check_new_dir(target, flag)
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def _lm_path() -> Path:
    value = os.environ.get("MEGATRON_LM_PATH")
    if not value or not (Path(value) / "gpt_builders.py").is_file():
        raise ConversionError(
            f"mmp checkpoint builds the model as stock pretrain_gpt.py does, from a Megatron-LM "
            f"checkout: set MEGATRON_LM_PATH to one of the tag that matches your megatron-core "
            f"(now {value or 'unset'}; it needs gpt_builders.py and model_provider.py).")
    return Path(value)


def run_step(mode: str, ranks: int, plan: Plan, work: Path, flags: List[str], lm: Path) -> None:
    """One worker step on ``ranks`` CPU ranks, reading ``plan`` (written into ``work`` for it)
    and building the model with ``flags`` (Megatron's; ``--ckpt-format`` the format loaded)."""
    plan_file = work / PLAN_FILE
    plan.write(plan_file)
    worker = ["-c", ENTRY, "--mode", mode, "--plan", str(plan_file), "--", *flags]
    # torch's CPU allocator asks for huge pages for large tensors (its THP_MEM_ALLOC_ENABLE):
    # a conversion allocates the model's size more than once (Megatron's save copies the
    # pieces of fused tensors), and faulting that in 4 KiB pages was most of its system time
    env = dict(os.environ, MEGATRON_LM_PATH=str(lm), THP_MEM_ALLOC_ENABLE="1")
    if ranks == 1:  # torchrun's own interpreter and agent would add seconds to a 1B import
        cmd = [sys.executable, *worker]
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", "--no-python", sys.executable, *worker]
        env.setdefault("OMP_NUM_THREADS", "1")  # ranks share the cores
    env.pop(AUTOACTIVATE_ENV, None)
    # the row conversions run on unless the caller chose one (by name: the table would import
    # torch into this process)
    from ..device import names

    env.setdefault(DEVICE_ENV, names.CPU)
    code = processes.run(cmd, env)
    if code != 0:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"failed (exit {code})"
        raise StepFailed(f"mmp checkpoint: error: the {mode} step on {ranks} rank(s) {how}; its "
                         f"processes were stopped and what it wrote removed: nothing was written "
                         f"(see its output above).")


#: where a one-rank step's store listens: below Linux's default range of ports the kernel hands
#: out to connections (32768-60999), so that none of the connections the machine's other jobs
#: open (gloo's among them) takes it between this choice and the step's listening
PORTS = range(20000, 32768)


def _free_port() -> int:
    import random
    import socket

    for port in random.sample(PORTS, 64):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # all taken: any the kernel gives
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
