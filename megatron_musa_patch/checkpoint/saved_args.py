"""The args stock ``pretrain_gpt.py`` stored in a checkpoint, read without torch or megatron-core.

A ``torch.save`` file is a zip whose ``*/data.pkl`` is the pickle; its tensors' bytes are other
entries, which it names through ``persistent_load``. ``torch.load`` imports what the pickle names
(torch; megatron-core for the enums among the args: two to three seconds on 2 cores) and, for a
``torch``-format checkpoint, reads every tensor of the rank's model. The conversion needs only
the args' plain values (sizes, flags, names), so here whatever the pickle names from torch or
megatron is an :class:`Opaque` stand-in and no tensor is read. The values that are not plain
(dtypes, enums, tensors) are stand-ins: nothing in ``mmp checkpoint`` reads them.
"""

from __future__ import annotations

import argparse
import io
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Optional

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
        with zipfile.ZipFile(path) as archive:
            pickles = [i for i in archive.infolist() if i.filename.endswith("/data.pkl")]
        if len(pickles) != 1 or pickles[0].compress_type != zipfile.ZIP_STORED:
            return None
        state = _Unpickler(io.BytesIO(_stored_bytes(path, pickles[0]))).load()
    except (OSError, zipfile.BadZipFile, pickle.UnpicklingError, AttributeError, ImportError,
            TypeError, EOFError, ValueError, IndexError, KeyError, struct.error):
        return None
    args = state.get("args") if isinstance(state, dict) else None
    return args if isinstance(args, argparse.Namespace) else None


def _stored_bytes(path: Path, entry: zipfile.ZipInfo) -> bytes:
    """An uncompressed entry's bytes, read past its local header. Not ``ZipFile.open``: that
    checks the entry's CRC-32, which torch.save leaves out when asked to
    (``torch.serialization.set_crc32_options(False)``, as import-hf saves) and torch.load never
    checks."""
    with open(path, "rb") as f:
        f.seek(entry.header_offset)
        header = f.read(30)
        if header[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"{path}: no local header at {entry.header_offset}")
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        f.seek(entry.header_offset + 30 + name_length + extra_length)
        return f.read(entry.compress_size)
