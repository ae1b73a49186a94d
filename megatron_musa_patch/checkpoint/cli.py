"""``mmp checkpoint import-hf | export-hf``: Hugging Face models in and out of Megatron.

    mmp checkpoint import-hf --hf-dir DIR --save OUT [--tensor-model-parallel-size N]
        [--pipeline-model-parallel-size N] [--expert-model-parallel-size N]
        [--ckpt-format torch_dist|torch]
    mmp checkpoint export-hf --load CKPT --hf-dir OUT [--hf-config PATH] [--max-shard-size GB]

``import-hf`` writes a checkpoint stock ``pretrain_gpt.py`` loads with ``--load OUT`` (add
``--finetune`` to start a new run from it) at the given layout, and the Megatron flags that build
the same network into ``OUT/model_flags.txt``. ``export-hf`` turns a checkpoint written by stock
``pretrain_gpt.py`` through the layer (any layout, either format) into a directory
``transformers`` loads. Both run Megatron's own checkpointing through the layer on the CPU (gloo),
write into a temporary directory and rename it at the end: an interrupted run (SIGINT, SIGTERM,
SIGHUP, or a step killed) stops every process it started and removes what it wrote. Exit
status: 0 done, 2 refused (one paragraph), 1 a conversion step failed, 128 + N interrupted by
signal N.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from . import conversion, processes
from .errors import ConversionError
from .plan import Layout


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmp checkpoint", description=__doc__.split("\n\n")[0].replace("``", ""),
        epilog="Exit status: 0 done, 2 refused with one paragraph, 1 a conversion step failed, "
               "128 + N interrupted by signal N (what it wrote removed).")
    verbs = parser.add_subparsers(dest="verb", required=True)
    imp = verbs.add_parser("import-hf", help="a Hugging Face model directory into a Megatron "
                                             "checkpoint", epilog=parser.epilog,
                           description="A local Hugging Face model directory into a Megatron "
                                       "checkpoint at the given parallel layout, with the model "
                                       "flags to train it.")
    imp.add_argument("--hf-dir", required=True, help="local Hugging Face model directory "
                                                     "(config.json + safetensors)")
    imp.add_argument("--save", required=True, help="the checkpoint directory to write (new)")
    imp.add_argument("--tensor-model-parallel-size", type=int, default=1)
    imp.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    imp.add_argument("--expert-model-parallel-size", type=int, default=1)
    imp.add_argument("--ckpt-format", choices=conversion.FORMATS, default="torch_dist")
    exp = verbs.add_parser("export-hf", help="a Megatron checkpoint into a Hugging Face model "
                                             "directory", epilog=parser.epilog,
                           description="A checkpoint pretrain_gpt.py wrote through the layer (any "
                                       "TP/PP/EP, either format) into a Hugging Face model "
                                       "directory.")
    exp.add_argument("--load", required=True, help="checkpoint directory written by "
                                                   "pretrain_gpt.py (or import-hf)")
    exp.add_argument("--hf-dir", required=True, help="the Hugging Face directory to write (new)")
    exp.add_argument("--hf-config", help="config.json (or a model directory) to take the "
                                         "config from; default: the one import-hf kept, else "
                                         "one made from the checkpoint's args")
    exp.add_argument("--max-shard-size", type=float, default=4.0,
                     help="largest safetensors file, in GB (default 4)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    opts = parser().parse_args(argv)
    try:
        with processes.interruptible():
            if opts.verb == "import-hf":
                conversion.import_hf(opts.hf_dir, opts.save, Layout.from_options(opts),
                                     opts.ckpt_format)
            else:
                conversion.export_hf(opts.load, opts.hf_dir, opts.hf_config,
                                     opts.max_shard_size)
    except processes.Interrupted as exc:
        print(f"mmp checkpoint {opts.verb}: interrupted by {exc}: the conversion's processes "
              f"were stopped and what it had written removed; nothing was written.",
              file=sys.stderr)
        return exc.exit_code
    except ConversionError as exc:
        print(exc.render(prog=f"mmp checkpoint {opts.verb}"), file=sys.stderr)
        return exc.exit_code
    except conversion.StepFailed as exc:  # status 1, one line: the step printed the details
        raise SystemExit(str(exc)) from None
    return 0
