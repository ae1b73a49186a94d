"""A training command line's flags, edited: the planner's levers and layouts are the user's own
arguments with some flags set, changed or removed, so that they paste back as they are."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple


def split(args: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """``["--a", "1", "--b"]`` -> ``[("--a", ["1"]), ("--b", [])]``; a value never starts with
    ``--`` (Megatron's flags take numbers, names and paths)."""
    out: List[Tuple[str, List[str]]] = []
    for token in args:
        if token.startswith("--"):
            if "=" in token:
                flag, value = token.split("=", 1)
                out.append((flag, [value]))
            else:
                out.append((token, []))
        elif out:
            out[-1][1].append(token)
        else:
            out.append(("", [token]))
    return out


def value(args: Sequence[str], flag: str, default: Optional[str] = None) -> Optional[str]:
    for name, values in split(args):
        if name == flag:
            return values[0] if values else ""
    return default


def has(args: Sequence[str], flag: str) -> bool:
    return any(name == flag for name, _ in split(args))


def edited(args: Sequence[str], set_flags: Optional[Dict[str, Optional[str]]] = None,
           remove: Sequence[str] = ()) -> List[str]:
    """``args`` with ``remove``'s flags dropped and ``set_flags`` set (``None``: a switch)."""
    set_flags = dict(set_flags or {})
    drop = set(remove) | set(set_flags)
    out: List[str] = []
    for name, values in split(args):
        if name in drop:
            continue
        if name:
            out.append(name)
        out.extend(values)
    for name, val in set_flags.items():
        out.append(name)
        if val is not None:
            out.append(str(val))
    return out


def difference(base: Sequence[str], changed: Sequence[str]) -> List[str]:
    """The flags of ``changed`` that ``base`` lacks or gives another value, and ``--no``-style
    notes for those removed, as a user would paste them."""
    before = {name: values for name, values in split(base) if name}
    after = {name: values for name, values in split(changed) if name}
    out: List[str] = []
    for name, values in after.items():
        if before.get(name) != values:
            out.extend([name, *values])
    for name in before:
        if name not in after:
            out.append(f"(without {name})")
    return out
