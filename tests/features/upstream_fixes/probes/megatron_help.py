"""Megatron's own parser of the installed release asked for --help, with the layer active."""

import sys

import megatron_musa_patch  # noqa: F401 - activates before Megatron is imported

from megatron.training.arguments import parse_args  # noqa: E402

sys.argv = ["pretrain_gpt.py", "--help"]
parse_args()
