"""Upstream call arguments by name, from the wrapped function's own signature.

A wrapper that needs ``config`` out of ``f(*args, **kwargs)`` asks :func:`call_arguments`
rather than copying upstream's parameter order by hand, so a release that adds or reorders
parameters still binds right (or fails with the signature's own TypeError).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict

_SIGNATURES: Dict[Any, inspect.Signature] = {}


def _signature(function: Callable) -> inspect.Signature:
    try:
        return _SIGNATURES[function]
    except (KeyError, TypeError):
        pass
    sig = inspect.signature(function)
    try:
        _SIGNATURES[function] = sig
    except TypeError:  # unhashable callable: not cached
        pass
    return sig


def call_arguments(wrapped: Callable, args: tuple, kwargs: dict,
                   defaults: bool = True) -> Dict[str, Any]:
    """``{parameter: value}`` for the call ``wrapped(*args, **kwargs)``, with the defaults of
    the parameters not given (``defaults=False``: only those given). For a bound method (what
    wrapt passes for methods) ``self`` is not among them."""
    function = getattr(wrapped, "__func__", None)
    owner = getattr(wrapped, "__self__", None)
    if function is not None and owner is not None and not inspect.isclass(owner):
        bound = _signature(function).bind(owner, *args, **kwargs)
        first = next(iter(bound.signature.parameters))
    else:
        bound = _signature(wrapped).bind(*args, **kwargs)
        first = None
    if defaults:
        bound.apply_defaults()
    arguments = dict(bound.arguments)
    if first is not None:
        arguments.pop(first, None)
    return arguments


def has_parameter(function: Callable, name: str) -> bool:
    """Whether upstream's ``function`` takes a parameter ``name`` (releases differ)."""
    target = getattr(function, "__func__", function)
    return name in _signature(target).parameters
