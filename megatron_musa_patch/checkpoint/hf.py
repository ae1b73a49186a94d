"""A Hugging Face model directory, read and written one tensor at a time.

Reading: ``config.json`` and the safetensors files (one file, or shards with
``model.safetensors.index.json``), each tensor loaded when asked for (``safe_open`` maps the
file; nothing is read twice or kept). A block-wise FP8 checkpoint (the DeepSeek-V3 hub weights:
``quantization_config`` with ``quant_method`` fp8 and ``weight_block_size``; a float8 weight
beside its ``<name>_scale_inv``, one scale per block) is read dequantized to the config's dtype
(weight x the scale of its block, computed in float32, as DeepSeek's ``weight_dequant`` and
transformers do), and its config is the one of those weights: without ``quantization_config``.
Writing: tensors go into shards of at most ``max_shard_bytes`` as they arrive, into a temporary
directory that is renamed into place only when everything is written (an interrupted export
leaves nothing that looks complete).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from collections import Counter
from typing import Callable, Dict, Iterable, List, Optional

from .errors import ConversionError

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
#: the block scales of an FP8 weight: "<weight name>" + this
SCALE_INV = "_scale_inv"
#: the files of a tokenizer (and generation settings) a model directory may carry
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
              "generation_config.json", "chat_template.jinja")


class HFCheckpoint:
    """The tensors and config of one local Hugging Face model directory."""

    def __init__(self, path):
        self.path = Path(path)
        if not (self.path / CONFIG).is_file():
            raise ConversionError(
                f"--hf-dir {self.path}: no {CONFIG} there. Give a local Hugging Face model "
                f"directory (config.json and *.safetensors; this command never downloads).")
        self.config = read_json(self.path / CONFIG, "--hf-dir")
        self.fp8_block = _fp8_block(self.path, self.config.pop("quantization_config", None))
        self._where = self._index()
        self._open: Dict[str, object] = {}

    def _index(self) -> Dict[str, str]:
        """Where each tensor is, after every file's header has been read and its size checked
        against it (a file cut short is refused here, before any model is built)."""
        index = self.path / INDEX
        if index.is_file():
            weight_map = read_json(index, "--hf-dir").get("weight_map", {})
            missing = sorted({f for f in weight_map.values() if not (self.path / f).is_file()})
            if missing:
                raise ConversionError(
                    f"--hf-dir {self.path}: {INDEX} names {', '.join(missing[:3])}, which "
                    f"{'is' if len(missing) == 1 else 'are'} not there (an interrupted "
                    f"download?). Fetch the missing shards, or point --hf-dir at a complete "
                    f"directory.")
            for file in sorted(set(weight_map.values())):
                held = set(tensor_names(self.path / file))
                absent = sorted(n for n, f in weight_map.items() if f == file and n not in held)
                if absent:
                    raise ConversionError(
                        f"--hf-dir {self.path}: {INDEX} puts {', '.join(absent[:3])} in {file}, "
                        f"whose header does not hold {'it' if len(absent) == 1 else 'them'}. "
                        f"The index and the shards are of different models or downloads: "
                        f"fetch the directory again.")
            return dict(weight_map)
        files = sorted(p.name for p in self.path.glob("*.safetensors"))
        if not files:
            bins = sorted(p.name for p in self.path.glob("*.bin"))
            hint = (f" ({', '.join(bins[:2])} are pickled PyTorch weights: save the model "
                    f"again with save_pretrained(..., safe_serialization=True))") if bins else ""
            raise ConversionError(f"--hf-dir {self.path}: no *.safetensors files{hint}.")
        return {key: name for name in files for key in tensor_names(self.path / name)}

    def names(self) -> List[str]:
        """The tensors it hands out (an FP8 weight's scales are part of the weight)."""
        return sorted(n for n in self._where if not (self.fp8_block and n.endswith(SCALE_INV)))

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str):
        """One tensor, read now."""
        if name not in self._where:
            raise ConversionError(
                f"--hf-dir {self.path}: the checkpoint has no tensor {name!r}, which its "
                f"config ({self.config.get('architectures')}) implies. Is the directory "
                f"complete, and is it the model its config.json describes?")
        tensor = self._read(name)
        if self.fp8_block and name + SCALE_INV in self._where:
            scale_inv = self._read(name + SCALE_INV)
            grid = tuple(-(-n // b) for n, b in zip(tensor.shape, self.fp8_block))
            if tensor.dim() != 2 or tuple(scale_inv.shape) != grid:
                raise ConversionError(
                    f"--hf-dir {self.path}: {name}{SCALE_INV} has shape "
                    f"{tuple(scale_inv.shape)}, where {name} {tuple(tensor.shape)} in blocks of "
                    f"{list(self.fp8_block)} (quantization_config's weight_block_size) needs "
                    f"{grid}. Is the directory the model its config.json describes?")
            return dequantize(tensor, scale_inv, self.fp8_block, _dtype(self.config))
        if "float8" in str(tensor.dtype):  # its scale missing: the values would be wrong
            raise ConversionError(
                f"--hf-dir {self.path}: {name} is {tensor.dtype} without {name}{SCALE_INV} "
                f"beside it (or without the quantization_config that says how to read it). "
                f"Is the directory complete, and is it the model its config.json describes?")
        return tensor

    def reading(self, names) -> Callable:
        """``get`` for the reads ``names`` lists (a name as often as it will be read), which
        lets go of each file once its last listed read is done: its pages are unmapped as soon
        as no tensor read from it is kept (a conversion holds about one file's pages at a time,
        not every file it read)."""
        left = Counter()
        for name in names:
            for stored in (name, name + SCALE_INV):
                if stored in self._where and (stored == name or self.fp8_block):
                    left[self._where[stored]] += 1

        def get(name: str):
            tensor = self.get(name)
            for stored in {name, name + SCALE_INV}:
                file = self._where.get(stored)
                if file is not None and left[file] > 0 and (stored == name or self.fp8_block):
                    left[file] -= 1
                    if left[file] == 0:
                        self._open.pop(file, None)
            return tensor
        return get

    def _read(self, name: str):
        file = self._where[name]
        handle = self._open.get(file)
        if handle is None:
            from safetensors import safe_open

            handle = self._open[file] = safe_open(self.path / file, framework="pt")
        return handle.get_tensor(name)

    def side_files(self) -> List[Path]:
        return [self.path / f for f in SIDE_FILES if (self.path / f).is_file()]

    def total_bytes(self) -> int:
        return sum((self.path / f).stat().st_size for f in set(self._where.values()))


def read_json(path: Path, flag: str) -> dict:
    """A JSON file of the model directory, refused in one paragraph where it does not read."""
    try:
        found = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ConversionError(
            f"{flag} {Path(path).parent}: {Path(path).name} is not JSON ({exc.msg} at line "
            f"{exc.lineno}, column {exc.colno}): a cut or edited file? Fetch it again. Nothing "
            f"was written.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConversionError(f"{flag} {Path(path).parent}: {Path(path).name} cannot be read "
                              f"({exc}). Nothing was written.") from None
    if not isinstance(found, dict):
        raise ConversionError(f"{flag} {Path(path).parent}: {Path(path).name} holds a JSON "
                              f"{type(found).__name__}, not an object. Nothing was written.")
    return found


def tensor_names(path: Path) -> List[str]:
    """The tensors of a safetensors file, from its header (8 bytes of length, then JSON), after
    checking that the file is as long as the header says: a file cut short (an interrupted
    download or copy) is refused naming it, not met as a read error deep in a conversion. No
    torch is imported (mmp checkpoint's own process plans without it)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > size - 8:
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(f.read(length))
        end = max((int(v["data_offsets"][1]) for k, v in header.items()
                   if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ConversionError(
            f"--hf-dir {path.parent}: {path.name} is not a safetensors file ({size} bytes; its "
            f"header does not read: {exc}). Fetch it again. Nothing was written.") from None
    if 8 + length + end != size:
        raise ConversionError(
            f"--hf-dir {path.parent}: {path.name} is {size} bytes where its header says "
            f"{8 + length + end}: the file was cut short (an interrupted download or copy?). "
            f"Fetch it again. Nothing was written.")
    return [k for k in header if k != "__metadata__"]


def _fp8_block(path: Path, quantization: Optional[dict]):
    """(rows, columns) of an FP8 block, None without quantization; any other quantization is
    refused (its weights are not what the network computes with)."""
    if quantization is None:
        return None
    block = quantization.get("weight_block_size")
    if (quantization.get("quant_method") != "fp8" or quantization.get("fmt", "e4m3") != "e4m3"
            or not (isinstance(block, list) and len(block) == 2)):
        raise ConversionError(
            f"--hf-dir {path}: config.json's quantization_config {quantization} is not one "
            f"this conversion reads: it dequantizes block-wise FP8 (quant_method fp8, fmt "
            f"e4m3, weight_block_size [rows, columns], as the DeepSeek-V3 hub weights). "
            f"Dequantize the model first (its own tools, or transformers' from_pretrained and "
            f"save_pretrained), and import that. Nothing was written.")
    return int(block[0]), int(block[1])


def config_dtype(config: dict) -> str:
    """The dtype a config says its weights are in (either spelling; float32 when it says none,
    as transformers reads it)."""
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def _dtype(config: dict):
    import torch

    return getattr(torch, config_dtype(config))


def dequantize(weight, scale_inv, block, dtype):
    """A block-wise FP8 weight in ``dtype``: each (rows x columns) block times its scale (the
    last blocks of a side that the block does not divide are partial)."""
    import torch

    rows, cols = weight.shape
    scale = scale_inv.to(torch.float32).repeat_interleave(block[0], dim=0)[:rows]
    scale = scale.repeat_interleave(block[1], dim=1)[:, :cols]
    return (weight.to(torch.float32) * scale).to(dtype)


class HFWriter:
    """Writes a model directory: shards as tensors arrive, then the index and config; the
    directory appears under its name only when complete."""

    def __init__(self, target, max_shard_bytes: int = 4 << 30, tmp=None):
        self.target = Path(target)
        check_new_dir(self.target, "--hf-dir")
        self.target.parent.mkdir(parents=True, exist_ok=True)
        # ``tmp``: the directory to write in, made by whoever asked for the export, who also
        # renames it into place (or removes it: this process may be stopped half-way); by
        # default one made here and renamed by ``finish``
        self.publish = tmp is None
        self.tmp = Path(tmp) if tmp is not None else Path(tempfile.mkdtemp(
            prefix=tmp_prefix(self.target), dir=self.target.parent))
        self.max_shard_bytes = max_shard_bytes
        self._pending: Dict[str, object] = {}
        self._pending_bytes = 0
        self._shards: List[Dict[str, object]] = []
        self._weight_map: Dict[str, str] = {}
        self.total_bytes = 0

    def add(self, name: str, tensor) -> None:
        if name in self._pending or name in self._weight_map:
            raise ValueError(f"tensor {name} written twice")
        size = tensor.numel() * tensor.element_size()
        if self._pending and self._pending_bytes + size > self.max_shard_bytes:
            self._flush()
        self._pending[name] = tensor.contiguous()
        self._pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        from safetensors.torch import save_file

        number = len(self._shards) + 1
        name = f"model-{number:05d}.safetensors"
        save_file(self._pending, str(self.tmp / name), metadata={"format": "pt"})
        for key in self._pending:
            self._weight_map[key] = name
        self._shards.append({"file": name})
        self._pending, self._pending_bytes = {}, 0

    def finish(self, config: dict, side_files: Iterable[Path] = ()) -> Path:
        if self._pending or not self._shards:
            self._flush()
        total = len(self._shards)
        if total == 1:  # one file: the plain name transformers expects
            (self.tmp / self._shards[0]["file"]).rename(self.tmp / SINGLE)
        else:
            renamed = {}
            for number, shard in enumerate(self._shards, start=1):
                final = f"model-{number:05d}-of-{total:05d}.safetensors"
                (self.tmp / shard["file"]).rename(self.tmp / final)
                renamed[shard["file"]] = final
            index = {"metadata": {"total_size": self.total_bytes},
                     "weight_map": {k: renamed[v] for k, v in sorted(self._weight_map.items())}}
            (self.tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        for path in side_files:
            shutil.copy2(path, self.tmp / Path(path).name)
        (self.tmp / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        self.tmp.chmod(0o777 & ~_umask())  # as save_pretrained's directory (mkdtemp's is 0700)
        if not self.publish:
            return self.tmp
        return publish(self.tmp, self.target)

    def abandon(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def read_config(path, flag: str = "--hf-config") -> Optional[dict]:
    file = Path(path)
    file = file / CONFIG if file.is_dir() else file
    return read_json(file, flag) if file.is_file() else None


def publish(written: Path, target: Path) -> Path:
    """The complete directory ``written`` renamed to ``target`` (absent, or empty)."""
    if target.exists():
        target.rmdir()
    os.replace(written, target)
    return target


def check_new_dir(target: Path, flag: str) -> None:
    """``target`` may be written: absent, or an empty directory."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        kind = "is not empty" if target.is_dir() else "is a file"
        raise ConversionError(f"{flag} {target} exists and {kind}: give a new directory (a "
                              f"conversion never writes into an existing one). Nothing was "
                              f"written.")


def tmp_prefix(target: Path) -> str:
    """The name a conversion's temporary directory beside ``target`` starts with."""
    return f".{Path(target).name}.tmp-"


def _umask() -> int:
    """The process's umask, read without setting it (``os.umask`` sets it, which a writer
    thread of Megatron's could meet half-way)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
