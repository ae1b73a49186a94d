"""The pieces: chunked line reading, input expansion, packing, the bulk writer, progress."""

from __future__ import annotations

import io
import json
import os
import random

import numpy as np
import pytest

from megatron_musa_patch.data import encode, inputs
from megatron_musa_patch.data.errors import DataError, line_number
from megatron_musa_patch.data.types import Packed


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_chunks_partition_lines_exactly(tmp_path, trailing_newline):
    rng = random.Random(0)
    lines = [b"x" * rng.choice([0, 1, 5, 50, 700]) + (b"\r" if i % 7 == 0 else b"")
             for i in range(400)]
    data = b"\n".join(lines) + (b"\n" if trailing_newline else b"")
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    f = inputs.InputFile(str(path), "jsonl", len(data))
    for size, first_bytes in ((1, 0), (7, 0), (64, 0), (333, 0), (4096, 0), (len(data) + 10, 0),
                              (333, 5), (4096, 100), (64, 64), (64, 1000)):
        ranges = inputs.chunks(f, size, first_bytes)
        assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous
        if 0 < first_bytes < size < len(data):
            assert ranges[0] == (0, first_bytes) and ranges[1][1] - ranges[1][0] == size
        got, firsts = [], []
        for start, end in ranges:
            first, chunk_lines = inputs.read_lines(str(path), start, end)
            if chunk_lines:
                firsts.append((first, len(got)))
            got.extend(chunk_lines)
        assert got == lines, size
        # the first offset of each chunk turns a chunk-local index into the right line number
        for first, n_before in firsts:
            assert line_number(str(path), first) == n_before + 1


def test_expand_dirs_globs_kinds(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "d" / "sub" / "b.json").write_text('  [{"text": "x"}]')
    (tmp_path / "d" / "sub" / "c.json").write_text('{"text": "x"}\n')
    (tmp_path / "d" / "t.txt").write_text("x\n")
    (tmp_path / "d" / ".hidden.jsonl").write_text("{}\n")
    (tmp_path / "d" / "notes.md").write_text("x")
    (tmp_path / "other.data").write_text('{"text": "x"}\n')
    files = inputs.expand([str(tmp_path / "d"), str(tmp_path / "d" / "*.jsonl"),
                           str(tmp_path / "other.data")])
    got = [(os.path.relpath(f.path, tmp_path), f.kind) for f in files]
    assert got == [("d/a.jsonl", "jsonl"), ("d/sub/b.json", "json_array"),
                   ("d/sub/c.json", "jsonl"), ("d/t.txt", "txt_lines"),
                   ("other.data", "jsonl")]
    assert inputs.expand([str(tmp_path / "d" / "t.txt")], txt_whole_file=True)[0].kind == \
        "txt_file"
    (tmp_path / "z.jsonl.gz").write_bytes(b"\x1f\x8b")
    with pytest.raises(DataError, match="compressed input is not supported"):
        inputs.expand([str(tmp_path / "z.jsonl.gz")])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match="holds no .jsonl, .json or .txt"):
        inputs.expand([str(tmp_path / "empty_dir")])


def naive_pack(sentence_ids, counts, append_eod, eod):
    """preprocess_data.py's Encoder.encode + add_document, one document at a time."""
    tokens, seq_lengths, doc_counts = [], [], []
    i = 0
    for c in counts:
        doc_ids, lens = [], []
        for ids in sentence_ids[i:i + c]:
            if len(ids) > 0:
                doc_ids.extend(ids)
                lens.append(len(ids))
        if doc_ids and append_eod:
            doc_ids.append(eod)
            lens[-1] += 1
        i += c
        tokens.extend(doc_ids)
        seq_lengths.extend(lens)
        doc_counts.append(len(lens))
    return tokens, seq_lengths, doc_counts


@pytest.mark.parametrize("append_eod", [False, True])
def test_pack_matches_per_document_loop(append_eod):
    rng = random.Random(1)
    for _ in range(50):
        counts = [rng.choice([0, 1, 1, 1, 2, 3]) for _ in range(rng.randint(0, 30))]
        sentences = [[rng.randint(0, 500) for _ in range(rng.choice([0, 0, 1, 4, 9]))]
                     for _ in range(sum(counts))]
        flat = np.array([t for s in sentences for t in s], dtype=np.int64)
        lens = np.array([len(s) for s in sentences], dtype=np.int64)
        settings = encode.Settings(("text",), append_eod, False, "uint16", 999, 1000)
        packed, problem = encode.pack(flat, lens, np.array(counts, dtype=np.int64), settings,
                                      np.dtype(np.uint16))
        assert problem is None
        want = naive_pack(sentences, counts, append_eod, 999)
        assert packed.tokens.dtype == np.uint16
        assert packed.tokens.tolist() == want[0]
        assert packed.seq_lengths.tolist() == want[1]
        assert packed.doc_seq_counts.tolist() == want[2]


def test_pack_reports_first_id_out_of_range():
    settings = encode.Settings(("text",), False, False, "uint16", 0, 100)
    flat = np.array([1, 2, 3, 70000, 5], dtype=np.int64)
    packed, problem = encode.pack(flat, np.array([2, 0, 3]), np.array([1, 1, 1]), settings,
                                  np.dtype(np.uint16))
    assert packed is None and problem[0] == 2 and "70000" in problem[1]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_bulk_writer_equals_add_document(tmp_path, dtype):
    """PairWriter.add + commit (our own .idx writer) writes the bytes megatron-core's builder
    writes with one add_document call per document, empty documents and empty chunks included."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from megatron_musa_patch.data.writer import PairWriter

    rng = random.Random(2)
    top = 60000 if dtype == np.uint16 else 2_000_000
    chunks = []
    for size in (5, 0, 20, 1, 13):
        counts = [rng.choice([0, 1, 2, 3]) for _ in range(size)]
        sentences = [[rng.randint(0, top) for _ in range(rng.randint(1, 9))]
                     for _ in range(sum(counts))]
        chunks.append((sentences, counts))
    ref = IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=dtype)
    w = PairWriter(str(tmp_path / "ours"), dtype)
    for sentences, counts in chunks:
        i = 0
        for c in counts:
            doc = sentences[i:i + c]
            ref.add_document([t for s in doc for t in s], [len(s) for s in doc])
            i += c
        w.add(Packed(np.array([t for s in sentences for t in s], dtype=dtype),
                     np.array([len(s) for s in sentences], dtype=np.int32),
                     np.array(counts, dtype=np.int64)))
    ref.finalize(str(tmp_path / "ref.idx"))
    w.commit(None)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["ours.bin", "ours.idx", "ref.bin", "ref.idx"]
    assert w.documents == sum(len(c) for _, c in chunks) == 39


def test_index_reader_agrees_with_megatron_core(tmp_path):
    """indexfile.read_index gives IndexedDataset's arrays, and refuses what its reader refuses."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    from megatron_musa_patch.data import indexfile

    b = IndexedDatasetBuilder(str(tmp_path / "a.bin"), dtype=np.int32)
    for doc, lens in (([1, 2, 3], [1, 2]), ([], []), ([70000, 5], [2])):
        b.add_document(doc, lens)
    b.finalize(str(tmp_path / "a.idx"))
    ours, theirs = indexfile.read_index(str(tmp_path / "a.idx")), IndexedDataset(
        str(tmp_path / "a"), mmap=True).index
    assert ours.dtype == np.int32 == theirs.dtype
    for name in ("sequence_lengths", "sequence_pointers", "document_indices"):
        assert np.array_equal(getattr(ours, name), getattr(theirs, name)), name
    assert ours.sequence_pointers.tolist() == [0, 4, 12]
    assert ours.document_indices.tolist() == [0, 2, 2, 3]
    data = (tmp_path / "a.idx").read_bytes()
    for name, bad, what in (("magic", b"XXIDIDX\x00\x00" + data[9:], "bad header"),
                            ("version", data[:9] + (2).to_bytes(8, "little") + data[17:],
                             "index version 2"),
                            ("code", data[:17] + bytes([99]) + data[18:], "dtype code 99"),
                            ("short", data[:-8], "too short")):
        (tmp_path / f"{name}.idx").write_bytes(bad)
        with pytest.raises(indexfile.IndexFormatError, match=what):
            indexfile.read_index(str(tmp_path / f"{name}.idx"))


def test_dtype_choice_and_codes_are_megatron_cores():
    from megatron.core.datasets.indexed_dataset import _INDEX_HEADER, DType

    from megatron_musa_patch.data import indexfile

    assert indexfile.MAGIC == _INDEX_HEADER
    assert indexfile.CODES == {d.name: d.value for d in DType}
    for vocab in (None, 0, 4096, 65499, 65500, 65535, 200000):
        assert indexfile.optimal_dtype(vocab) is DType.optimal_dtype(vocab), vocab


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_plain_lines_and_bar():
    from megatron_musa_patch.data.progress import Progress

    plain = io.StringIO()
    p = Progress(1000, log_interval=10, stream=plain, min_seconds=0)
    for _ in range(5):
        p.update(200, 6, 300)
    p.close()
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2  # every 10 documents: after 12 and after 24 (of 30)
    assert "documents" in lines[0] and "docs/s" in lines[0] and "tokens/s" in lines[0]
    assert "ETA" in lines[0] and "100.0%" not in lines[0] and lines[-1].startswith("prepare: 24")
    tty = Tty()
    bar = Progress(1000, stream=tty)
    assert bar.bar is not None
    bar.update(500, 10, 1000)
    bar.close()
    out = tty.getvalue()
    assert "docs/s" in out and "tokens/s" in out and "prepare" in out


def test_manifest_is_written_next_to_pair(tmp_path, hf_tokenizer):
    from tests.data.mmp_data_helpers import data_main, make_docs, write_jsonl

    src = write_jsonl(tmp_path / "in.jsonl", make_docs(20))
    assert data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "o",
                      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                      hf_tokenizer, "--no-progress"]) == 0
    record = json.loads((tmp_path / "o_text_document.mmp.json").read_text())
    assert record["input"]["path"] == src and record["documents"] == 20
    assert record["bin_bytes"] == os.path.getsize(tmp_path / "o_text_document.bin")
    assert record["settings"]["tokenizer"]["files"]["tokenizer_model"]  # content hash
