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


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_chunks_partition_lines_exactly(tmp_path, trailing_newline):
    rng = random.Random(0)
    lines = [b"x" * rng.choice([0, 1, 5, 50, 700]) + (b"\r" if i % 7 == 0 else b"")
             for i in range(400)]
    data = b"\n".join(lines) + (b"\n" if trailing_newline else b"")
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    f = inputs.InputFile(str(path), "jsonl", len(data))
    for size in (1, 7, 64, 333, 4096, len(data) + 10):
        got, firsts = [], []
        for start, end in inputs.chunks(f, size):
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


def test_bulk_writer_equals_add_document(tmp_path):
    """PairWriter.add writes what one add_document call per document writes."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from megatron_musa_patch.data.writer import PairWriter

    rng = random.Random(2)
    chunks = []
    for _ in range(5):
        counts = [rng.choice([0, 1, 2]) for _ in range(rng.randint(1, 20))]
        sentences = [[rng.randint(0, 60000) for _ in range(rng.randint(1, 9))]
                     for _ in range(sum(counts))]
        chunks.append((sentences, counts))
    ref = IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.uint16)
    w = PairWriter(str(tmp_path / "ours"), np.uint16)
    for sentences, counts in chunks:
        i = 0
        for c in counts:
            doc = sentences[i:i + c]
            ref.add_document([t for s in doc for t in s], [len(s) for s in doc])
            i += c
        w.add(encode.Packed(np.array([t for s in sentences for t in s], dtype=np.uint16),
                            np.array([len(s) for s in sentences], dtype=np.int32),
                            np.array(counts, dtype=np.int64)))
    ref.finalize(str(tmp_path / "ref.idx"))
    w.commit(None)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["ours.bin", "ours.idx", "ref.bin", "ref.idx"]


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
    from .mmp_data_helpers import data_main, make_docs, write_jsonl

    src = write_jsonl(tmp_path / "in.jsonl", make_docs(20))
    assert data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "o",
                      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                      hf_tokenizer, "--no-progress"]) == 0
    record = json.loads((tmp_path / "o_text_document.mmp.json").read_text())
    assert record["input"]["path"] == src and record["documents"] == 20
    assert record["bin_bytes"] == os.path.getsize(tmp_path / "o_text_document.bin")
    assert record["settings"]["tokenizer"]["files"]["tokenizer_model"]  # content hash
