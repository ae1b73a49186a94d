"""The args stock ``pretrain_gpt.py`` stored in a checkpoint, read without torch or megatron-core.

A ``torch.save`` file is a zip whose ``*/data.pkl`` is the pickle; its tensors' bytes are other
entries, which it names through ``persistent_load``. ``torch.load`` imports what the pickle names
(torch; megatron-core for the enums among the args: seconds) and, for a
``torch``-format checkpoint, reads every tensor of the rank's model. The conversion needs only
the args' plain values (sizes, flags, names), so here whatever the pickle names from torch or
megatron is an :class:`Opaque` stand-in and no tensor is read. The values that are not plain
(dtypes, enums, tensors) are stand-ins: nothing in ``mmp checkpoint`` reads them. Where the
pickle is: ``common.pt`` (``torch_dist`` up to megatron-core 0.18), a rank's
``model_optim_rng.pt`` (``torch``), or, from 0.19, a ``torch.save`` inside one of a
``torch_dist`` checkpoint's ``.distcp`` files, which torch's ``.metadata`` pickle locates
(:func:`read_dist`; megatron-core's own reader imports torch and megatron-core: seconds of an
export).
"""

from __future__ import annotations

import argparse
import io
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Optional

from megatron_musa_patch.upstream.checkpoint_files import COMMON_STATE

#: top-level packages whose classes and functions the pickle gets as stand-ins
STAND_IN = ("torch", "megatron", "transformer_engine", "numpy", "apex")


class Opaque:
    """What the pickle named from a stand-in package: a class, a value, or what calling it made
    (``where`` says which)."""

    where = "?"

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self.state = state

    def __repr__(self):
        return f"<{self.where} (not read)>"


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.split(".")[0] in STAND_IN:
            return type(name, (Opaque,), {"where": f"{module}.{name}"})
        return super().find_class(module, name)

    def persistent_load(self, pid):
        return None  # a tensor's bytes: not read


def read(path: Path) -> Optional[argparse.Namespace]:
    """``args`` of the checkpoint file ``path`` (``common.pt`` or a rank's
    ``model_optim_rng.pt``), or None where it is not a zip ``torch.save`` with a pickle this
    reader follows (the caller then uses ``torch.load``)."""
    try:
        with open(path, "rb") as f:
            return _args_in_zip(f)
    except OSError:
        return None


#: the common state's place in a torch_dist checkpoint from megatron-core 0.19: one
#: ShardedObject's unique key (``ShardedObject("common_state", None, (1,), (0,))``)
COMMON_STATE_KEY = "common_state/shard_0_1"


def read_torch_dist(directory: Path) -> Optional[argparse.Namespace]:
    """``args`` of a ``torch_dist`` checkpoint's iteration directory: from its ``common.pt`` up to
    megatron-core 0.18, from inside its ``.distcp`` files from 0.19 (:func:`read_dist`). None
    where they do not read so (the caller then asks torch.load or megatron-core)."""
    common = directory / COMMON_STATE
    return read(common) if common.is_file() else read_dist(directory)


def read_dist(directory: Path) -> Optional[argparse.Namespace]:
    """``args`` of a ``torch_dist`` checkpoint that keeps its common state inside (megatron-core
    0.19 on): torch's ``.metadata`` pickle says which ``.distcp`` file holds that object's
    ``torch.save`` bytes, and where. None where the metadata does not read so (the caller then
    asks megatron-core)."""
    try:
        with open(directory / ".metadata", "rb") as f:
            metadata = _Unpickler(f).load()
        storage = metadata.state["storage_data"]
        place = next(info.state for index, info in storage.items()
                     if index.state["fqn"] == COMMON_STATE_KEY)
        if place.get("transform_descriptors"):  # compressed or otherwise transformed
            return None
        with open(directory / place["relative_path"], "rb") as f:
            f.seek(place["offset"])
            blob = f.read(place["length"])
        return _args_in_zip(io.BytesIO(blob), one_of=True)
    except (OSError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, EOFError,
            ValueError, IndexError, KeyError, StopIteration, struct.error):
        return None


def _args_in_zip(f, one_of=False) -> Optional[argparse.Namespace]:
    """``args`` of the ``torch.save`` zip in the seekable binary file ``f``, or None;
    ``one_of``: the state saved is a list of one (as a sharded object's is)."""
    try:
        with zipfile.ZipFile(f) as archive:
            pickles = [i for i in archive.infolist() if i.filename.endswith("/data.pkl")]
        if len(pickles) != 1 or pickles[0].compress_type != zipfile.ZIP_STORED:
            return None
        state = _Unpickler(io.BytesIO(_stored_bytes(f, pickles[0]))).load()
    except (OSError, zipfile.BadZipFile, pickle.UnpicklingError, AttributeError, ImportError,
            TypeError, EOFError, ValueError, IndexError, KeyError, struct.error):
        return None
    if one_of:
        state = state[0] if isinstance(state, list) and len(state) == 1 else None
    args = state.get("args") if isinstance(state, dict) else None
    return args if isinstance(args, argparse.Namespace) else None


def _stored_bytes(f, entry: zipfile.ZipInfo) -> bytes:
    """An uncompressed entry's bytes, read past its local header. Not ``ZipFile.open``: that
    checks the entry's CRC-32, which torch.save leaves out when asked to
    (``torch.serialization.set_crc32_options(False)``, as import-hf saves) and torch.load never
    checks."""
    f.seek(entry.header_offset)
    header = f.read(30)
    if header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"no local header at {entry.header_offset}")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    f.seek(entry.header_offset + 30 + name_length + extra_length)
    return f.read(entry.compress_size)
