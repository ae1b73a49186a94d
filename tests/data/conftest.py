"""Fixtures for the ``mmp data`` tests: small corpora and tokenizers trained offline in tmp dirs.

Nothing is downloaded: the byte-level BPE comes from ``mmp data train-tokenizer``, the GPT-2
files are that tokenizer's vocab/merges, the SentencePiece model is trained with the
sentencepiece library.
"""

from __future__ import annotations

import json
import os
import random

import pytest

from tests.data.mmp_data_helpers import data_main, make_docs, make_text, write_jsonl

# ------------------------------------------------------------------ session fixtures
@pytest.fixture(scope="session", autouse=True)
def tokenizer_check_cache(tmp_path_factory):
    """The records of `light`'s tokenizer checks go to a fresh directory per test session (not
    the user's ~/.cache), shared by the tests: the first run with a tokenizer checks it."""
    path = tmp_path_factory.mktemp("mmp-cache")
    old = os.environ.get("MMP_CACHE_DIR")
    os.environ["MMP_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("MMP_CACHE_DIR", None)
    else:
        os.environ["MMP_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    write_jsonl(d / "train.jsonl", make_docs(400, seed=1))
    return d


@pytest.fixture(scope="session")
def hf_tokenizer(tmp_path_factory, corpus_dir):
    """A byte-level BPE trained by `mmp data train-tokenizer` (vocab 600)."""
    out = tmp_path_factory.mktemp("tok") / "bpe"
    assert data_main(["train-tokenizer", "--input", corpus_dir / "train.jsonl", "--output-dir",
                      out, "--vocab-size", "600", "--min-frequency", "1"]) == 0
    return str(out)


@pytest.fixture(scope="session")
def gpt2_files(tmp_path_factory, hf_tokenizer):
    """vocab.json + merges.txt, and an HF cache holding them as the hub model 'gpt2'
    (megatron-core 0.16 builds GPT2BPETokenizer through AutoTokenizer('gpt2'))."""
    d = tmp_path_factory.mktemp("gpt2")
    with open(os.path.join(hf_tokenizer, "tokenizer.json"), encoding="utf-8") as f:
        model = json.load(f)["model"]
    vocab = d / "vocab.json"
    merges = d / "merges.txt"
    vocab.write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [m if isinstance(m, str) else " ".join(m)
                                 for m in model["merges"]]
    merges.write_text("\n".join(lines) + "\n", encoding="utf-8")
    commit = "0" * 40
    repo = d / "hf" / "hub" / "models--gpt2"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (snap / "vocab.json").write_bytes(vocab.read_bytes())
    (snap / "merges.txt").write_bytes(merges.read_bytes())
    (snap / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (snap / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "model_max_length": 1024}))
    env = {"HF_HOME": str(d / "hf"), "HF_HUB_OFFLINE": "1"}
    return {"vocab": str(vocab), "merges": str(merges), "env": env}


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory):
    """A tiny SentencePiece model (byte fallback, so every character encodes)."""
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("sp")
    rng = random.Random(7)
    sentences = [make_text(rng, 20).replace("<|endoftext|>", "eos") for _ in range(300)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=str(d / "sp"), vocab_size=400,
        model_type="bpe", character_coverage=1.0, byte_fallback=True, minloglevel=2)
    return str(d / "sp.model")
