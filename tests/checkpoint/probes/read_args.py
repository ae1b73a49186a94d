"""Reads the args of the checkpoint file ``sys.argv[1]`` with ``checkpoint/saved_args.py``;
prints their hidden_size and which of torch and megatron the process then had imported."""

import sys
from pathlib import Path

from megatron_musa_patch.checkpoint import saved_args

args = saved_args.read(Path(sys.argv[1]))
print(args.hidden_size, sorted(m for m in ("torch", "megatron") if m in sys.modules))
