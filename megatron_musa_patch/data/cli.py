"""``mmp data prepare | blend | train-tokenizer``."""

from __future__ import annotations

import argparse
from typing import List, Optional


EXIT_STATUS = ("Exit status: 0 done; 2 refused with one paragraph (the flag, file or tokenizer, "
               "and what to do); 130 interrupted (finished output is kept, a rerun skips it).")


def parser() -> argparse.ArgumentParser:
    from . import blend, prepare, train_tokenizer

    p = argparse.ArgumentParser(
        prog="mmp data", description="Tokenize, binarize and blend training data for Megatron.",
        epilog=EXIT_STATUS)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module, help_ in (
            ("prepare", prepare, "tokenize and binarize into .bin/.idx (preprocess_data.py's "
                                 "flags)"),
            ("blend", blend, "check .bin/.idx pairs and print the weighted DATA_PATH"),
            ("train-tokenizer", train_tokenizer, "train a byte-level BPE tokenizer (offline)")):
        summary = module.__doc__.split("\n\n")[0].replace("``", "")
        sp = sub.add_parser(name, help=help_, description=summary, epilog=EXIT_STATUS,
                            allow_abbrev=False)
        module.add_arguments(sp)
        sp.set_defaults(handler=module.main)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    return args.handler(args)
