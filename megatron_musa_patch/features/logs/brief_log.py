"""Rank 0's start-up log in brief (``MEGATRON_MUSA_PATCH_LOG=brief``, the default).

A stock run used to print a thousand lines before its first iteration: Megatron's list of every
argument (about 700 lines), the bucket-by-bucket parameter names and dataset bookkeeping at INFO,
and eight to fourteen warnings that TransformerEngine and Apex are missing. In brief:

* the argument list is one line: how many the command line gave, how many others
  ``validate_args`` set;
* the start-up timestamps that ``pretrain`` prints after the fact are not printed (its startup
  timers hold the same);
* Megatron's messages at INFO stay off the console unless ``--logging-level`` or
  ``MEGATRON_LOGGING_LEVEL`` (Megatron's own switches) ask for them, and its timers unless
  ``--timing-log-level`` does;
* the theoretical memory footprint, which upstream prints with its parameter counts after the
  first and the second iteration, is its summary line, once;
* a warning is one line (without the source line that raised it);
* without TransformerEngine, upstream's warnings that it and Apex are missing become one line
  saying what runs instead.

``MEGATRON_MUSA_PATCH_LOG=full`` leaves all of it as upstream prints it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import threading

import wrapt

from megatron_musa_patch.upstream.binding import call_arguments
from megatron_musa_patch.upstream.conditions import te_installed
from megatron_musa_patch.core.hookspecs import hookimpl
from megatron_musa_patch.core.feature import feature

FEATURE = feature(
    __name__,
    "rank 0's start-up log in brief: Megatron's argument list as one line, its INFO messages "
    "off the console, TE/Apex warnings as one line",
    aliases=("brief_log",))


#: upstream's warnings that TransformerEngine / Apex are missing (megatron.core and
#: megatron.training, every supported release)
TE_APEX_WARNING = re.compile(r"(Transformer Engine and Apex are|Apex is) not installed\.|"
                             r"Only transformer-engine>=")
#: the logger of Megatron's timers, which stays at INFO when --timing-log-level asks for them
TIMERS = "megatron.core.timers"
LEVEL_ENV = "MEGATRON_LOGGING_LEVEL"
MEGATRON_LOGGER = "megatron"


@hookimpl
def mmp_register_patches(session, registry):
    state = session.state_for(FEATURE.name, dict)
    brief = session.settings.log == "brief"

    def when_brief():
        return True if brief else "MEGATRON_MUSA_PATCH_LOG=full"

    def when_brief_without_te():
        if not brief:
            return "MEGATRON_MUSA_PATCH_LOG=full"
        return True if not te_installed() else "TransformerEngine is installed"

    registry.add(FEATURE.patch(
        "arguments", "megatron.training.arguments:_print_args", "wrap",
        functools.partial(_print_args, session, state), condition=when_brief,
        why="Megatron's list of every argument as one line: how many were given, how many "
            "more validate_args set"))
    registry.add(FEATURE.patch(
        "logging_level", "megatron.training.arguments:validate_args", "wrap",
        _after_validation, condition=when_brief,
        why="Megatron's INFO messages off the console unless --logging-level or "
            f"{LEVEL_ENV} asks for them"))
    registry.add(
        FEATURE.patch(
            "theoretical_memory_once",
            "megatron.training.training:report_theoretical_memory",
            "wrap",
            functools.partial(_theoretical_memory, state),
            condition=when_brief,
            why="the theoretical memory footprint as its one summary line, "
            "once (not its parameter counts after each of the first two "
            "iterations)",
        )
    )
    registry.add(FEATURE.patch(
        "startup_timestamps", "megatron.training.training:print_datetime", "wrap",
        _print_datetime, condition=when_brief,
        why="the start-up timestamps printed after the fact are not printed"))
    registry.add(FEATURE.patch(
        "te_apex_warnings", "warnings:warn", "wrap",
        functools.partial(_warn, state), condition=when_brief_without_te,
        why="upstream's warnings that TransformerEngine and Apex are missing, as one line"))
    registry.add(
        FEATURE.patch(
            "warning_format",
            "warnings:formatwarning",
            "replace",
            one_line_warning,
            condition=when_brief,
            why="a warning on one line (not followed by the source line that raised it)",
        )
    )


# ----------------------------------------------------------------------------- warnings


def _warn(state, wrapped, instance, args, kwargs):
    message = args[0] if args else kwargs.get("message")
    if TE_APEX_WARNING.match(str(message)):
        state["te_apex_warnings"] = state.get("te_apex_warnings", 0) + 1
        if state.get("arguments_printed") and not state.get("te_apex_line_printed"):
            # the first one after the start-up lines: the line comes now
            print(te_apex_line(state.get("device", ""), 1), flush=True)
            state["te_apex_line_printed"] = True
        return None
    # warnings.warn(message, category=None, stacklevel=1, ...) names its caller by counting
    # frames: this wrapper's (and a pure-Python wrapt's) are in between
    extra = _frames_in_between()
    if len(args) > 2:
        args = (*args[:2], args[2] + extra, *args[3:])
    else:
        kwargs = dict(kwargs, stacklevel=kwargs.get("stacklevel", 1) + extra)
    return wrapped(*args, **kwargs)


_WRAPT_DIR = os.path.dirname(wrapt.__file__) + os.sep


def _frames_in_between() -> int:
    """This wrapper's frame, and wrapt's own if its C extension is not in use."""
    count, frame = 1, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_WRAPT_DIR):
        count, frame = count + 1, frame.f_back
    return count


def te_apex_line(device: str, folded: int) -> str:
    return (f"megatron_musa_patch: TransformerEngine and Apex are not installed: megatron-core "
            f"runs its local layers (--transformer-impl local) with torch's norms and "
            f"optimizers, and this layer's fused ops for {device} (fused_ops.*); upstream's "
            f"{folded} warning{'s' if folded != 1 else ''} saying so are folded into this line")


# ----------------------------------------------------------------------------- arguments


def _print_args(session, state, wrapped, instance, args, kwargs):
    call = call_arguments(wrapped, args, kwargs)
    if call.get("title") != "arguments" or os.environ.get("RANK", "0") != "0":
        return wrapped(*args, **kwargs)
    folded = state.get("te_apex_warnings", 0)
    state.update(arguments_printed=True, device=session.device.name)
    if folded:
        print(te_apex_line(session.device.name, folded), flush=True)
        state["te_apex_line_printed"] = True
    given = given_dests(sys.argv[1:], session.argument_flags)
    print(arguments_paragraph(call["args"], session.argument_defaults, given), flush=True)
    return None


def given_dests(argv, flags: dict) -> set:
    """The dests of the options on the command line (``--x v`` and ``--x=v`` alike)."""
    return {flags[word.split("=", 1)[0]] for word in argv
            if word.startswith("-") and word.split("=", 1)[0] in flags}


def arguments_paragraph(args, defaults: dict, given: set) -> str:
    """How many arguments the command line gave and how many others differ from Megatron's
    defaults (those ``validate_args`` derived); the values themselves are in the checkpoint's
    arguments and under ``MEGATRON_MUSA_PATCH_LOG=full``."""
    values = vars(args)
    derived = [k for k, v in values.items()
               if k in defaults and k not in given and defaults[k] != v]
    return (f"arguments: {len(given)} given, {len(derived)} more set by validate_args, "
            f"{len(values)} in all (MEGATRON_MUSA_PATCH_LOG=full lists them)")


# ----------------------------------------------------------------------------- logging level


def _after_validation(wrapped, instance, args, kwargs):
    """Megatron's INFO messages off the console from here, unless asked for: Megatron's own
    ``setup_logging`` (later) sets the level the user gave, and keeps ours otherwise."""
    result = wrapped(*args, **kwargs)
    megatron_args = call_arguments(wrapped, args, kwargs)["args"]
    if getattr(megatron_args, "logging_level", None) is None and \
            os.environ.get(LEVEL_ENV) is None:
        # Megatron's loggers only (megatron.core.*, megatron.training.*): a script's own and
        # other libraries' INFO messages stay as Megatron's basicConfig set them
        logging.getLogger(MEGATRON_LOGGER).setLevel(logging.WARNING)
        if getattr(megatron_args, "timing_log_level", 0):
            logging.getLogger(TIMERS).setLevel(logging.INFO)
    return result


def _theoretical_memory(state, wrapped, instance, args, kwargs):
    if state.get("theoretical_memory"):
        return None
    state["theoretical_memory"] = True
    call = call_arguments(wrapped, args, kwargs)
    call["verbose"] = False
    return wrapped(**call)


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """``warnings.formatwarning`` without the source line (the same first line)."""
    return f"{filename}:{lineno}: {category.__name__}: {message}\n"


def _print_datetime(wrapped, instance, args, kwargs):
    """``print_datetime(string, override_timestamp)`` with an override stamps a moment already
    past; it still synchronises the ranks, so it runs, its line unprinted (this thread's: a
    line another thread prints meanwhile goes out)."""
    if call_arguments(wrapped, args, kwargs).get("override_timestamp") is None:
        return wrapped(*args, **kwargs)
    stream = sys.stdout
    sys.stdout = _OtherThreads(stream, threading.get_ident())
    try:
        return wrapped(*args, **kwargs)
    finally:
        if isinstance(sys.stdout, _OtherThreads):
            sys.stdout = stream


class _OtherThreads:
    """A stream that drops what one thread writes."""

    def __init__(self, stream, dropped: int):
        self._stream, self._dropped = stream, dropped

    def write(self, text):
        if threading.get_ident() == self._dropped:
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)
