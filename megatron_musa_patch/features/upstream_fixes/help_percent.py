"""``--help`` of Megatron's parser, whose help strings argparse formats with ``%``.

From megatron-core 0.18 many of Megatron-LM's flags are made from the ``TransformerConfig``
field docstrings, and one of them says ``(e.g. 1.10 = 10%)``: argparse's help formatter then
raises ``ValueError: unsupported format character ')'``, so ``pretrain_gpt.py --help`` fails on
every rank. Here a help string that does not format gets its lone ``%`` doubled, as argparse
wants; a help that formats is left as it is.
"""

from __future__ import annotations

import re

from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "--help works: a help string of Megatron's parser with a lone % (0.18+) is escaped")

#: 0.16 and 0.17 have no such help; 0.18.2's TransformerConfig docstring has the same "10%)" as
#: 0.19's
STARTS = ">=0.18.0"

#: what argparse's help formatter takes: ``%%`` and ``%(name)s``-like specifiers
_FORMAT = re.compile(r"%%|%\(\w+\)[#0\- +]*\d*(?:\.\d+)?[a-zA-Z]|%")


@hookimpl
def mmp_register_patches(registry):
    registry.add(FEATURE.patch(
        "", "megatron.training.arguments:add_megatron_arguments", "wrap",
        _add_megatron_arguments,
        why="a help string with a lone % makes --help fail (ValueError in argparse)",
        starts="before megatron-core 0.18 every help string of Megatron's parser formats",
        megatron=STARTS))


def _add_megatron_arguments(wrapped, instance, args, kwargs):
    parser = wrapped(*args, **kwargs)
    for action in getattr(parser, "_actions", ()):
        if isinstance(action.help, str) and "%" in action.help and not _formats(action.help):
            action.help = escaped(action.help)
    return parser


def _formats(text: str) -> bool:
    try:
        text % {"default": None, "prog": "", "dest": "", "type": "", "choices": "",
                "metavar": "", "required": "", "help": "", "option_strings": "", "nargs": "",
                "const": ""}
    except (ValueError, TypeError, KeyError):
        return False
    return True


def escaped(text: str) -> str:
    """``text`` with each lone ``%`` doubled; ``%%`` and ``%(name)s`` kept."""
    return _FORMAT.sub(lambda m: "%%" if m.group(0) == "%" else m.group(0), text)
