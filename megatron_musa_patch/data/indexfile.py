"""Megatron's ``.idx`` index format, written and read with numpy alone.

megatron-core's ``indexed_dataset`` module imports torch (and, through the ``megatron.core``
package, most of megatron-core): seconds of start-up for what is a header and three arrays. This
module holds the format so that ``mmp data prepare`` and ``mmp data blend`` start without it.
It is checked against megatron-core, not trusted blindly:

* the tests write the same documents with megatron-core's ``IndexedDatasetBuilder`` and compare
  the bytes, and read pairs back with its ``IndexedDataset`` (``tests/data/test_units.py``);
* ``light.check_in_process`` (once per tokenizer and library versions) compares the header, the
  dtype codes and ``DType.optimal_dtype`` with the installed megatron-core's and writes a small
  index both ways, so a format change upstream turns the fast start-up off instead of writing
  files training cannot read.

Layout (little-endian), as megatron-core's ``_IndexWriter`` writes it: the magic, version 1
(``<Q``), the token dtype code (``<B``), the sequence count and the document count (``<Q`` each),
then int32 sequence lengths, int64 sequence byte offsets into the ``.bin`` and int64 document
indices (the sequence index each document ends at, starting with 0).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Optional

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
#: numpy dtype name -> code (megatron-core's ``DType`` enum)
CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6,
         "float32": 7, "uint16": 8}
HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8
#: vocabularies below this size get uint16 token ids, others int32 (``DType.optimal_dtype``)
UINT16_BELOW = 65500


def optimal_dtype(vocab_size: Optional[int]):
    """The token dtype preprocess_data.py picks for a vocabulary of this size."""
    if vocab_size is not None and vocab_size < UINT16_BELOW:
        return np.uint16
    return np.int32


def write_index(path: str, dtype, sequence_lengths, document_indices) -> None:
    """Write ``path`` as megatron-core's ``IndexedDatasetBuilder.finalize`` does for text data
    (no sequence modes). ``sequence_lengths``: int32 per sequence; ``document_indices``: int64,
    0 first, then the sequence count at the end of each document."""
    dtype = np.dtype(dtype)
    lengths = np.asarray(sequence_lengths, dtype=np.int32)  # array("i") converts without a loop
    docs = np.asarray(document_indices, dtype=np.int64)
    pointers = np.zeros(lengths.size, dtype=np.int64)
    if lengths.size > 1:
        np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
    pointers *= dtype.itemsize
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", CODES[dtype.name]))
        f.write(struct.pack("<Q", lengths.size))
        f.write(struct.pack("<Q", docs.size))
        f.write(lengths.tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(docs.tobytes(order="C"))


class IndexFormatError(ValueError):
    """The file is not a text ``.idx`` this module (and megatron-core's reader) understands."""


@dataclass
class Index:
    dtype: np.dtype
    sequence_lengths: np.ndarray   # int32
    sequence_pointers: np.ndarray  # int64
    document_indices: np.ndarray   # int64


def read_index(path: str) -> Index:
    """The arrays of ``path`` (memory-mapped), with the checks megatron-core's ``_IndexReader``
    asserts: magic, version, a known dtype code, and arrays as long as the counts say."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[:len(MAGIC)] != MAGIC:
        raise IndexFormatError("bad header (not a Megatron .idx file)")
    version, code, sequences, documents = struct.unpack("<QBQQ", head[len(MAGIC):])
    if version != VERSION:
        raise IndexFormatError(f"index version {version}, expected {VERSION}")
    names = {c: n for n, c in CODES.items()}
    if code not in names:
        raise IndexFormatError(f"unknown token dtype code {code}")
    need = HEADER_BYTES + sequences * (4 + 8) + documents * 8
    if size < need:
        raise IndexFormatError(f"{size} bytes, too short for {sequences} sequences and "
                               f"{documents} document indices ({need} bytes)")
    buf = np.memmap(path, mode="r", dtype=np.uint8)
    offset = HEADER_BYTES
    lengths = np.frombuffer(buf, dtype=np.int32, count=sequences, offset=offset)
    offset += lengths.nbytes
    pointers = np.frombuffer(buf, dtype=np.int64, count=sequences, offset=offset)
    offset += pointers.nbytes
    docs = np.frombuffer(buf, dtype=np.int64, count=documents, offset=offset)
    return Index(np.dtype(names[code]), lengths, pointers, docs)
