"""``mmp run``: torchrun with the layer active in every rank.

Takes torchrun's own options (``--nproc-per-node``, ``--nnodes``, ``--rdzv-*``, ``--master-*``,
``--node-rank`` ...), parsed by torchrun's parser, so multi-node launches work unchanged.

When a rank dies, torchrun stops the others; a rank that hangs ends itself within
``--hang-timeout`` (the ``hang_watchdog`` feature, reporting to a directory ``mmp run`` reads).
With ``--max-restarts N`` torchrun then restarts the group, which resumes from the latest
checkpoint when the script has ``--load``; before each restart, and when the job ends, ``mmp run``
says which rank failed first and how (hung where, frozen, killed by a signal, its exit status),
which ranks were only stopped because of it, and which checkpoint a restart resumes from.

Each attempt gets a fresh TCPStore (torch's ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, unless set):
with the store torchrun shares across attempts, a restarted group can read the previous
attempt's addresses and never connect (pytorch/pytorch#135712; ``features/restart_store.py``
covers plain torchrun on one node).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from typing import Dict, List, Optional

from .elastic import reports
from .elastic.agent import driven
from .errors import ArgumentError
from .settings import PREFIX

TRACKER = "latest_checkpointed_iteration.txt"
WATCHDOG_DIR_ENV = f"{PREFIX}_WATCHDOG_DIR"
FRESH_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def run(argv: List[str]) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import run as torchrun

    parser = get_args_parser()
    parser.prog = "mmp run"
    args = parser.parse_args(argv)
    script_args = list(args.training_script_args)
    if not args.no_python and not args.module and not os.path.isfile(args.training_script):
        raise ArgumentError(
            f"mmp run: the training script {args.training_script} does not exist (relative to "
            f"{os.getcwd()}). Fix the path (for Megatron-LM: $MEGATRON_LM_PATH/pretrain_gpt.py), "
            f"or pass -m for a module.")
    # every Python process the job starts (data-loader or checkpoint workers too) activates
    os.environ["MEGATRON_MUSA_PATCH"] = "1"
    if not args.no_python:
        mode = "--module" if args.module else "--script"
        args.training_script_args = [mode, args.training_script, *args.training_script_args]
        args.training_script = "megatron_musa_patch.run_worker"
        args.module = True
    os.environ.setdefault(FRESH_STORE_ENV, "1")
    # the ranks' hang watchdog reports (features/hang_watchdog.py), read before each restart
    own_dir = not os.environ.get(WATCHDOG_DIR_ENV)
    if own_dir:
        os.environ[WATCHDOG_DIR_ENV] = tempfile.mkdtemp(prefix="mmp-watchdog-")
    report_dir = os.environ[WATCHDOG_DIR_ENV]

    def on_restart(failures, restart, max_restarts):
        stop_leftovers(failure.pid for failure in failures.values())
        print(failure_report(failures, script_args, reports.read(report_dir),
                             restart=(restart, max_restarts)), file=sys.stderr, flush=True)
        reports.clear(report_dir)

    try:
        with driven(on_restart):
            torchrun(args)
    except ChildFailedError as exc:
        stop_leftovers(failure.pid for failure in exc.failures.values())
        print(failure_report(exc.failures, script_args, reports.read(report_dir),
                             max_restarts=args.max_restarts), file=sys.stderr, flush=True)
        return 1
    finally:
        if own_dir:
            shutil.rmtree(report_dir, ignore_errors=True)
    return 0


def stop_leftovers(rank_pids, grace_s: float = 5.0) -> List[int]:
    """Stop what a dead rank left running. torchrun starts each rank as the leader of its own
    process group and, on failure, signals the groups of the ranks still alive, not of the dead
    one: the children of a rank killed from outside -- megatron-core's checkpoint writer starts a
    multiprocessing Manager -- then live on forever, holding the job's stdout open (a `| tee`
    never ends). Returns the groups that had to be signalled."""
    import time

    signalled = []
    for pid in set(rank_pids):
        if not pid or pid <= 0:
            continue
        try:
            os.killpg(pid, signal.SIGTERM)  # a group id is not reused while it has members
        except (ProcessLookupError, PermissionError):
            continue
        signalled.append(pid)
    deadline = time.monotonic() + grace_s
    for pid in signalled:
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.1)
        if _group_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return signalled


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


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
                   restart: Optional[tuple] = None, max_restarts: int = 0) -> str:
    """The paragraph ``mmp run`` prints when ranks failed: the rank that failed first and how
    (what the hang watchdog reports say, when one fired), the others, and where a restart
    resumes; ``restart=(k, n)`` before the k-th of n restarts, ``max_restarts`` when the job
    ends with none left."""
    stacks = [r.main_stack_text() for _, r in sorted((watchdog or {}).items()) if r.fired]
    found = reports.diagnosis(watchdog or {},
                              {rank: failure.exitcode for rank, failure in failures.items()})
    if found is not None:
        text = "\n".join(stacks + [f"mmp run: {found}"])
    else:
        text = _exit_statuses(failures)
    if restart is not None:
        done, most = restart
        return (f"{text} torchrun restarts the group (restart {done} of {most}). "
                f"{_resume_hint(script_args, restarting=True)}")
    if max_restarts:
        text += f" No restart was left (--max-restarts {max_restarts})."
    return text + " " + _resume_hint(script_args)


def _exit_statuses(failures: Dict[int, object]) -> str:
    """The rank that failed first and how, from the exit statuses alone."""
    ranked = sorted(failures.items(), key=_order)
    first_rank, first = ranked[0]
    where = f"local rank {first.local_rank}, pid {first.pid}"
    if first.exitcode < 0 and -first.exitcode != signal.SIGTERM:
        lead = (f"rank {first_rank} ({where}) was {_how(first.exitcode)}: it did not fail on its "
                f"own, something outside the job ended it (the out-of-memory killer, the "
                f"scheduler, a user)")
    elif first.exitcode > 0:
        lead = f"rank {first_rank} ({where}) failed first ({_how(first.exitcode)}); its error " \
               f"is printed above"
    else:
        lead = f"rank {first_rank} ({where}) was {_how(first.exitcode)} from outside the job"
    others = [f"rank {r} ({_how(f.exitcode)})" for r, f in ranked[1:]]
    text = f"mmp run: {lead}."
    if others:
        text += (f" The other ranks were stopped because of it: {', '.join(others)} (errors "
                 f"they printed, such as a lost connection, follow from it).")
    return text


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
