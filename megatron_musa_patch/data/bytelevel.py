"""A piece cache in front of a GPT-2-style byte-level BPE: the library's ids, several times faster.

The ``tokenizers`` library spends about a microsecond per token, and most of that on pieces
(words, runs of punctuation or spaces) a corpus repeats over and over. Here the text is split
with the same GPT-2 pattern by the ``regex`` module (C speed), each piece is looked up in a dict,
and only pieces not seen before go to the library's own BPE model (``backend.model.tokenize``)
after the same byte-to-unicode mapping. Nothing is re-implemented except the split.

Used only where that is exactly what ``Tokenizer.encode(text, add_special_tokens=False)`` does:

* the tokenizer has no normalizer, its pre-tokenizer is ``ByteLevel(use_regex=True)`` and its
  model is BPE without dropout (the split is then the only step we run ourselves);
* the two regex engines classify characters alike: ``\\p{L}``, ``\\p{N}`` and ``\\s`` are compared
  over the whole Basic Multilingual Plane against the library's own engine when the encoder is
  built (they differ on characters newer Unicode versions added);
* per text: a text holding an added/special token, a character outside the BMP, a surrogate or a
  character the engines disagree on is encoded by the library itself.

A sample of texts is also encoded by the library and compared; a difference stops the run (it
would be a bug here), naming ``--exact-tokenize``.
"""

from __future__ import annotations

import re
from typing import Callable, List, Optional

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CLASSES = (r"\p{L}", r"\p{N}", r"\s")
CHECK_EVERY = 1009       # texts between two comparisons with the library
MAX_CACHED_PIECE = 256   # longer pieces are tokenized but not remembered
MAX_CACHE = 1 << 18      # pieces remembered per worker (then the cache starts over)


class FastPathMismatch(RuntimeError):
    """The cached path gave other ids than the tokenizer: a bug, never a property of the data."""


def bytes_to_unicode() -> dict:
    """GPT-2's reversible byte -> printable character table (also the library's)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _bmp() -> str:
    return "".join(chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF)


def build(backend) -> Optional[Callable[[str], List[int]]]:
    """``encode(text) -> ids`` equal to ``backend.encode(text, add_special_tokens=False).ids``,
    or None when this tokenizer is not one the cache can stand in front of."""
    try:
        import regex
        from tokenizers import Regex, models, pre_tokenizers
    except ImportError:
        return None
    pre = backend.pre_tokenizer
    if (backend.normalizer is not None or type(pre) is not pre_tokenizers.ByteLevel
            or not pre.use_regex or type(backend.model) is not models.BPE
            or backend.model.dropout not in (None, 0.0)):
        return None
    prefix_space = bool(pre.add_prefix_space)
    bmp = _bmp()
    # the byte mapping, checked against the library on every byte valid UTF-8 can hold
    table = str.maketrans({chr(b): c for b, c in bytes_to_unicode().items()})
    sample = bmp + "\U0001F642\U00010348"
    plain = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if [p for p, _ in plain.pre_tokenize_str(sample)] != [
            sample.encode("utf-8").decode("latin-1").translate(table)]:
        return None
    # characters the two regex engines classify differently: leave them to the library
    disagree = set()
    for cls in CLASSES:
        theirs = "".join(p for p, _ in
                         pre_tokenizers.Split(Regex(cls), behavior="removed").pre_tokenize_str(bmp))
        ours = regex.sub(cls, "", bmp)
        if theirs != ours:
            disagree |= set(theirs) ^ set(ours)
    # the whole pattern, once over the BMP and on probes: our split, mapped, is the library's
    findall = regex.compile(GPT2_PATTERN).findall
    probe = "".join(c for c in bmp if c not in disagree)
    for text in (probe, " x  y\n\n z's 'S'll 12 3.4 \t\r\n  end ", "a\u00a0\u2028b\u3000c  "):
        theirs = [p for p, _ in pre_tokenizers.ByteLevel(
            add_prefix_space=False, use_regex=True).pre_tokenize_str(text)]
        ours = [p.encode("utf-8").decode("latin-1").translate(table) for p in findall(text)]
        if theirs != ours:
            return None
    unsafe = "\ud800-\udfff\U00010000-\U0010ffff" + "".join(re.escape(c) for c in disagree)
    unsafe_search = re.compile(f"[{unsafe}]").search
    added = sorted({t.content for t in backend.get_added_tokens_decoder().values()
                    if t.content}, key=len, reverse=True)
    added_search = (re.compile("|".join(re.escape(t) for t in added)).search if added
                    else (lambda text: None))
    tokenize = backend.model.tokenize
    library = backend.encode
    cache: dict = {}
    counter = [0]

    def encode(text: str) -> List[int]:
        """ids of one text; pieces come from the cache as tuples (smaller than lists)"""
        if unsafe_search(text) or added_search(text) or (prefix_space and not text):
            return library(text, add_special_tokens=False).ids
        source = text
        if prefix_space and text[0] != " ":
            text = " " + text  # what ByteLevel(add_prefix_space=True) does before splitting
        ids: List[int] = []
        get = cache.get
        for piece in findall(text):
            got = get(piece)
            if got is None:
                mapped = piece.encode("utf-8").decode("latin-1").translate(table)
                got = tuple([t.id for t in tokenize(mapped)])
                if len(piece) <= MAX_CACHED_PIECE:
                    if len(cache) >= MAX_CACHE:
                        cache.clear()
                    cache[piece] = got
            ids += got
        counter[0] += 1
        if counter[0] % CHECK_EVERY == 1 or CHECK_EVERY == 1:
            if library(source, add_special_tokens=False).ids != ids:
                raise FastPathMismatch(
                    "the cached byte-level BPE path and the tokenizer disagree on a text "
                    f"starting {source[:60]!r}")
        return ids

    return encode
