"""One ``.bin/.idx`` pair, written aside and renamed into place only when complete.

The ``.bin`` is the token ids, appended chunk by chunk; the ``.idx`` is written at the end in
Megatron's index format (``indexfile``: the bytes megatron-core's IndexedDatasetBuilder writes,
without importing megatron-core, whose import costs seconds of start-up).

While a pair is being written its files are ``<prefix>.bin.mmp-tmp-<pid>`` and
``<prefix>.idx.mmp-tmp-<pid>``. Commit removes the old manifest and ``.idx`` first, then renames
``.bin`` and ``.idx`` (``.idx`` last), then writes the manifest: whenever the run stops, either
both final files are complete or ``.idx`` is missing, so nothing incomplete looks finished.
"""

from __future__ import annotations

import glob
import os
from array import array
from typing import Optional

import numpy as np

from . import indexfile, manifest
from .types import Packed

TMP = ".mmp-tmp-"


class PairWriter:
    def __init__(self, prefix: str, dtype):
        self.prefix = prefix
        directory = os.path.dirname(os.path.abspath(prefix))
        os.makedirs(directory, exist_ok=True)
        remove_stale_temporaries(prefix)
        self.tmp_bin = f"{prefix}.bin{TMP}{os.getpid()}"
        self.tmp_idx = f"{prefix}.idx{TMP}{os.getpid()}"
        self.dtype = np.dtype(dtype)
        self.data_file = open(self.tmp_bin, "wb")
        # compact storage for the per-sequence index (4-8 bytes an entry instead of a Python
        # int object)
        self.sequence_lengths = array("i")  # itemsize 4: int32 bytes append as-is
        self.document_indices = array("q", [0])  # itemsize 8: int64
        self.documents = 0
        self.tokens = 0

    def add(self, packed: Packed) -> None:
        """Append a chunk's documents: the same bytes and index entries as calling
        ``IndexedDatasetBuilder.add_document(doc_ids, sentence_lens)`` once per document (which
        preprocess_data.py does), in one write."""
        self.data_file.write(packed.tokens.tobytes(order="C"))  # already in the output dtype
        base = len(self.sequence_lengths)
        self.sequence_lengths.frombytes(packed.seq_lengths.astype(np.int32).tobytes())
        ends = base + np.cumsum(packed.doc_seq_counts, dtype=np.int64)
        self.document_indices.frombytes(ends.tobytes())
        self.documents += int(packed.doc_seq_counts.size)
        self.tokens += int(packed.tokens.size)

    def commit(self, record: Optional[dict]) -> None:
        self.data_file.close()
        indexfile.write_index(self.tmp_idx, self.dtype, self.sequence_lengths,
                              self.document_indices)
        manifest.clear(self.prefix)
        for suffix in (".idx", ".bin"):
            if os.path.exists(self.prefix + suffix):
                os.remove(self.prefix + suffix)
        os.replace(self.tmp_bin, self.prefix + ".bin")
        os.replace(self.tmp_idx, self.prefix + ".idx")
        if record is not None:
            record = dict(record, documents=self.documents, tokens=self.tokens,
                          bin_bytes=os.path.getsize(self.prefix + ".bin"),
                          idx_bytes=os.path.getsize(self.prefix + ".idx"))
            manifest.write(self.prefix, record)

    def abort(self) -> None:
        try:
            self.data_file.close()
        except Exception:  # noqa: BLE001 - best effort clean-up
            pass
        for path in (self.tmp_bin, self.tmp_idx):
            if os.path.exists(path):
                os.remove(path)


def remove_stale_temporaries(prefix: str) -> None:
    """Temporaries of runs that died (their pid is gone) are garbage."""
    for path in glob.glob(glob.escape(prefix) + ".*" + TMP + "*"):
        pid = path.rsplit(TMP, 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                os.remove(path)
            except OSError:
                pass


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # an earlier writer of this process that was aborted
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
