"""``mmp data train-tokenizer``: train a byte-level BPE tokenizer with the ``tokenizers`` library.

The result is a directory that ``--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR``
loads with no network: ``tokenizer.json`` (the whole tokenizer), ``tokenizer_config.json`` and
``special_tokens_map.json`` (so transformers' AutoTokenizer knows the class and the special
tokens; the eos token becomes Megatron's ``eod``). Byte-level means any text encodes without an
unknown token. Input: the same files, globs and directories as ``mmp data prepare``.

The pad token is a special token of its own, not the eos: Megatron's datasets do not trust a
pad id that another special token shares (they warn and stop masking padding out of the loss;
with ``--allow-ambiguous-pad-tokens`` they would mask every end of document instead). It takes
the last id and ``--vocab-size`` counts it: the trainer learns one merge fewer, and the eos, the
other special tokens, the bytes and the other merges keep the ids they had without it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Iterator, List

from . import inputs
from .errors import DataError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", nargs="+", required=True, metavar="PATH",
                        help="files, quoted globs or directories of .jsonl / .json / .txt")
    parser.add_argument("--output-dir", required=True, help="where to save the tokenizer")
    parser.add_argument("--vocab-size", type=int, default=32000,
                        help="vocabulary size including special tokens (default 32000)")
    parser.add_argument("--min-frequency", type=int, default=2,
                        help="merge only pairs seen at least this often (default 2)")
    parser.add_argument("--json-keys", nargs="+", default=["text"],
                        help="keys holding the text in JSON inputs (default: text)")
    parser.add_argument("--txt-whole-file", action="store_true",
                        help=".txt inputs: the whole file is one document")
    parser.add_argument("--eos-token", default="<|endoftext|>",
                        help="end-of-document token (Megatron's eod; also bos/unk)")
    parser.add_argument("--pad-token", default="<|pad|>",
                        help="padding token (Megatron's pad), given the last id unless it is "
                             "one of --special-tokens; the --eos-token here shares its id, "
                             "which Megatron warns about (default <|pad|>)")
    parser.add_argument("--special-tokens", nargs="*", default=[],
                        help="more special tokens, given ids right after the eos token")
    parser.add_argument("--add-prefix-space", action="store_true",
                        help="treat the start of a text like a word after a space (GPT-2: no)")
    parser.add_argument("--max-documents", type=int, default=0,
                        help="train on at most this many documents (0: all)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing tokenizer")


def texts(files: List[inputs.InputFile], keys: List[str], limit: int = 0) -> Iterator[str]:
    """Documents' text, streamed (a JSON array file is read whole)."""
    count = 0
    for f in files:
        for text in _file_texts(f, keys):
            yield text
            count += 1
            if limit and count >= limit:
                return


def _file_texts(f: inputs.InputFile, keys: List[str]) -> Iterator[str]:
    if f.kind == "txt_file":
        with open(f.path, encoding="utf-8", errors="replace") as fh:
            yield fh.read()
        return
    if f.kind == "json_array":
        with open(f.path, encoding="utf-8") as fh:
            items = json.load(fh)
        rows = ((i, item) for i, item in enumerate(items))
    else:
        rows = _lines(f.path)
    for where, item in rows:
        if isinstance(item, str):  # a line of a .txt or JSON-lines file
            if not item.strip():
                continue
            if f.kind == "txt_lines":
                yield item.rstrip("\r\n")
                continue
            try:
                item = json.loads(item)
            except json.JSONDecodeError as exc:
                raise DataError(f"{f.path}:{where}: malformed JSON ({exc.msg}). Fix: fix the line "
                                "or leave the file out of --input.") from None
        for key in keys:
            value = item.get(key) if isinstance(item, dict) else None
            if isinstance(value, str):
                yield value
            elif isinstance(value, list):
                yield from (s for s in value if isinstance(s, str))


def _lines(path: str):
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            yield number, line


def train(args: argparse.Namespace) -> str:
    from tokenizers import (AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors,
                            trainers)
    from transformers import PreTrainedTokenizerFast

    eos, pad = args.eos_token, args.pad_token
    specials = [eos] + [t for t in args.special_tokens if t != eos]
    appended = [] if pad in specials else [pad]  # added after training: the last id
    floor = 256 + len(specials) + len(appended)
    if args.vocab_size < floor:
        raise DataError(f"--vocab-size {args.vocab_size}: a byte-level vocabulary needs the 256 "
                        f"bytes plus {floor - 256} special token(s). Fix: pass at least "
                        f"{floor}.")
    out = os.path.abspath(args.output_dir)
    if os.path.exists(os.path.join(out, "tokenizer.json")) and not args.force:
        raise DataError(f"{out} already holds a tokenizer. Fix: pass --force to overwrite it, or "
                        "choose another --output-dir.")
    files = inputs.expand(args.input, txt_whole_file=args.txt_whole_file)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=args.add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size - len(appended), min_frequency=args.min_frequency,
        special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty())
    tok.train_from_iterator(texts(files, args.json_keys, args.max_documents), trainer)
    if tok.get_vocab_size() <= 256 + len(specials):
        raise DataError(f"--input {' '.join(args.input)}: no text to learn from (found no "
                        f"documents under --json-keys {' '.join(args.json_keys)}).")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in appended])

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, bos_token=eos, unk_token=eos, pad_token=pad,
        additional_special_tokens=specials[1:] or None, model_max_length=1 << 30)
    os.makedirs(out, exist_ok=True)
    special_map = os.path.join(out, "special_tokens_map.json")
    if os.path.exists(special_map):  # --force: transformers 5 writes none, so an old one stays
        os.remove(special_map)
    hf.save_pretrained(out)
    # transformers 4 and 5 both resolve this class name (5 writes its own alias by default)
    config_path = os.path.join(out, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if not config.get("extra_special_tokens"):
        config.pop("extra_special_tokens", None)  # transformers 4 expects a dict here, not []
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    if not os.path.exists(special_map):
        with open(special_map, "w", encoding="utf-8") as f:
            json.dump({"bos_token": eos, "eos_token": eos, "unk_token": eos, "pad_token": pad,
                       **({"additional_special_tokens": specials[1:]} if specials[1:] else {})},
                      f, indent=2, ensure_ascii=False)
            f.write("\n")
    return out


def main(args: argparse.Namespace) -> int:
    out = train(args)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    print(f"train-tokenizer: saved a byte-level BPE tokenizer ({tok.get_vocab_size()} tokens, "
          f"eos {args.eos_token!r} id {tok.token_to_id(args.eos_token)}, pad {args.pad_token!r} "
          f"id {tok.token_to_id(args.pad_token)}) to {out}\n  use it with: --tokenizer-type "
          f"HuggingFaceTokenizer --tokenizer-model {out}", file=sys.stderr)
    return 0
