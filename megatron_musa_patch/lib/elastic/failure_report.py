"""The paragraph a launcher prints when ranks failed: the rank that failed first and how (what
the hang watchdog's reports say, when one fired), the others, and which checkpoint a restart or
a rerun resumes from."""

from __future__ import annotations

import os
import signal
from typing import Dict, List, Optional

from megatron_musa_patch.upstream.checkpoint_files import TRACKER

from . import reports


def _how(exitcode: int) -> str:
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name}"
    return f"exit {exitcode}"


def _order(item):
    """Who failed first: a rank killed by a signal other than SIGTERM (SIGTERM is how torchrun
    stops the others), then one that exited with an error, then one that was only stopped."""
    rank, failure = item
    code = failure.exitcode
    kind = 0 if code < 0 and -code != signal.SIGTERM else (1 if code > 0 else 2)
    return kind, getattr(failure, "timestamp", 0), rank


def failure_report(failures: Dict[int, object], script_args: List[str],
                   watchdog: Optional[Dict[int, "reports.RankReport"]] = None, *,
                   restart: Optional[tuple] = None, max_restarts: int = 0,
                   launcher: str = "mmp run", restarter: str = "torchrun",
                   errors: Optional[Dict[int, "reports.ErrorReport"]] = None) -> str:
    """The paragraph the launcher (``mmp run``) prints when ranks failed: the rank that failed
    first and how (what the hang watchdog reports say, when one fired), the others, and where a
    restart resumes; ``restart=(k, n)`` before the k-th of n restarts (by ``restarter``),
    ``max_restarts`` when the job ends with none left."""
    stacks = [r.main_stack_text(launcher) for _, r in sorted((watchdog or {}).items())
              if r.shows_where_it_stopped()]
    found = reports.diagnosis(watchdog or {},
                              {rank: failure.exitcode for rank, failure in failures.items()})
    if found is not None:
        text = "\n".join(stacks + [f"{launcher}: {found}"])
    else:
        text = _exit_statuses(failures, launcher, errors or {})
    if restart is not None:
        done, most = restart
        return (f"{text} {restarter} restarts the group (restart {done} of {most}). "
                f"{_resume_hint(script_args, restarting=True)}")
    if max_restarts:
        text += f" No restart was left (--max-restarts {max_restarts})."
    return text + " " + _resume_hint(script_args)


def _exit_statuses(failures: Dict[int, object], launcher: str,
                   errors: Dict[int, "reports.ErrorReport"]) -> str:
    """The rank that failed first and how: the first error in time of those the ranks reported
    themselves, when one is not a lost connection (a lost connection follows from another
    rank's failure, a rank killed from outside included); the exit statuses otherwise."""
    first_error = reports.first_error({r: e for r, e in errors.items() if r in failures})
    if first_error is not None and first_error.lost_connection():
        first_error = None
    if first_error is not None:
        ranked = sorted(failures.items(), key=lambda item: (item[0] != first_error.rank,) +
                        _order(item))
    else:
        ranked = sorted(failures.items(), key=_order)
    first_rank, first = ranked[0]
    where = f"local rank {first.local_rank}, pid {first.pid}"
    if first_error is not None:
        lead = (f"rank {first_rank} ({where}) failed first, with {first_error.said()} (its "
                f"traceback is printed above)")
    elif first.exitcode < 0 and -first.exitcode != signal.SIGTERM:
        lead = (f"rank {first_rank} ({where}) was {_how(first.exitcode)}: it did not fail on its "
                f"own, something outside the job ended it (the out-of-memory killer, the "
                f"scheduler, a user)")
    elif first.exitcode > 0:
        lead = f"rank {first_rank} ({where}) failed first ({_how(first.exitcode)}); its error " \
               f"is printed above"
    else:
        lead = f"rank {first_rank} ({where}) was {_how(first.exitcode)} from outside the job"
    others = [_other(r, f, errors.get(r)) for r, f in ranked[1:]]
    text = f"{launcher}: {lead}."
    if others:
        text += (f" The other ranks were stopped because of it: {', '.join(others)}; errors "
                 f"they printed, such as a lost connection, follow from it.")
    return text


def _other(rank: int, failure, error: Optional["reports.ErrorReport"]) -> str:
    if error is not None and error.lost_connection():
        return f"rank {rank} ({_how(failure.exitcode)}: it lost its connection)"
    return f"rank {rank} ({_how(failure.exitcode)})"


def _flag_value(args: List[str], flag: str) -> Optional[str]:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _latest(directory: str):
    """(iteration, None) for the latest complete checkpoint in ``directory``, or (None, why)."""
    try:
        with open(os.path.join(directory, TRACKER), encoding="utf-8") as f:
            latest = f.read().strip()
    except OSError:
        return None, f"No checkpoint was completed in {directory} yet (no {TRACKER})."
    if not latest.isdigit():
        return None, f"{os.path.join(directory, TRACKER)} holds {latest[:20]!r}, not an iteration."
    return latest, None


def _resume_hint(script_args: List[str], restarting: bool = False) -> str:
    save = _flag_value(script_args, "--save")
    load = _flag_value(script_args, "--load")
    if restarting:
        if not load:
            return ("The script has no --load: the restarted group starts from the beginning "
                    "(give it --load with the --save directory to resume).")
        latest, why = _latest(load)
        if latest is None:
            return f"{why} The restarted group starts from the beginning."
        return (f"The latest complete checkpoint in {load} is iteration {latest}; the restarted "
                f"group resumes from it (--load).")
    if save is None:
        return "The job ended without finishing."
    latest, why = _latest(save)
    if latest is None:
        return why
    how = "the same command" if load and os.path.realpath(load) == os.path.realpath(save) \
        else f"the same command with --load {save}"
    return (f"The latest complete checkpoint in {save} is iteration {latest} (named by {TRACKER}; "
            f"a checkpoint being written when the job ended is not); rerun {how} to resume "
            f"from it.")
