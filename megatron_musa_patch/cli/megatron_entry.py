"""What makes a script a Megatron entry script, read from its source, and what a check of its
arguments concluded (``args_check`` starts the check, ``args_check_worker`` makes it)."""

from __future__ import annotations

import ast
import dataclasses
import json
from typing import Optional

#: the calls that parse Megatron's command line with the script's ``extra_args_provider`` and
#: ``args_defaults``, in the order a script's ``__main__`` block makes them (0.19's
#: pretrain_gpt.py parses with ``parse_and_validate_args`` before ``pretrain``; from 0.19,
#: ``pretrain`` and ``initialize_megatron`` take no provider and parse nothing: the worker asks
#: the installed function)
ENTRY_CALLS = ("parse_and_validate_args", "initialize_megatron", "pretrain")
#: the two arguments of an entry call the check evaluates
KEYS = ("extra_args_provider", "args_defaults")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the check found: ``status`` is ``ok``, ``refused`` (``text`` is the paragraph),
    ``printed`` (``--help``: ``text`` is Megatron's help, the job ends 0) or ``unknown`` (the
    ranks check: ``text`` says why)."""

    status: str
    text: str = ""
    seconds: float = 0.0
    #: the release that checked, as the check's Megatron reports it
    megatron: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def entry_call(source: str) -> Optional[ast.Call]:
    """The first of ``ENTRY_CALLS`` in the script's ``if __name__ == "__main__":`` block."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found = []
    for node in tree.body:
        if isinstance(node, ast.If) and is_main_guard(node.test):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call) and called_name(inner) in ENTRY_CALLS:
                    found.append(inner)
    found.sort(key=lambda call: (call.lineno, call.col_offset))
    return found[0] if found else None


def is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def called_name(call: ast.Call) -> Optional[str]:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None
