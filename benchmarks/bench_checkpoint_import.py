"""``mmp checkpoint import-hf`` / ``export-hf`` of a 1B- or 3B-shaped model against copying its
safetensors, side by side in one run: time, and the peak resident set of the largest process.

The model is Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads of which 8 key/value,
intermediate 8192, vocabulary 128256, tied embedding; 1.24 B parameters) or, with ``--shape
3b``, Llama-3.2-3B's (hidden 3072, 28 layers, 24 heads of which 8 key/value; 3.21 B), random
bf16 weights generated here (nothing is downloaded), in safetensors shards of at most
``--shard-gib`` (default: two shards). Each figure is the median of
``--repeat`` runs, interleaved, after one untimed run of each step; the copy is
``shutil.copyfile`` of the shards (what "copying its safetensors" costs on this disk, page cache
warm as for the conversion), copy+fsync the same flushed to the disk as a checkpoint save is. The
goal (issue "Hugging Face checkpoints"): import within 2x the copy. Ratios are against both
copies. ``export-hf`` writes its safetensors as transformers' ``save_pretrained`` does (not
synced). ``--slope-layers N`` also converts the same shape with N layers, interleaved, and prints
what each added GiB costs (the difference of the two medians over the difference of the sizes):
the conversion's rate beside the copy's, without the start-up both sizes pay alike (Python,
torch, megatron-core, Megatron's initialisation). ``--without FEATURE`` also times the
conversions with that feature switched off (``MEGATRON_MUSA_PATCH_DISABLE``), interleaved: what
the feature is worth, in the same run. ``--against REV`` also times them with the package as git
revision REV of this repository has it (``git archive`` into the work directory, first on
``PYTHONPATH``; the installed package's start-up hook imports it from there), interleaved: what
the commits since REV changed, with no feature switch needed. ``--pipeline N`` also imports
at ``--pipeline-model-parallel-size N`` (each rank fills and saves its own stages).

Memory: every conversion runs under a parent that reports ``getrusage(RUSAGE_CHILDREN)``'s
``ru_maxrss``, the peak resident set of the largest process of the tree (ranks, torchrun,
Megatron's writers: each is waited for by its parent), printed beside the bound the issue set:
the process's share of the model (all of it at one rank, 1/N at PP N) plus the largest
safetensors file plus 1 GiB.

    MEGATRON_LM_PATH=... python benchmarks/bench_checkpoint_import.py [--workdir DIR]
        [--repeat 3] [--export] [--shape 1b|3b] [--shard-gib 1] [--layers 16]
        [--slope-layers 4] [--pipeline 2] [--without upstream_fixes.writer_threads_together]
        [--against HEAD~1]
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))  # the repository: tools/
from tools.machine import describe  # noqa: E402

SHAPE = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
             num_attention_heads=32, num_key_value_heads=8, head_dim=64,
             max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
             rope_theta=500000.0, torch_dtype="bfloat16")
SHAPES = {"1b": SHAPE,
          "3b": {**SHAPE, "hidden_size": 3072, "num_hidden_layers": 28,
                 "num_attention_heads": 24, "head_dim": 128}}
#: reports the peak resident set of the largest process below it, in KiB, on its last line
MEASURED = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print('maxrss', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
            "file=sys.stderr); sys.exit(code)")


def generate(target: Path, layers: int, shards: int = 2, shape: dict = SHAPE,
             shard_bytes: int = 0) -> Path:
    """A random bf16 Llama of ``shape`` in ``target`` (config.json + safetensors shards with
    their index; ``shards`` of them, or as many as keep each within ``shard_bytes``), tensor
    by tensor (never the whole model in float32)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    config = transformers.LlamaConfig(**{**shape, "num_hidden_layers": layers},
                                      architectures=["LlamaForCausalLM"])
    with torch.device("meta"):
        shapes = {n: t.shape for n, t in
                  transformers.LlamaForCausalLM(config).state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    names = list(shapes)
    generator = torch.Generator().manual_seed(0)
    target.mkdir(parents=True)
    if shard_bytes:  # in order, each shard as full as shard_bytes allows (save_pretrained's way)
        parts, size = [[]], 0
        for name in names:
            nbytes = 2 * shapes[name].numel()
            if parts[-1] and size + nbytes > shard_bytes:
                parts.append([])
                size = 0
            parts[-1].append(name)
            size += nbytes
    else:
        per_shard = -(-len(names) // shards)
        parts = [names[i * per_shard:(i + 1) * per_shard] for i in range(shards)]
    shards, index = len(parts), {}
    for i, part in enumerate(parts):
        tensors = {}
        for name in part:
            shape = shapes[name]
            tensors[name] = (torch.ones(shape) if len(shape) == 1 else torch.randn(
                shape, generator=generator) * 0.02).to(torch.bfloat16)
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(target / file), metadata={"format": "pt"})
        index.update({name: file for name in part})
        del tensors
    (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    config.save_pretrained(target)
    return target


def copy_shards(source: Path, target: Path, durable: bool = False) -> None:
    """The shards copied; ``durable``: flushed to the disk as a checkpoint save is (fsync)."""
    target.mkdir()
    for path in sorted(source.glob("*.safetensors")):
        shutil.copyfile(path, target / path.name)
        if durable:
            with open(target / path.name, "rb+") as handle:
                os.fsync(handle.fileno())


def timed(output: Path, fn) -> float:
    """``fn``'s seconds, with its ``output`` directory removed first. Before the clock starts,
    what the step before left unwritten is flushed: a plain copy leaves its 2 GiB dirty, and the
    disk would write them back during the next step's clock; likewise the removal's."""
    shutil.rmtree(output, ignore_errors=True)
    os.sync()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def package_at(revision: str, target: Path) -> Path:
    """``megatron_musa_patch`` as git ``revision`` of this repository has it, unpacked into
    ``target`` (a directory to put first on ``PYTHONPATH``)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "megatron_musa_patch"],
                             capture_output=True)
    if archive.returncode:
        sys.exit(f"--against {revision}: git archive failed: "
                 f"{archive.stderr.decode(errors='replace').strip()} (a commit, branch or tag of "
                 f"{REPO})")
    target.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(target)
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", help="where the model and its copies go (default: a "
                                          "temporary directory beside the system's)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b",
                        help="Llama-3.2-1B's shape or 3B's")
    parser.add_argument("--shard-gib", type=float, default=0,
                        help="largest safetensors file, GiB (default: two shards)")
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers (default: the shape's; fewer for a quick look)")
    parser.add_argument("--pipeline", type=int, default=None,
                        help="also import at this --pipeline-model-parallel-size")
    parser.add_argument("--export", action="store_true",
                        help="also time export-hf of the imported checkpoint")
    parser.add_argument("--slope-layers", type=int, default=None,
                        help="also convert the shape with this many layers: the cost per "
                             "added GiB, start-up aside")
    parser.add_argument("--without", metavar="FEATURE",
                        help="also time the conversions with this feature switched off")
    parser.add_argument("--against", metavar="REV",
                        help="also time the conversions with the package of git revision REV")
    opts = parser.parse_args(argv)
    shape = SHAPES[opts.shape]
    opts.layers = opts.layers or shape["num_hidden_layers"]
    if not os.environ.get("MEGATRON_LM_PATH"):
        parser.error("set MEGATRON_LM_PATH to a Megatron-LM checkout of your megatron-core's tag")
    root = Path(tempfile.mkdtemp(prefix="mmp-bench-ckpt-", dir=opts.workdir))
    # what the `mmp` script runs (python -m megatron_musa_patch.cli.main would also activate the
    # layer in the command's own process: torch and megatron-core imported for nothing)
    mmp = [sys.executable, "-c", MEASURED, sys.executable, "-c",
           "from _megatron_musa_patch_boot import cli; cli()"]
    # the commands run as a user's do: a Megatron-LM checkout keeps the bytecode Python compiles
    # (without it, every run compiles megatron.training again: a second of each conversion)
    env = dict(os.environ)
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        print("PYTHONDONTWRITEBYTECODE is set here: the timed commands run without it",
              flush=True)
    try:
        # the other ways each conversion runs, by the suffix of its rows: "<step> off" with
        # --without's feature off, "<step> REV" with --against's package
        variants = {}
        if opts.without:
            variants["off"] = {**env, "MEGATRON_MUSA_PATCH_DISABLE": ",".join(filter(None, (
                env.get("MEGATRON_MUSA_PATCH_DISABLE"), opts.without)))}
        if opts.against:
            package = package_at(opts.against, root / "against")
            variants[opts.against] = {**env, "PYTHONPATH": os.pathsep.join(filter(None, (
                str(package), env.get("PYTHONPATH"))))}
        sizes = [opts.layers] + ([opts.slope_layers] if opts.slope_layers else [])
        models, nbytes, largest = {}, {}, {}
        for layers in sizes:
            print(f"generating the {layers}-layer model in {root} ...", flush=True)
            models[layers] = generate(root / f"hf{layers}", layers, shape=shape,
                                      shard_bytes=int(opts.shard_gib * 2**30))
            files = [p.stat().st_size for p in models[layers].glob("*.safetensors")]
            nbytes[layers], largest[layers] = sum(files), max(files)
        pipeline = f"import-hf PP{opts.pipeline}"
        converts = ["import-hf"] + ([pipeline] if opts.pipeline else []) + (
            ["export-hf"] if opts.export else [])
        names = ["copy", "copy+fsync", *converts,
                 *(f"{name} {suffix}" for suffix in variants for name in converts)]
        runs = {(layers, name): [] for layers in sizes for name in names}
        peaks = {(layers, name): [] for layers in sizes for name in names}
        current = {}  # the (layers, name) running, whose peak run() records

        def run(argv, env=env):
            proc = subprocess.run(mmp + argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, env=env)
            if proc.returncode:
                sys.exit(f"{' '.join(argv[:2])} failed:\n{proc.stderr[-3000:]}")
            kib = int(proc.stderr.strip().rsplit("\n", 1)[-1].split()[1])
            if "key" in current:
                peaks[current["key"]].append(kib * 1024)

        def steps(model):
            """name -> (the directory it writes, removed before it runs; the step)"""
            def import_hf(env=env):
                run(["checkpoint", "import-hf", "--hf-dir", str(model), "--save",
                     str(root / "ckpt")], env)

            def import_pp(env=env):
                run(["checkpoint", "import-hf", "--hf-dir", str(model), "--save",
                     str(root / "ckpt_pp"), "--pipeline-model-parallel-size",
                     str(opts.pipeline)], env)

            def export_hf(env=env):  # of the import just made
                run(["checkpoint", "export-hf", "--load", str(root / "ckpt"),
                     "--hf-dir", str(root / "exported")], env)

            fns = {"copy": (root / "copy", lambda: copy_shards(model, root / "copy")),
                   "copy+fsync": (root / "copy", lambda: copy_shards(model, root / "copy",
                                                                     durable=True)),
                   "import-hf": (root / "ckpt", import_hf),
                   pipeline: (root / "ckpt_pp", import_pp),
                   "export-hf": (root / "exported", export_hf)}
            for suffix, other in variants.items():  # each exports the import made its way
                fns[f"import-hf {suffix}"] = (root / "ckpt", functools.partial(import_hf, other))
                fns[f"{pipeline} {suffix}"] = (root / "ckpt_pp", functools.partial(import_pp,
                                                                                    other))
                fns[f"export-hf {suffix}"] = (root / "exported",
                                              functools.partial(export_hf, other))
            return fns

        for layers in sizes:  # untimed: the page cache warm for every figure, and the
            # checkout's bytecode written (the first conversion on a machine compiles it)
            fns = steps(models[layers])
            for name in names:
                timed(*fns[name])
        for i in range(opts.repeat):  # interleaved, so drift hits each alike
            for layers in sizes:
                fns = steps(models[layers])
                for name in names:
                    current["key"] = (layers, name)
                    runs[layers, name].append(timed(*fns[name]))
                    current.pop("key")
                print(f"  run {i + 1}, {layers} layers: " + ", ".join(
                    f"{name} {runs[layers, name][-1]:.1f} s" for name in names), flush=True)
        median = {key: statistics.median(values) for key, values in runs.items()}
        print(f"\n{describe()}")
        print(f"median of {opts.repeat}" + (f"; 'off': without {opts.without}"
                                            if opts.without else "")
              + (f"; '{opts.against}': the package of git revision {opts.against}"
                 if opts.against else ""))
        width = max(len(name) for name in names)
        for layers in sizes:
            base, durable = median[layers, "copy"], median[layers, "copy+fsync"]
            print(f"model: {layers} layers, {nbytes[layers] / 2**30:.2f} GiB of bf16 "
                  f"safetensors")
            for name in names:
                values, value = runs[layers, name], median[layers, name]
                print(f"  {name:{width}} {value:7.1f} s  ({value / base:5.2f}x the copy, "
                      f"{value / durable:5.2f}x with fsync; min {min(values):.1f}, "
                      f"max {max(values):.1f})")
            print(f"  peak resident set of the largest process, beside the bound (its share "
                  f"of the model + the largest file, {largest[layers] / 2**30:.2f} GiB, + 1 "
                  f"GiB):")
            for name in converts + [f"{n} {suffix}" for suffix in variants for n in converts]:
                share = nbytes[layers] / (opts.pipeline if name.startswith(pipeline) else 1)
                bound = share + largest[layers] + 2**30
                peak = max(peaks[layers, name])
                print(f"  {name:{width}} {peak / 2**30:7.2f} GiB  (bound {bound / 2**30:.2f} "
                      f"GiB: {'within' if peak <= bound else 'OVER'}; "
                      f"{peak / nbytes[layers]:.2f}x the model)")
        if opts.slope_layers:
            big, small = opts.layers, opts.slope_layers
            gib = (nbytes[big] - nbytes[small]) / 2**30
            per = {name: (median[big, name] - median[small, name]) / gib for name in names}
            print(f"each added GiB ({small} -> {big} layers), start-up aside:")
            for name in names:
                print(f"  {name:{width}} {per[name]:7.2f} s/GiB ({per[name] / per['copy']:5.2f}x the "
                      f"copy, {per[name] / per['copy+fsync']:5.2f}x with fsync)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
