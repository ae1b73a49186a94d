"""The tokenizer: megatron-core's own builder, its flags, a fingerprint, and batched encoders.

Training (``pretrain_gpt.py``) and ``tools/preprocess_data.py`` build their tokenizer with
megatron-core's ``build_tokenizer`` (``compat`` knows where each release has it); so do we, from
the same flags, so the ids and the ``eod`` token are the ones training expects.

Encoding is where the time goes, so :class:`TextEncoder` picks the fastest path that returns the
same ids as ``MegatronTokenizer.tokenize``:

* Hugging Face fast tokenizers: GPT-2-style byte-level BPEs go through a piece cache
  (``bytelevel``: split in Python, only new pieces reach the library's BPE model); others get one
  ``encode_batch`` call into the Rust backend per batch. ``tokenize`` goes text -> token strings
  -> ids; the strings map back to the ids the backend produced except where a string names
  another id (added tokens), which a precomputed id->id table (``canonical``) reproduces.
* SentencePiece (non-legacy): the processor's batched ``encode``.
* anything else (tiktoken, Null, slow HF tokenizers, legacy SentencePiece, subclasses that
  override a step): ``tokenize`` per text, exactly as preprocess_data.py does.

Each fast path is used only when the classes involved are the ones it was checked against, and
after it reproduces ``tokenize`` on a set of probe strings; otherwise the generic path runs.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import warnings
from contextlib import redirect_stdout
from dataclasses import dataclass
from itertools import chain
from types import SimpleNamespace
from typing import List, Optional, Sequence, Tuple

import numpy as np

from . import bytelevel, indexfile
from .errors import DataError

# what megatron-core 0.16's build_tokenizer knows how to build
SUPPORTED_TYPES = [
    "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
    "NullTokenizer",
]
# accepted by Megatron-LM's parser but not built by megatron-core's text builder
UNSUPPORTED_TYPES = ["MultimodalTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"]
SP_TYPES = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")

PROBES = [
    "Hello world", " leading space", "trailing space ", "two  spaces\tand a tab",
    "line one\nline two\n\n", "naïve café — “quotes” 数据 データ 🙂", "<|endoftext|>", "</s><s>",
    "<unk> <pad> [CLS] [SEP] [MASK]", "x y", "123 4567 89.0e-3", "def f(x):\n    return x**2\n",
    "\u00a0\u2028\u200b zero width", "ÅÅÅÅ" * 40,
    "emoji \U0001F642 and \U00010348 outside the BMP", "newer letters \u0558\ua7ce",
    "Hello<|endoftext|>world", "", " ", "\n",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The tokenizer flags of Megatron-LM's ``_add_tokenizer_args`` (same names and defaults)."""
    g = parser.add_argument_group("tokenizer (the flags of Megatron-LM's preprocess_data.py)")
    g.add_argument("--tokenizer-type", choices=SUPPORTED_TYPES + UNSUPPORTED_TYPES, default=None,
                   metavar="TYPE", help="which tokenizer megatron-core's builder makes: "
                   + ", ".join(SUPPORTED_TYPES))
    g.add_argument("--tokenizer-model", default=None,
                   help="HF tokenizer directory or hub id, SentencePiece .model, tiktoken file")
    g.add_argument("--vocab-file", default=None, help="vocabulary file (GPT2BPE, BERT, HF)")
    g.add_argument("--merge-file", default=None, help="BPE merges file (GPT2BPE, HF)")
    g.add_argument("--vocab-size", type=int, default=None,
                   help="NullTokenizer: ids are < this, eod = this; TikTokenizer: vocab size")
    g.add_argument("--tokenizer-metadata", default=None, help="tokenizer metadata JSON")
    g.add_argument("--tokenizer-special-tokens", nargs="+", default=None,
                   help="special tokens (HF additional tokens, legacy SentencePiece, tiktoken)")
    g.add_argument("--tokenizer-sentencepiece-legacy", action="store_true")
    # both releases' spellings; the default is the installed release's (0.16: off, 0.17+: on)
    g.add_argument("--tokenizer-hf-use-fast", dest="tokenizer_hf_use_fast",
                   action="store_true", default=None)
    g.add_argument("--tokenizer-hf-no-use-fast", dest="tokenizer_hf_use_fast",
                   action="store_false")
    g.add_argument("--tokenizer-hf-include-special-tokens",
                   dest="tokenizer_hf_include_special_tokens", action="store_true", default=None)
    g.add_argument("--tokenizer-hf-no-include-special-tokens",
                   dest="tokenizer_hf_include_special_tokens", action="store_false")
    g.add_argument("--tokenizer-sentencepiece-ignore-extra-whitespaces", type=_bool, default=True,
                   help=argparse.SUPPRESS)
    g.add_argument("--chat-template", default=None, help=argparse.SUPPRESS)
    g.add_argument("--trust-remote-code", action="store_true")
    g.add_argument("--tiktoken-pattern", default=None)
    g.add_argument("--tiktoken-num-special-tokens", type=int, default=1000)
    g.add_argument("--tiktoken-special-tokens", nargs="+", default=None)
    g.add_argument("--legacy-tokenizer", action="store_true",
                   help="not supported: the legacy builder lives in megatron.training")
    # accepted for drop-in compatibility; they do not change what preprocessing writes
    g.add_argument("--vocab-extra-ids", type=int, default=0, help=argparse.SUPPRESS)
    g.add_argument("--padded-vocab-size", type=int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help=argparse.SUPPRESS)


def _bool(text: str) -> bool:
    return str(text).strip().lower() in ("1", "true", "yes", "on")


def _release_default(value, fact: str) -> bool:
    """A flag left unset takes the installed release's default (``upstream.facts``)."""
    if value is not None:
        return bool(value)
    from megatron_musa_patch.upstream import facts
    from megatron_musa_patch.upstream.installed import megatron_core_version

    return facts.holds(fact, megatron_core_version())


def builder_args(args) -> SimpleNamespace:
    """The namespace ``build_tokenizer`` reads (what preprocess_data.py hands it), under the
    attribute names of every supported release (0.17 and 0.18 renamed some)."""
    use_fast = _release_default(args.tokenizer_hf_use_fast, "hf_tokenizer_fast_by_default")
    special = _release_default(args.tokenizer_hf_include_special_tokens,
                               "hf_tokenizer_special_tokens_by_default")
    return SimpleNamespace(
        tokenizer_type=args.tokenizer_type, tokenizer_model=args.tokenizer_model,
        vocab_file=args.vocab_file, merge_file=args.merge_file, vocab_size=args.vocab_size,
        tokenizer_metadata=args.tokenizer_metadata, metadata_path=args.tokenizer_metadata,
        tokenizer_special_tokens=args.tokenizer_special_tokens,
        special_tokens=args.tokenizer_special_tokens,
        tokenizer_sentencepiece_legacy=args.tokenizer_sentencepiece_legacy,
        tokenizer_sentencepiece_ignore_extra_whitespaces=getattr(
            args, "tokenizer_sentencepiece_ignore_extra_whitespaces", True),
        tokenizer_hf_use_fast=use_fast, tokenizer_hf_no_use_fast=not use_fast,
        tokenizer_hf_include_special_tokens=special,
        tokenizer_hf_no_include_special_tokens=not special,
        chat_template=getattr(args, "chat_template", None),
        trust_remote_code=args.trust_remote_code, tiktoken_pattern=args.tiktoken_pattern,
        tiktoken_num_special_tokens=args.tiktoken_num_special_tokens,
        tiktoken_special_tokens=args.tiktoken_special_tokens,
        legacy_tokenizer=False, rank=1, make_vocab_size_divisible_by=128,
        tensor_model_parallel_size=1, vocab_extra_ids=0, pad_vocab_size=True,
        padded_vocab_size=None)


def check_arguments(args) -> None:
    """Missing or contradictory tokenizer flags, reported before any work starts."""
    t = args.tokenizer_type
    if args.legacy_tokenizer:
        raise DataError("--legacy-tokenizer: the legacy tokenizer builder lives in "
                        "megatron.training, which `mmp data` does not import. Fix: drop the flag; "
                        "megatron-core's builder (what pretrain_gpt.py uses by default) is used.")
    if t is None:
        raise DataError("--tokenizer-type is required. Fix: e.g. --tokenizer-type "
                        "HuggingFaceTokenizer --tokenizer-model DIR.")
    if t in UNSUPPORTED_TYPES:
        raise DataError(f"--tokenizer-type {t}: megatron-core's text tokenizer builder does not "
                        f"build it. Fix: use one of {', '.join(SUPPORTED_TYPES)}.")

    def need(flag, value, what):
        if not value:
            raise DataError(f"--tokenizer-type {t} needs {flag} ({what}).")
        if flag != "--tokenizer-model" or t != "HuggingFaceTokenizer":
            if not os.path.exists(value):
                raise DataError(f"{flag} {value}: no such file. Fix: check the path.")

    if t == "HuggingFaceTokenizer":
        need("--tokenizer-model", args.tokenizer_model, "a tokenizer directory or hub id")
    elif t in SP_TYPES:
        need("--tokenizer-model", args.tokenizer_model, "the SentencePiece .model file")
    elif t == "TikTokenizer":
        need("--tokenizer-model", args.tokenizer_model, "the tiktoken vocabulary file")
    elif t == "GPT2BPETokenizer":
        need("--vocab-file", args.vocab_file, "GPT-2 vocab.json")
        need("--merge-file", args.merge_file, "GPT-2 merges.txt")
    elif t.startswith("BertWordPiece"):
        need("--vocab-file", args.vocab_file, "the WordPiece vocab.txt")
    elif t == "NullTokenizer" and not args.vocab_size:
        raise DataError("--tokenizer-type NullTokenizer needs --vocab-size (ids in the text are "
                        "below it; the eod id is the vocab size).")


def build(args):
    """megatron-core's tokenizer for these flags; a load failure becomes a DataError."""
    check_arguments(args)
    with warnings.catch_warnings():
        # megatron.core's package import warns about TE/Apex, irrelevant to tokenizing
        warnings.simplefilter("ignore")
        from megatron_musa_patch.upstream.targets import load

        build_tokenizer = load("build_tokenizer")
    try:
        with redirect_stdout(io.StringIO()):
            return build_tokenizer(builder_args(args))
    except Exception as exc:  # noqa: BLE001 - any failure of the library is the user's to fix
        raise DataError(_load_failure(args, exc)) from None


def _load_failure(args, exc: Exception) -> str:
    detail = " ".join(str(exc).split())[:600]
    t = args.tokenizer_type
    source = args.tokenizer_model or args.vocab_file
    msg = (f"could not load the tokenizer (--tokenizer-type {t}, {source}): "
           f"{type(exc).__name__}: {detail}.")
    if t in ("GPT2BPETokenizer",) or t.startswith("BertWordPiece"):
        name = "gpt2" if t == "GPT2BPETokenizer" else "bert-large-(un)cased"
        msg += (f" Note: megatron-core 0.16 builds {t} through transformers' AutoTokenizer for "
                f"the hub model {name!r}, so it needs that model in the Hugging Face cache (or "
                "network access). Fix: populate the cache once, or save the tokenizer to a "
                "directory and use --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR.")
    elif t == "HuggingFaceTokenizer":
        msg += (" Fix: point --tokenizer-model at a directory holding tokenizer.json (and "
                "tokenizer_config.json), e.g. one written by `mmp data train-tokenizer`.")
    else:
        msg += " Fix: check the tokenizer flags and files."
    return msg


def output_dtype(vocab_size: Optional[int]):
    """The index dtype preprocess_data.py picks: uint16 below 65500 tokens, else int32."""
    if vocab_size is not None and vocab_size > np.iinfo(np.int32).max:
        raise DataError(f"the tokenizer reports {vocab_size} tokens, more than the int32 index "
                        "of Megatron's .bin format can hold. Fix: use a tokenizer whose "
                        "vocabulary fits in 2**31 - 1 ids.")
    return indexfile.optimal_dtype(vocab_size)


def fingerprint(args) -> dict:
    """What decides the ids: the flags and the content of every tokenizer file, plus versions."""
    files = {}
    for flag in ("tokenizer_model", "vocab_file", "merge_file", "tokenizer_metadata"):
        path = getattr(args, flag)
        if path and os.path.exists(path):
            files[flag] = _hash_path(path)
    from importlib import metadata

    versions = {}
    for dist in ("megatron-core", "transformers", "tokenizers", "sentencepiece", "tiktoken"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    flags = {k: v for k, v in vars(builder_args(args)).items()}
    return {"flags": flags, "files": files, "versions": versions}


def _hash_path(path: str) -> str:
    h = hashlib.sha256()
    paths = [path]
    if os.path.isdir(path):
        paths = sorted(os.path.join(path, n) for n in os.listdir(path)
                       if os.path.isfile(os.path.join(path, n)))
    for p in paths:
        h.update(os.path.basename(p).encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class TextEncoder:
    """Encode a batch of texts to (flat int64 ids, per-text lengths), same ids as ``tokenize``."""

    #: texts handed to the Rust backend per call (bounds the memory its Encoding objects take)
    BATCH_CHARS = 1 << 18

    def __init__(self, tokenizer, allow_fast: bool = True):
        self.tokenizer = tokenizer
        self.path = "generic"
        self.hf_params: Optional[HFParams] = None  # set when the HF fast path was examined
        self.hf_backend = None
        self._encode = self._encode_generic
        if allow_fast:
            for setup in (self._setup_hf, self._setup_sp):
                found = setup()
                if found is not None and self._agrees(found[1]):
                    self.path, self._encode = found
                    break

    def encode(self, texts: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
        return self._encode(texts)

    # --- generic: exactly what preprocess_data.py's workers call
    def _encode_generic(self, texts):
        tokenize = self.tokenizer.tokenize
        lists = [tokenize(t) for t in texts]
        return _flatten(lists)

    # --- Hugging Face fast tokenizers
    def _setup_hf(self):
        try:
            from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import (
                HuggingFaceTokenizer)
            from megatron.core.tokenizers.text.text_tokenizer import MegatronTokenizerText
            from tokenizers import Tokenizer
            from transformers import PreTrainedTokenizerFast
        except ImportError:
            return None
        tok = self.tokenizer
        lib = getattr(tok, "_tokenizer", None)
        if not isinstance(lib, HuggingFaceTokenizer):
            return None
        if (type(tok).tokenize is not MegatronTokenizerText.tokenize
                or type(lib).text_to_ids is not HuggingFaceTokenizer.text_to_ids
                or type(lib).text_to_tokens is not HuggingFaceTokenizer.text_to_tokens
                or type(lib).tokens_to_ids is not HuggingFaceTokenizer.tokens_to_ids):
            return None
        hf = lib.tokenizer
        backend = getattr(hf, "_tokenizer", None)
        if not isinstance(hf, PreTrainedTokenizerFast) or not isinstance(backend, Tokenizer):
            return None
        steps = ("tokenize", "convert_tokens_to_ids", "_convert_token_to_id_with_added_voc",
                 "__call__", "_encode_plus", "encode_plus")
        if any(getattr(type(hf), s, None) is not getattr(PreTrainedTokenizerFast, s, None)
               for s in steps):
            return None
        params = HFParams(with_special=bool(lib.include_special_tokens),
                          split_special=bool(getattr(hf, "split_special_tokens", False)),
                          size=len(hf), unk=hf.unk_token_id)
        self.hf_params = params
        self.hf_backend = backend
        return hf_encoder(backend, params, generic=self._encode_generic)

    # --- SentencePiece (megatron-core's wrapper, non-legacy)
    def _setup_sp(self):
        try:
            from megatron.core.tokenizers.text.libraries.sentencepiece_tokenizer import (
                SentencePieceTokenizer)
            from megatron.core.tokenizers.text.text_tokenizer import MegatronTokenizerText
        except ImportError:
            return None
        tok = self.tokenizer
        lib = getattr(tok, "_tokenizer", None)
        if not isinstance(lib, SentencePieceTokenizer) or lib.legacy:
            return None
        if lib.removed_extra_spaces and not lib.ignore_extra_whitespaces:
            return None
        if (type(tok).tokenize is not MegatronTokenizerText.tokenize
                or type(lib).text_to_ids is not SentencePieceTokenizer.text_to_ids
                or type(lib)._text_to_ids is not SentencePieceTokenizer._text_to_ids):
            return None
        sp = lib.tokenizer

        def encode(texts):
            # one thread: the worker processes are the parallelism
            return _flatten(sp.encode(list(texts), out_type=int, num_threads=1))

        return "sentencepiece-batch", encode

    def _agrees(self, encode) -> bool:
        want = self._encode_generic(PROBES)
        try:
            got = encode(PROBES)
        except Exception:  # noqa: BLE001 - a fast path that cannot run is simply not used
            return False
        return all(np.array_equal(a, b) for a, b in zip(want, got))


@dataclass(frozen=True)
class HFParams:
    """What the fast path takes from transformers' tokenizer object besides its Rust backend."""
    with_special: bool   # megatron's include_special_tokens: ids of tokenizer(text), not tokenize
    split_special: bool  # transformers' split_special_tokens (the backend's encode_special_tokens)
    size: int            # len(tokenizer): the ids convert_tokens_to_ids knows
    unk: Optional[int]   # what convert_tokens_to_ids gives for an unknown token string


def configure_backend(backend, params: HFParams) -> None:
    """What transformers sets on the backend before each call (no truncation, no padding)."""
    backend.no_truncation()
    backend.no_padding()
    if hasattr(backend, "encode_special_tokens"):
        backend.encode_special_tokens = params.split_special


def canonical_table(backend, params: HFParams) -> Optional[np.ndarray]:
    """The id -> id table ``convert_tokens_to_ids(tokenize(text))`` applies to the backend's ids;
    None when it is the identity (the usual case) or not applied (special tokens included)."""
    if params.with_special:
        return None
    canonical = _canonical_ids(backend, params.size, params.unk)
    if np.array_equal(canonical, np.arange(canonical.size)):
        return None  # every token string names its own id
    return canonical


def hf_encoder(backend, params: HFParams, generic=None):
    """``(path name, encode)`` over a Hugging Face Rust backend, with the ids megatron-core's
    ``tokenize`` gives for a PreTrainedTokenizerFast with these ``params``. ``generic`` is the
    exact text-by-text encoder, for the texts the canonical table cannot map; without one
    (``light``: no megatron-core tokenizer in this process) a non-identity table is refused."""
    configure_backend(backend, params)
    with_special = params.with_special
    canonical = canonical_table(backend, params)
    if canonical is not None and generic is None:
        raise ValueError("this tokenizer maps some token strings to other ids; the exact "
                         "tokenizer is needed for those texts")
    limit = TextEncoder.BATCH_CHARS

    def finish(ids, lens, texts):
        flat = np.array(ids, dtype=np.int64)
        if canonical is not None and flat.size:
            if flat.max() >= canonical.size:  # an id the table does not cover: be exact
                return generic(texts)
            flat = canonical[flat]
            if flat.size and flat.min() < 0:
                return generic(texts)
        return flat, lens

    one = None if with_special else bytelevel.build(backend)
    if one is not None:
        def encode_cached(texts):
            ids: List[int] = []
            lens = np.empty(len(texts), dtype=np.int64)
            for k, text in enumerate(texts):
                e = one(text)
                ids += e
                lens[k] = len(e)
            return finish(ids, lens, texts)

        return "hf-piece-cache", encode_cached

    def encode(texts):
        ids: List[int] = []
        lens = np.empty(len(texts), dtype=np.int64)
        i = 0
        while i < len(texts):
            j, chars = i, 0
            while j < len(texts) and (j == i or chars < limit):
                chars += len(texts[j])
                j += 1
            for k, enc in enumerate(backend.encode_batch(texts[i:j],
                                                         add_special_tokens=with_special)):
                e = enc.ids
                ids += e
                lens[i + k] = len(e)
            i = j
        return finish(ids, lens, texts)

    return "hf-batch", encode




def _flatten(lists) -> Tuple[np.ndarray, np.ndarray]:
    lens = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    try:
        flat = np.fromiter(chain.from_iterable(lists), dtype=np.int64, count=int(lens.sum()))
    except (TypeError, ValueError, OverflowError) as exc:
        raise DataError(f"the tokenizer returned something that is not a token id ({exc}).") \
            from None
    return flat, lens


def _canonical_ids(backend, size: int, unk: Optional[int]) -> np.ndarray:
    """``canonical[i]``: the id ``convert_tokens_to_ids`` gives the token string of id ``i``
    (``-1`` where it gives None, which preprocess_data.py cannot write either)."""
    table = np.arange(size, dtype=np.int64)
    for i in range(size):
        token = backend.id_to_token(i)
        if token is None:
            continue
        j = backend.token_to_id(token)
        if j is None:
            j = unk if unk is not None else -1
        table[i] = j
    return table
