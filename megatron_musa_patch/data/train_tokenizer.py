"""``mmp data train-tokenizer``: train a byte-level BPE tokenizer with the ``tokenizers`` library.

The result is a directory that ``--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR``
loads with no network: ``tokenizer.json`` (the whole tokenizer), ``tokenizer_config.json`` and
``special_tokens_map.json`` (so transformers' AutoTokenizer knows the class and the special
tokens; the eos token becomes Megatron's ``eod``). Byte-level means any text encodes without an
unknown token. Input: the same files, globs and directories as ``mmp data prepare``.
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
                        help="end-of-document token (Megatron's eod; also bos/unk/pad)")
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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [args.eos_token] + [t for t in args.special_tokens if t != args.eos_token]
    floor = 256 + len(specials)
    if args.vocab_size < floor:
        raise DataError(f"--vocab-size {args.vocab_size}: a byte-level vocabulary needs the 256 "
                        f"bytes plus {len(specials)} special token(s). Fix: pass at least "
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
        vocab_size=args.vocab_size, min_frequency=args.min_frequency, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=sys.stderr.isatty())
    tok.train_from_iterator(texts(files, args.json_keys, args.max_documents), trainer)
    if tok.get_vocab_size() <= floor:
        raise DataError(f"--input {' '.join(args.input)}: no text to learn from (found no "
                        f"documents under --json-keys {' '.join(args.json_keys)}).")

    eos = args.eos_token
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, bos_token=eos, unk_token=eos, pad_token=eos,
        additional_special_tokens=specials[1:] or None, model_max_length=1 << 30)
    os.makedirs(out, exist_ok=True)
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
    special_map = os.path.join(out, "special_tokens_map.json")
    if not os.path.exists(special_map):
        with open(special_map, "w", encoding="utf-8") as f:
            json.dump({"bos_token": eos, "eos_token": eos, "unk_token": eos, "pad_token": eos,
                       **({"additional_special_tokens": specials[1:]} if specials[1:] else {})},
                      f, indent=2, ensure_ascii=False)
            f.write("\n")
    return out


def main(args: argparse.Namespace) -> int:
    out = train(args)
    from tokenizers import Tokenizer

    size = Tokenizer.from_file(os.path.join(out, "tokenizer.json")).get_vocab_size()
    print(f"train-tokenizer: saved a byte-level BPE tokenizer ({size} tokens, eos "
          f"{args.eos_token!r}) to {out}\n  use it with: --tokenizer-type HuggingFaceTokenizer "
          f"--tokenizer-model {out}", file=sys.stderr)
    return 0
