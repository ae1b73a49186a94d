"""Byte-identical to Megatron-LM's own tools/preprocess_data.py (needs MEGATRON_LM_PATH)."""

from __future__ import annotations

import pytest

from megatron_musa_patch.data import reference
from tests.data.mmp_data_helpers import data_main, make_docs, run_mmp, same_files, write_jsonl

pytestmark = pytest.mark.skipif(
    reference.checkout() is None,
    reason="MEGATRON_LM_PATH is unset (or has no tools/preprocess_data.py): the comparison with "
           "upstream preprocess_data.py needs a Megatron-LM checkout; CI checks against the "
           "same algorithm in test_prepare.py instead")


def upstream(argv, env=None):
    import os

    return reference.run_preprocess_data([str(a) for a in argv],
                                         env=dict(os.environ, **(env or {})), timeout=600)


def assert_same(ours, theirs, exts=(".bin", ".idx")):
    for ext in exts:
        assert same_files(str(ours) + ext, str(theirs) + ext), f"{ours}{ext} differs"


def test_hf_sentences_two_keys(tmp_path, hf_tokenizer):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(300, seed=11, sentences=True))
    tok = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", hf_tokenizer,
           "--json-keys", "text", "title", "--append-eod", "--workers", "2"]
    upstream(["--input", src, "--output-prefix", tmp_path / "up"] + tok)
    assert data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "ours",
                      "--chunk-size", 4096, "--no-progress"] + tok) == 0
    # upstream finalizes only the last key's .idx (its loop leaves `key` at the last one)
    assert_same(tmp_path / "ours_text_document", tmp_path / "up_text_document", (".bin",))
    assert_same(tmp_path / "ours_title_document", tmp_path / "up_title_document")


def test_hf_light_start_up_first_use_and_cached(tmp_path, hf_tokenizer):
    """A fresh `mmp` process, as a user runs it: the first run checks the tokenizer against
    megatron-core's builder while it works, the second uses the cached check; both write
    upstream's bytes."""
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(300, seed=14))
    tok = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", hf_tokenizer,
           "--append-eod", "--workers", "2"]
    upstream(["--input", src, "--output-prefix", tmp_path / "up"] + tok)
    env = {"MMP_CACHE_DIR": str(tmp_path / "cache")}
    for run, note in (("first", "meanwhile (first use)"), ("cached", "checked against")):
        proc = run_mmp(["prepare", "--input", src, "--output-prefix", tmp_path / run,
                        "--chunk-size", 4096] + tok, env=env)
        assert proc.returncode == 0, proc.stderr
        assert note in proc.stderr
        assert_same(tmp_path / f"{run}_text_document", tmp_path / "up_text_document")


@pytest.mark.parametrize("kind", ["SentencePieceTokenizer", "Llama2Tokenizer"])
def test_sentencepiece(tmp_path, sp_model, kind):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(200, seed=12))
    tok = ["--tokenizer-type", kind, "--tokenizer-model", sp_model, "--workers", "2"]
    if kind == "Llama2Tokenizer":
        tok.append("--append-eod")
    upstream(["--input", src, "--output-prefix", tmp_path / "up"] + tok)
    assert data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "ours",
                      "--no-progress"] + tok) == 0
    assert_same(tmp_path / "ours_text_document", tmp_path / "up_text_document")


def test_null_tokenizer(tmp_path):
    rows = [{"text": " ".join(str((i * 31 + j) % 70000) for j in range(i % 9 + 1))}
            for i in range(200)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    tok = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "70000", "--append-eod",
           "--workers", "3"]
    upstream(["--input", src, "--output-prefix", tmp_path / "up"] + tok)
    assert data_main(["prepare", "--input", src, "--output-prefix", tmp_path / "ours",
                      "--no-progress"] + tok) == 0
    assert_same(tmp_path / "ours_text_document", tmp_path / "up_text_document")


def test_gpt2bpe(tmp_path, gpt2_files):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(200, seed=13))
    tok = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", gpt2_files["vocab"],
           "--merge-file", gpt2_files["merges"], "--append-eod", "--workers", "2"]
    upstream(["--input", src, "--output-prefix", tmp_path / "up"] + tok, env=gpt2_files["env"])
    proc = run_mmp(["prepare", "--input", src, "--output-prefix", tmp_path / "ours",
                    "--no-progress"] + tok, env=gpt2_files["env"])
    assert proc.returncode == 0, proc.stderr
    assert_same(tmp_path / "ours_text_document", tmp_path / "up_text_document")
