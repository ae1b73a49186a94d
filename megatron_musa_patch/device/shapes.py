"""The shapes of torch's objects, so a stand-in can take the shape of what it stands in for.

torch reads its own ``torch.cuda`` objects in ways that go beyond calling them: torch 2.14's
dynamo reads ``torch.cuda.use_mem_pool.__wrapped__`` when it is first imported (a
``contextlib.contextmanager`` function has one), annotations name ``torch.cuda.CUDAGraph`` as a
type, and ``inspect.signature`` is asked by tracing code. A stand-in of another kind breaks
such code at import, far from the device layer. :func:`follow` gives a stand-in the kind of the
real object (a context-manager function stays one); :func:`differences` says where a stand-in
still differs in kind or in the calls it accepts (``tests/device/test_torch_shapes.py`` runs it
on every torch of the table).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, List, Optional

CLASS, MODULE, CONTEXT_MANAGER, FUNCTION, MISSING = (
    "class", "module", "context-manager function", "function", "missing")


def kind(obj: Any) -> str:
    """What ``obj`` is, as far as code that inspects it can tell."""
    if obj is None:
        return MISSING
    if inspect.ismodule(obj):
        return MODULE
    if inspect.isclass(obj):
        return CLASS
    wrapped = getattr(obj, "__wrapped__", None)
    if callable(obj) and wrapped is not None and inspect.isgeneratorfunction(wrapped):
        return CONTEXT_MANAGER
    if callable(obj):
        return FUNCTION
    return f"value of type {type(obj).__name__}"


def follow(real: Any, ours: Any, known: str = MISSING) -> Any:
    """``ours``, in the kind of ``real`` (or, where torch's object cannot be read here -- torchada
    has replaced ``torch.cuda`` -- the ``known`` kind of it): a plain function standing in for a
    context-manager function becomes a context-manager function (entering it calls ``ours``,
    and enters what ``ours`` returns if that is a context manager). Anything else is returned
    as it is."""
    wanted = kind(real) if real is not None else known
    if wanted != CONTEXT_MANAGER or kind(ours) != FUNCTION:
        return ours

    @functools.wraps(ours, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
    def generator(*args, **kwargs):
        result = ours(*args, **kwargs)
        if hasattr(result, "__enter__"):
            with result as value:
                yield value
        else:
            yield result

    shaped = contextlib.contextmanager(generator)
    shaped.__signature__ = _signature(ours) or _signature(real)
    return shaped


def _signature(obj) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def differences(real: Any, ours: Any) -> List[str]:
    """Where ``ours`` differs from ``real`` in what code may rely on: its kind, and the calls
    it accepts (every call ``real`` accepts, by position and by keyword, must bind to ``ours``;
    ``ours`` may accept more). Empty when it can stand in."""
    if real is None:
        return []
    if kind(real) != kind(ours):
        if kind(real).startswith("value") and kind(ours).startswith("value"):
            return []  # a value of another type (a tuple of generators ...) is not a shape
        return [f"is a {kind(ours)} where torch has a {kind(real)}"]
    if kind(real) not in (CLASS, CONTEXT_MANAGER, FUNCTION):
        return []
    theirs, mine = _signature(real), _signature(ours)  # a class: making one
    if theirs is None or mine is None:
        return []
    return _unaccepted(theirs, mine)


def _unaccepted(theirs: inspect.Signature, mine: inspect.Signature) -> List[str]:
    """The calls ``theirs`` accepts that ``mine`` does not bind: the one with only the required
    arguments, the one with every positional argument, and each keyword argument added to
    the required ones."""
    P = inspect.Parameter
    params = list(theirs.parameters.values())
    positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    required_positional = [p for p in positional if p.default is P.empty]
    required_keywords = {p.name: p.name for p in params
                         if p.kind == P.KEYWORD_ONLY and p.default is P.empty}
    calls = [("the required arguments", [p.name for p in required_positional], required_keywords),
             ("every positional argument", [p.name for p in positional], required_keywords)]
    for p in params:
        if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY) and p.default is not P.empty:
            calls.append((f"the keyword {p.name!r}", [q.name for q in required_positional],
                          {**required_keywords, p.name: p.name}))
    problems = []
    for what, args, kwargs in calls:
        try:
            mine.bind(*args, **kwargs)
        except TypeError as exc:
            problems.append(f"does not accept {what} as torch's does ({exc})")
    return problems
