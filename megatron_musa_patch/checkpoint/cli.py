"""``mmp checkpoint import-hf | export-hf``: Hugging Face models in and out of Megatron.

    mmp checkpoint import-hf --hf-dir DIR --save OUT [--tensor-model-parallel-size N]
        [--pipeline-model-parallel-size N] [--expert-model-parallel-size N]
        [--ckpt-format torch_dist|torch]
    mmp checkpoint export-hf --load CKPT --hf-dir OUT [--hf-config PATH] [--max-shard-size GB]

``import-hf`` writes a checkpoint stock ``pretrain_gpt.py`` loads with ``--load OUT`` (add
``--finetune`` to start a new run from it) at the given layout, and the Megatron flags that build
the same network into ``OUT/model_flags.txt``. ``export-hf`` turns a checkpoint written by stock
``pretrain_gpt.py`` through the layer (any layout, either format) into a directory
``transformers`` loads. Both run Megatron's own checkpointing through the layer on the CPU (gloo),
write into a temporary directory and rename it at the end: an interrupted run leaves nothing
that looks complete. Exit status: 0 done, 2 refused (one paragraph), 1 a conversion step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from . import saved_args
from .errors import ConversionError
from .hf import config_dtype
from .worker import ENTRY

FLAGS_FILE = "model_flags.txt"
REFERENCE = "hf_reference"
TRACKER = "latest_checkpointed_iteration.txt"
FORMATS = ("torch_dist", "torch")
#: what every torch_dist checkpoint directory holds (megatron-core's dist_checkpointing config)
DIST_METADATA = "metadata.json"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmp checkpoint", description=__doc__.split("\n\n")[0].replace("``", ""),
        epilog="Exit status: 0 done, 2 refused with one paragraph, 1 a conversion step failed.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    imp = verbs.add_parser("import-hf", help="a Hugging Face model directory into a Megatron "
                                             "checkpoint", epilog=parser.epilog,
                           description="A local Hugging Face model directory into a Megatron "
                                       "checkpoint at the given parallel layout, with the model "
                                       "flags to train it.")
    imp.add_argument("--hf-dir", required=True, help="local Hugging Face model directory "
                                                     "(config.json + safetensors)")
    imp.add_argument("--save", required=True, help="the checkpoint directory to write (new)")
    imp.add_argument("--tensor-model-parallel-size", type=int, default=1)
    imp.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    imp.add_argument("--expert-model-parallel-size", type=int, default=1)
    imp.add_argument("--ckpt-format", choices=FORMATS, default="torch_dist")
    exp = verbs.add_parser("export-hf", help="a Megatron checkpoint into a Hugging Face model "
                                             "directory", epilog=parser.epilog,
                           description="A checkpoint pretrain_gpt.py wrote through the layer (any "
                                       "TP/PP/EP, either format) into a Hugging Face model "
                                       "directory.")
    exp.add_argument("--load", required=True, help="checkpoint directory written by "
                                                   "pretrain_gpt.py (or import-hf)")
    exp.add_argument("--hf-dir", required=True, help="the Hugging Face directory to write (new)")
    exp.add_argument("--hf-config", help="config.json (or a model directory) to take the "
                                         "config from; default: the one import-hf kept, else "
                                         "one made from the checkpoint's args")
    exp.add_argument("--max-shard-size", type=float, default=4.0,
                     help="largest safetensors file, in GB (default 4)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    opts = parser().parse_args(argv)
    try:
        if opts.verb == "import-hf":
            return import_hf(opts)
        return export_hf(opts)
    except ConversionError as exc:
        print(exc.render(prog=f"mmp checkpoint {opts.verb}"), file=sys.stderr)
        return exc.exit_code


# ----------------------------------------------------------------------------- import


def import_hf(opts) -> int:
    from . import families
    from .hf import HFCheckpoint

    layout = _layout(opts)
    source = HFCheckpoint(opts.hf_dir)
    family = families.family_of(source.config)
    family.check(source.config)
    _check_layout(source.config, layout)
    target = _new_dir(opts.save, "--save")
    lm = _lm_path()
    flags = family.flags(source.config) + _vocabulary_flags(source, layout["tp"])
    dtype_flags = _dtype_flags(source.config)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        plan = work / "plan.json"
        plan.write_text(json.dumps({"hf_dir": str(source.path)}))
        one = work / "one_rank"
        _megatron(1, "fill", plan, flags + dtype_flags + _fixed(source.config) +
                  ["--save", str(one), "--ckpt-format", "torch_dist"], lm,
                  save_format="torch_dist")
        final = one
        # a torch_dist checkpoint holds every tensor once with its global shape and reshards
        # itself on load, so the one-rank save is already the checkpoint of every layout; the
        # torch format is per rank, so it is written by the ranks of the layout
        if opts.ckpt_format != "torch_dist":
            final = work / "final"
            _megatron(layout["tp"] * layout["pp"] * layout["ep"], "reshard", plan,
                      flags + dtype_flags + _fixed(source.config) + _layout_flags(layout) +
                      ["--load", str(one), "--finetune", "--no-load-optim", "--no-load-rng",
                       "--save", str(final), "--ckpt-format", "torch_dist"], lm,
                      save_format=opts.ckpt_format)
        (final / FLAGS_FILE).write_text(_flags_text(flags, layout, opts.ckpt_format))
        reference = final / REFERENCE
        reference.mkdir()
        for path in source.side_files():
            shutil.copy2(path, reference / path.name)
        (reference / "config.json").write_text(json.dumps(source.config, indent=2) + "\n")
        if target.exists():
            target.rmdir()
        os.replace(final, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"mmp checkpoint: {source.path} -> {target} ({family.__name__.rsplit('.', 1)[1]} "
          f"family, {opts.ckpt_format}, TP{layout['tp']} PP{layout['pp']} EP{layout['ep']}). "
          f"Its model flags ({target / FLAGS_FILE}):")
    print((target / FLAGS_FILE).read_text(), end="")
    if layout["tp"] > 1 and "--num-experts" in flags:
        print("(Megatron trains a MoE model with tensor parallelism only with "
              "--sequence-parallel: add it to the training flags.)")
    return 0


def _check_built_alike(family, args) -> None:
    """A checkpoint whose network the installed megatron-core builds otherwise than the family's
    flags would (a family's ``check_built_alike``) is refused before anything is loaded."""
    if hasattr(family, "check_built_alike"):
        from megatron_musa_patch.upstream import installed

        family.check_built_alike(args, installed.megatron_core_version())


def _layout(opts) -> dict:
    layout = {"tp": opts.tensor_model_parallel_size, "pp": opts.pipeline_model_parallel_size,
              "ep": opts.expert_model_parallel_size}
    bad = {k: v for k, v in layout.items() if v < 1}
    if bad:
        raise ConversionError(f"parallel sizes must be 1 or more, not {bad}.")
    return layout


def _check_layout(config: dict, layout: dict) -> None:
    """The layout splits this model the way Megatron needs (it would otherwise stop only when
    the checkpoint is first loaded)."""
    from .families import common

    d = common.dims(config)
    experts = int(config.get("num_local_experts") or config.get("n_routed_experts") or 0)
    rules = [("tensor", "tp", "num_attention_heads", d["heads"]),
             ("tensor", "tp", "num_key_value_heads", d["groups"]),
             ("tensor", "tp", "intermediate_size", int(config["intermediate_size"])),
             ("pipeline", "pp", "num_hidden_layers", d["layers"])]
    if experts:
        rules.append(("expert", "ep", "num_local_experts", experts))
    elif layout["ep"] > 1:
        raise ConversionError(
            f"--expert-model-parallel-size {layout['ep']}: this model "
            f"({config['architectures'][0]}) has no experts. Leave it at 1.")
    for kind, key, field, value in rules:
        if value % layout[key]:
            raise ConversionError(
                f"--{kind}-model-parallel-size {layout[key]} does not divide the model's "
                f"{field} ({value}): Megatron splits it evenly across those ranks. Choose a "
                f"size that divides {value}. Nothing was written.")


def _layout_flags(layout: dict) -> List[str]:
    return ["--tensor-model-parallel-size", str(layout["tp"]),
            "--pipeline-model-parallel-size", str(layout["pp"]),
            "--expert-model-parallel-size", str(layout["ep"])]


def _vocabulary_flags(source, tp: int) -> List[str]:
    """The tokenizer (the directory's own, or none) and a padding divisor that makes Megatron's
    padded vocabulary the checkpoint's rows exactly, at this tensor-parallel size."""
    rows = int(source.config["vocab_size"])
    if (source.path / "tokenizer.json").is_file() or (source.path / "tokenizer.model").is_file():
        size = _tokenizer_size(source.path)
        tokenizer = ["--tokenizer-type", "HuggingFaceTokenizer",
                     "--tokenizer-model", str(source.path.resolve())]
    else:
        # NullTokenizer --vocab-size N has N + 1 tokens up to 0.18 (the legacy tokenizer adds
        # the end of document) and N from 0.19: the divisor is chosen to pad either to the rows
        size = rows - 1
        tokenizer = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(rows - 1)]
    return tokenizer + ["--make-vocab-size-divisible-by", str(vocab_divisor(rows, size, tp))]


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


def _tokenizer_size(path: Path) -> int:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConversionError(
            f"--hf-dir {path} has a tokenizer, and reading its size needs transformers "
            f"({exc}); pip install 'megatron-musa-patch[data]'.") from exc
    return len(AutoTokenizer.from_pretrained(str(path), local_files_only=True))


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


def _flags_text(flags: List[str], layout: dict, ckpt_format: str) -> str:
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


def export_hf(opts) -> int:
    from . import families

    load = Path(opts.load)
    args = checkpoint_args(load)
    reference = _reference(load, args)
    config = _export_config(opts, reference, args)
    family = families.family_of(config)
    family.check(config)
    _check_built_alike(family, args)
    target = Path(opts.hf_dir)
    if target.exists() and any(target.iterdir()):
        raise ConversionError(f"--hf-dir {target} exists and is not empty: give a new "
                              f"directory (the export never writes into an existing one).")
    lm = _lm_path()
    layout = {"tp": args.tensor_model_parallel_size, "pp": args.pipeline_model_parallel_size,
              "ep": getattr(args, "expert_model_parallel_size", 1) or 1}
    work = Path(tempfile.mkdtemp(prefix=".mmp-export-", dir=target.parent if
                                 target.parent.exists() else None))
    try:
        plan = work / "plan.json"
        side = [str(p) for p in _reference_side_files(reference)]
        dtype = config_dtype(config)
        plan.write_text(json.dumps({"hf_config": config, "hf_out": str(target),
                                    "side_files": side, "dtype": dtype,
                                    "max_shard_bytes": int(opts.max_shard_size * (1 << 30))}))
        # the model flags made from the config as import-hf makes them, so the two directions
        # agree; the vocabulary exactly the checkpoint's padded one, whatever tokenizer it had
        common = family.flags(config) + _dtype_flags(config) + [
            "--no-load-optim", "--no-load-rng", "--finetune"] + _fixed(
            {"max_position_embeddings": args.max_position_embeddings})
        source = load
        if _format(load) == "torch" and layout != {"tp": 1, "pp": 1, "ep": 1}:
            source = work / "layout_free"
            _megatron(layout["tp"] * layout["pp"] * layout["ep"], "reshard", plan,
                      common + _export_vocabulary(args.padded_vocab_size, layout["tp"]) +
                      _layout_flags(layout) +
                      ["--load", str(load), "--save", str(source), "--ckpt-format", "torch"],
                      lm, save_format="torch_dist")
        _megatron(1, "dump", plan, common + _export_vocabulary(args.padded_vocab_size, 1) +
                  _layout_flags({"tp": 1, "pp": 1, "ep": 1}) +
                  ["--load", str(source), "--ckpt-format", _format(source)], lm)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"mmp checkpoint: {load} -> {target} ({config['architectures'][0]}, {dtype})")
    return 0


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
        if (directory / "common.pt").is_file():  # up to 0.18
            return _torch_loaded_args(directory / "common.pt")
        from megatron.core.dist_checkpointing import load_common_state_dict  # 0.19: inside

        return load_common_state_dict(str(directory))["args"]
    files = sorted(directory.glob("mp_rank_*/model_optim_rng.pt"))
    if not files:
        raise ConversionError(
            f"--load {load}: {directory} holds neither a torch_dist ({DIST_METADATA}) nor a "
            f"torch (mp_rank_*/model_optim_rng.pt) checkpoint.")
    return saved_args.read(files[0]) or _torch_loaded_args(files[0])


def _torch_loaded_args(path: Path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["args"]


def _iteration_dir(load: Path) -> Path:
    tracker = load / TRACKER
    if not tracker.is_file():
        raise ConversionError(f"--load {load}: no {TRACKER} there (not a Megatron checkpoint "
                              f"directory, or one whose first save did not finish).")
    text = tracker.read_text().strip()
    name = "release" if text == "release" else f"iter_{int(text):07d}"
    return load / name


def _format(load: Path) -> str:
    return "torch_dist" if (_iteration_dir(load) / DIST_METADATA).is_file() else "torch"


def _export_config(opts, reference: Optional[Path], args) -> dict:
    from . import families
    from .hf import read_config

    if opts.hf_config:
        config = read_config(opts.hf_config)
        if config is None:
            raise ConversionError(f"--hf-config {opts.hf_config}: no config.json there.")
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
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConversionError(f"{flag} {target} exists and is not empty: give a new directory "
                              f"(a conversion never writes into an existing one).")
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


def _megatron(ranks: int, mode: str, plan: Path, flags: List[str], lm: Path,
              save_format: Optional[str] = None) -> None:
    """One step on ``ranks`` CPU ranks (``flags``: Megatron's; ``--ckpt-format`` the format
    loaded, ``save_format`` the one saved when they differ)."""
    if save_format is not None:
        plan.write_text(json.dumps({**json.loads(plan.read_text()), "save_format": save_format}))
    worker = ["-c", ENTRY, "--mode", mode, "--plan", str(plan), "--", *flags]
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
    env.pop("MEGATRON_MUSA_PATCH_AUTOACTIVATE", None)
    # the row conversions run on unless the caller chose one (by name: the table would import
    # torch into this process)
    from ..device import names

    env.setdefault("MEGATRON_MUSA_PATCH_DEVICE", names.CPU)
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"mmp checkpoint: error: the {mode} step on {ranks} rank(s) failed (exit "
                         f"{proc.returncode}); nothing was written (see its output above).")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
