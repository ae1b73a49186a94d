"""The piece cache in front of byte-level BPE returns the library's ids, on text built to find
the places where two regex engines or the pipeline could differ."""

from __future__ import annotations

import os
import random

import pytest

from megatron_musa_patch.data import bytelevel

ALPHABETS = [
    "abcXYZ", "0123456789", "'sStTlLdDmMvVrReE", ".,;:!?-_()[]{}<>/\\|\"`~@#$%^&*+=",
    " ", "  ", "\t", "\n", "\r\n", "\x0b\x0c", "\x1c\x1d\x1e\x1f", "\x85\xa0", "\u2000\u2009\u200b",
    "\u2028\u2029\u3000\u180e\ufeff", "e\u0301", "数据训练データ한국어", "٠١٢३४²½Ⅻ", "αβγДЖя",
    "\u0558\u058b\ua7ce\ua7cf\u208f",  # letters only newer Unicode versions assign
    "🙂👍🏽\U00010348", "<|endoftext|>", "endoftext",
]


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(rng.choice(ALPHABETS)) if rng.random() < 0.7
                   else rng.choice(ALPHABETS) for _ in range(rng.randint(0, 40)))


@pytest.fixture(scope="module")
def backends(hf_tokenizer):
    from tokenizers import Tokenizer, pre_tokenizers

    plain = Tokenizer.from_file(os.path.join(hf_tokenizer, "tokenizer.json"))
    prefixed = Tokenizer.from_file(os.path.join(hf_tokenizer, "tokenizer.json"))
    prefixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    return {"plain": plain, "prefix-space": prefixed}


@pytest.mark.parametrize("name", ["plain", "prefix-space"])
def test_same_ids_as_the_library(backends, name):
    backend = backends[name]
    encode = bytelevel.build(backend)
    assert encode is not None
    rng = random.Random(5)
    texts = [random_text(rng) for _ in range(4000)] + ["", " ", "x", " x", "'s", "a'sb"]
    for text in texts:
        assert encode(text) == backend.encode(text, add_special_tokens=False).ids, repr(text)
    for text in texts[:500]:  # again, now from the cache
        assert encode(text) == backend.encode(text, add_special_tokens=False).ids, repr(text)


def test_not_used_where_it_would_not_be_exact(backends, hf_tokenizer):
    from tokenizers import Tokenizer, normalizers, pre_tokenizers

    t = Tokenizer.from_file(os.path.join(hf_tokenizer, "tokenizer.json"))
    t.normalizer = normalizers.NFKC()
    assert bytelevel.build(t) is None
    t = Tokenizer.from_file(os.path.join(hf_tokenizer, "tokenizer.json"))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(),
                                               pre_tokenizers.ByteLevel()])
    assert bytelevel.build(t) is None
    t = Tokenizer.from_file(os.path.join(hf_tokenizer, "tokenizer.json"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(use_regex=False)
    assert bytelevel.build(t) is None


def test_a_wrong_answer_is_caught(backends, monkeypatch):
    """A poisoned cache entry is found by the sampled comparison with the library."""
    monkeypatch.setattr(bytelevel, "CHECK_EVERY", 1)
    encode = bytelevel.build(backends["plain"])
    cache = next(c.cell_contents for c in encode.__closure__
                 if isinstance(c.cell_contents, dict))
    cache["hello"] = [1, 2, 3]
    with pytest.raises(bytelevel.FastPathMismatch, match="disagree"):
        encode("hello")
