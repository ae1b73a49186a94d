"""`mmp data prepare` writes what tools/preprocess_data.py writes (oracle: its algorithm run here
with megatron-core's builder), for every tokenizer path, many inputs, and odd documents."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.data.mmp_data_helpers import (data_main, make_docs, read_pair, reference_pairs,
                                         same_files, tokenizer_args, write_jsonl)


def build_tok(**kw):
    from megatron_musa_patch.data import tokenizer

    return tokenizer.build(tokenizer_args(**kw))


@pytest.mark.parametrize("append_eod", [False, True])
@pytest.mark.parametrize("workers", [1, 3])
def test_hf_identical_to_preprocess_algorithm(tmp_path, hf_tokenizer, append_eod, workers):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(300, seed=2))
    argv = ["prepare", "--input", src, "--output-prefix", tmp_path / "out", "--tokenizer-type",
            "HuggingFaceTokenizer", "--tokenizer-model", hf_tokenizer, "--workers", workers,
            "--chunk-size", 4096, "--no-progress"] + (["--append-eod"] if append_eod else [])
    assert data_main(argv) == 0
    tok = build_tok(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=hf_tokenizer)
    (ref,) = reference_pairs(src, tmp_path / "ref", tok, append_eod=append_eod)
    for ext in (".bin", ".idx"):
        assert same_files(str(tmp_path / "out_text_document") + ext, ref + ext), ext
    docs, dtype = read_pair(tmp_path / "out_text_document")
    assert len(docs) == 300 and dtype == np.uint16
    # document 5 is empty: no sequence at all, with or without eod
    assert docs[5] == []
    if append_eod:
        assert docs[0][-1][-1] == tok.eod


def test_sentence_lists_and_several_keys(tmp_path, hf_tokenizer):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(200, seed=3, sentences=True))
    assert data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "out",
                      "--json-keys", "text", "title", "--append-eod", "--tokenizer-type",
                      "HuggingFaceTokenizer", "--tokenizer-model", hf_tokenizer, "--workers", 2,
                      "--chunk-size", 2048, "--no-progress"]) == 0
    tok = build_tok(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=hf_tokenizer)
    refs = reference_pairs(src, tmp_path / "ref", tok, keys=("text", "title"), append_eod=True)
    for key, ref in zip(("text", "title"), refs):
        for ext in (".bin", ".idx"):
            assert same_files(f"{tmp_path}/out_{key}_document{ext}", ref + ext), (key, ext)
    docs, _ = read_pair(tmp_path / "out_text_document")
    multi = [d for d in docs if len(d) > 1]
    assert multi, "sentence lists must give documents of several sequences"


@pytest.mark.parametrize("kind", ["SentencePieceTokenizer", "Llama2Tokenizer"])
def test_sentencepiece_identical(tmp_path, sp_model, kind):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(150, seed=4, sentences=True))
    assert data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "out",
                      "--append-eod", "--tokenizer-type", kind, "--tokenizer-model", sp_model,
                      "--workers", 2, "--chunk-size", 4096, "--no-progress"]) == 0
    tok = build_tok(tokenizer_type=kind, tokenizer_model=sp_model)
    (ref,) = reference_pairs(src, tmp_path / "ref", tok, append_eod=True)
    for ext in (".bin", ".idx"):
        assert same_files(str(tmp_path / "out_text_document") + ext, ref + ext)


def test_null_tokenizer_identical(tmp_path):
    rows = [{"text": " ".join(str((i * 7 + j) % 900) for j in range(i % 13 + 1))}
            for i in range(120)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    assert data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "out",
                      "--append-eod", "--tokenizer-type", "NullTokenizer", "--vocab-size", 1000,
                      "--workers", 2, "--no-progress"]) == 0
    tok = build_tok(tokenizer_type="NullTokenizer", vocab_size=1000)
    (ref,) = reference_pairs(src, tmp_path / "ref", tok, append_eod=True)
    for ext in (".bin", ".idx"):
        assert same_files(str(tmp_path / "out_text_document") + ext, ref + ext)
    docs, _ = read_pair(tmp_path / "out_text_document")
    # the ids in the text, then eod (upstream's NullTokenizer: 1000 on 0.16, 999 from 0.17)
    assert tok.eod in (999, 1000) and docs[3][0].tolist() == [21, 22, 23, 24, tok.eod]


def test_gpt2bpe_identical(tmp_path, gpt2_files, hf_tokenizer):
    """GPT2BPETokenizer goes through AutoTokenizer('gpt2') in megatron-core 0.16: a fresh process
    with HF_HOME pointing at a cache that holds our files as 'gpt2', offline."""
    from tests.data.mmp_data_helpers import run_mmp

    src = write_jsonl(tmp_path / "in.jsonl", make_docs(120, seed=5))
    proc = run_mmp(["prepare", "--input", src, "--output-prefix", tmp_path / "out",
                    "--append-eod", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                    gpt2_files["vocab"], "--merge-file", gpt2_files["merges"], "--workers", 2,
                    "--no-progress"], env=gpt2_files["env"])
    assert proc.returncode == 0, proc.stderr
    # the same ids as the byte-level BPE these files came from
    tok = build_tok(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=hf_tokenizer)
    (ref,) = reference_pairs(src, tmp_path / "ref", tok, append_eod=True)
    for ext in (".bin", ".idx"):
        assert same_files(str(tmp_path / "out_text_document") + ext, ref + ext)


def test_many_inputs_one_pair_each(tmp_path, hf_tokenizer):
    d = tmp_path / "in"
    (d / "sub").mkdir(parents=True)
    a = write_jsonl(d / "a.jsonl", make_docs(50, seed=6))
    b_docs = make_docs(40, seed=7)
    with open(d / "sub" / "b.json", "w", encoding="utf-8") as f:
        json.dump(b_docs, f)  # a JSON array file
    (d / "c.txt").write_text("first line document\n\nsecond  one\r\nthird\n", encoding="utf-8")
    (d / "ignored.csv").write_text("not,an,input\n")
    out = tmp_path / "out"
    assert data_main(["prepare", "--input", d, "--output-dir", out, "--append-eod",
                      "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                      hf_tokenizer, "--workers", 2, "--no-progress"]) == 0
    names = sorted(n for n in os.listdir(out) if n.endswith((".bin", ".idx")))
    assert names == ["a.jsonl_document.bin", "a.jsonl_document.idx", "b.json_document.bin",
                     "b.json_document.idx", "c.txt_document.bin", "c.txt_document.idx"]
    tok = build_tok(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=hf_tokenizer)
    (ref,) = reference_pairs(a, tmp_path / "ref_a", tok, append_eod=True)
    assert same_files(f"{out}/a.jsonl_document.bin", ref + ".bin")
    assert same_files(f"{out}/a.jsonl_document.idx", ref + ".idx")
    # the array file holds the same kind of documents: same result as its JSON-lines form
    b_lines = write_jsonl(tmp_path / "b.jsonl", b_docs)
    (ref_b,) = reference_pairs(b_lines, tmp_path / "ref_b", tok, append_eod=True)
    assert same_files(f"{out}/b.json_document.bin", ref_b + ".bin")
    assert same_files(f"{out}/b.json_document.idx", ref_b + ".idx")
    # .txt: one document per non-blank line, without its line ending
    docs, _ = read_pair(out / "c.txt_document")
    want = [tok.tokenize(t) + [tok.eod] for t in ("first line document", "second  one", "third")]
    assert [d[0].tolist() for d in docs] == want


def test_txt_whole_file(tmp_path, hf_tokenizer):
    d = tmp_path / "in"
    d.mkdir()
    texts = {"x.txt": "line one\nline two\n\n", "y.txt": "only one"}
    for name, text in texts.items():
        (d / name).write_text(text, encoding="utf-8")
    assert data_main(["prepare", "--input", str(d / "*.txt"), "--output-dir", tmp_path / "out",
                      "--txt-whole-file", "--tokenizer-type", "HuggingFaceTokenizer",
                      "--tokenizer-model", hf_tokenizer, "--workers", 2, "--no-progress"]) == 0
    tok = build_tok(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=hf_tokenizer)
    for name, text in texts.items():
        docs, _ = read_pair(tmp_path / "out" / f"{name}_document")
        assert len(docs) == 1 and docs[0][0].tolist() == tok.tokenize(text)


def test_exact_path_matches_fast_path(tmp_path, hf_tokenizer, sp_model):
    """The batched encoders give the ids `tokenize` gives (the generic path is preprocess's)."""
    from megatron_musa_patch.data.tokenizer import TextEncoder
    from tests.data.mmp_data_helpers import make_text
    import random

    import shutil

    rng = random.Random(9)
    texts = [make_text(rng, rng.randint(0, 50)) for _ in range(300)] + ["", " ", "\n\n"]
    # the same tokenizer with a normalizer: not a case for the piece cache, one batch call
    nfc = tmp_path / "nfc"
    shutil.copytree(hf_tokenizer, nfc)
    model = json.loads((nfc / "tokenizer.json").read_text(encoding="utf-8"))
    model["normalizer"] = {"type": "NFC"}
    (nfc / "tokenizer.json").write_text(json.dumps(model), encoding="utf-8")
    # the piece cache serves tokenize() only: asked for explicitly (0.17+ default to tokenizer())
    for kw, path in ((dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=hf_tokenizer,
                           tokenizer_hf_include_special_tokens=False), "hf-piece-cache"),
                     (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=hf_tokenizer,
                           tokenizer_hf_include_special_tokens=True), "hf-batch"),
                     (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(nfc)),
                      "hf-batch"),
                     (dict(tokenizer_type="SentencePieceTokenizer", tokenizer_model=sp_model),
                      "sentencepiece-batch")):
        tok = build_tok(**kw)
        fast, exact = TextEncoder(tok), TextEncoder(tok, allow_fast=False)
        assert fast.path == path and exact.path == "generic"
        a, b = fast.encode(texts), exact.encode(texts)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        assert b[1].tolist() == [len(tok.tokenize(t)) for t in texts]


def test_hf_include_special_tokens(tmp_path, hf_tokenizer):
    from megatron_musa_patch.data.tokenizer import TextEncoder

    tok = build_tok(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=hf_tokenizer,
                    tokenizer_hf_include_special_tokens=True)
    enc = TextEncoder(tok)
    assert enc.path == "hf-batch"
    texts = ["a b c", "<|endoftext|> data", ""]
    flat, lens = enc.encode(texts)
    want = [tok.tokenize(t) for t in texts]
    assert lens.tolist() == [len(w) for w in want]
    assert flat.tolist() == [i for w in want for i in w]


def test_canonical_table_maps_token_strings():
    """Where a token string names another id, the fast path returns that id, like
    convert_tokens_to_ids(tokenize(text)) does."""
    from megatron_musa_patch.data.tokenizer import _canonical_ids

    class Backend:
        strings = {0: "a", 1: "b", 2: "a", 3: None, 4: "zz"}
        ids = {"a": 0, "b": 1}

        def id_to_token(self, i):
            return self.strings[i]

        def token_to_id(self, s):
            return self.ids.get(s)

    assert _canonical_ids(Backend(), 5, unk=1).tolist() == [0, 1, 0, 3, 1]
    assert _canonical_ids(Backend(), 5, unk=None).tolist() == [0, 1, 0, 3, -1]
