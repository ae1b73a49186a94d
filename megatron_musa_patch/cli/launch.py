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
import functools
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from megatron_musa_patch.lib.elastic import reports
from megatron_musa_patch.lib.heartbeat import Heartbeat, say
from megatron_musa_patch.lib.elastic.agent import Elastic, driven
from megatron_musa_patch.core.errors import ArgumentError
from megatron_musa_patch.core.settings import PREFIX

TRACKER = "latest_checkpointed_iteration.txt"
WATCHDOG_DIR_ENV = f"{PREFIX}_WATCHDOG_DIR"
FRESH_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def parser():
    """torchrun's own parser (its options, then the script and its arguments), as ``mmp run``."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "mmp run"
    parser.description = ("torchrun with the layer active in every rank: torchrun's options, then "
                          "the training script and its arguments, unchanged. --max-restarts N "
                          "restarts a group whose rank died or hung, from the latest checkpoint.")
    parser.epilog = ("Exit status: 0 the job finished; 1 it failed (after its restarts; which rank, "
                     "where, and which checkpoint to resume from are said before); 2 a bad "
                     "option, or the layer refused to activate.")
    return parser


def run(argv: List[str]) -> int:
    doing = ["importing torch (torchrun's options)"]
    heartbeat = Heartbeat(say, lambda elapsed: f"mmp run: {doing[0]} ({elapsed:.0f} s)")
    heartbeat.notice()
    heartbeat.start()
    try:  # the same heartbeat goes on while the ranks start (supervised)
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import run as torchrun

        args = parser().parse_args(argv)
        script_args = list(args.training_script_args)
        if not args.no_python and not args.module and not os.path.isfile(args.training_script):
            raise ArgumentError(
                f"mmp run: the training script {args.training_script} does not exist (relative "
                f"to {os.getcwd()}). Fix the path (for Megatron-LM: "
                f"$MEGATRON_LM_PATH/pretrain_gpt.py), or pass -m for a module.")
        if not args.no_python and not args.module:
            doing[0] = f"checking {os.path.basename(args.training_script)}'s arguments"
            code = check_arguments(args.training_script, script_args, args.nnodes,
                                   args.nproc_per_node)
            if code is not None:
                return code
        # every Python process the job starts (data-loader or checkpoint workers too) activates
        os.environ["MEGATRON_MUSA_PATCH"] = "1"
        if not args.no_python:
            mode = "--module" if args.module else "--script"
            args.training_script_args = [mode, args.training_script, *args.training_script_args]
            args.training_script = "megatron_musa_patch.cli.run_worker"
            args.module = True
        with supervised(script_args, args.max_restarts, heartbeat=heartbeat):
            torchrun(args)
    except ChildFailedError:
        return 1
    finally:
        heartbeat.stop()
    return 0


#: the launcher says what it is doing while the ranks start, until this long after its start (a node whose ranks never say
#: they are up, with the layer's progress feature off, stays quiet after it)
STARTING_MOST_S = 300.0


def check_arguments(script: str, script_args: List[str], nnodes: str,
                    nproc_per_node: str) -> Optional[int]:
    """Megatron's parser and validate_args on the script's arguments before any rank starts
    (``args_check``): the exit status when the job must not start (2: refused, said once; 0:
    ``--help`` printed), None to start the ranks."""
    from . import args_check

    ranks = args_check.world_size(nnodes, nproc_per_node)
    name = os.path.basename(script)
    if ranks is None or not args_check.wanted(script):
        print(f"mmp run: starting {name} ({_ranks_said(nnodes, nproc_per_node)})", flush=True)
        return None
    local = ranks // max(int(str(nnodes).split(":", 1)[0]), 1)
    print(f"mmp run: checking {name}'s arguments with Megatron's parser for {ranks} ranks, then "
          f"starting them", flush=True)
    # "gpu" / "auto" had torch ask the driver about the devices: no fork after that
    verdict = args_check.check(script, script_args, ranks, local,
                               may_fork=str(nproc_per_node).isdigit())
    if verdict.status == "refused":
        print(verdict.text, file=sys.stderr, flush=True)
        return 2
    if verdict.status == "printed":
        print(verdict.text, end="", flush=True)
        return 0
    if verdict.status == "unknown":  # the ranks will tell; say why the launcher could not
        print(f"mmp run: the arguments were not checked before the start ({verdict.text})",
              flush=True)
    return None


def _ranks_said(nnodes: str, nproc_per_node: str) -> str:
    return f"--nnodes {nnodes} --nproc-per-node {nproc_per_node}"


@contextmanager
def supervised(script_args: List[str], max_restarts: int, launcher: str = "mmp run",
               restarter: str = "torchrun", elastic: Optional[Elastic] = None,
               heartbeat: Optional[Heartbeat] = None):
    """The launcher's side of a job while torch's elastic agent (or one derived from it) runs
    it in this process: a fresh store per attempt, the ranks' hang watchdog reports
    (features/hang_watchdog.py) collected in a directory and said before each restart, and when
    the job fails (ChildFailedError, re-raised) the paragraph of who failed where and which
    checkpoint to resume from."""
    elastic = elastic or Elastic.torch()
    os.environ.setdefault(FRESH_STORE_ENV, "1")
    own_dir = not os.environ.get(WATCHDOG_DIR_ENV)
    if own_dir:
        os.environ[WATCHDOG_DIR_ENV] = tempfile.mkdtemp(prefix="mmp-watchdog-")
    report_dir = os.environ[WATCHDOG_DIR_ENV]
    said = dict(launcher=launcher, restarter=restarter)

    def on_restart(failures, restart, most):
        stop_leftovers(failure.pid for failure in failures.values())
        print(failure_report(failures, script_args, reports.read(report_dir),
                             restart=(restart, most), errors=reports.read_errors(report_dir),
                             **said), file=sys.stderr, flush=True)
        reports.clear(report_dir)

    reports.forget_attempt(report_dir)  # a directory of the user's may hold an earlier job's
    # the launcher's progress lines go on until this node's first rank is up (rank 0 then says
    # what it does itself: features/startup_progress.py), for a few minutes at most
    starting = heartbeat or Heartbeat(say, None)
    starting.describe = lambda elapsed: (f"{launcher}: the ranks are starting (each imports "
                                         f"torch and Megatron; {elapsed:.0f} s)")
    starting.until = lambda: reports.rank_started(report_dir)
    starting.most_s = STARTING_MOST_S
    reports.launcher_said(report_dir, starting.last_output())
    starting.start()
    try:
        with driven(on_restart, elastic, lambda pid: reports.mark_frozen(report_dir, pid)), \
                starting:
            yield
    except elastic.child_failed as exc:
        stop_leftovers(failure.pid for failure in exc.failures.values())
        print(failure_report(exc.failures, script_args, reports.read(report_dir),
                             max_restarts=max_restarts, errors=reports.read_errors(report_dir),
                             **said), file=sys.stderr, flush=True)
        raise
    finally:
        if own_dir:
            shutil.rmtree(report_dir, ignore_errors=True)
            os.environ.pop(WATCHDOG_DIR_ENV, None)


@dataclass(frozen=True)
class Launcher:
    """A launcher other than torchrun whose agent gets ``mmp run``'s side through the env hook."""

    name: str  # as it says itself in the reports
    module: str  # the module whose ``run(args)`` parses nothing more and runs the agent
    elastic: Callable[[], Elastic]  # the elastic package its agent runs on
    verified: str  # the launcher's releases this was verified with
    fix: Optional[Callable[[object], None]] = None  # what it needs to run at all, on its module


def _dlrover_subprocess_handler(module) -> None:
    """dlrover 0.6.1 starts its standalone master with torch's SubprocessHandler as torch 2.3
    called it, six arguments; torch since then requires a seventh, numa_options, and
    ``dlrover-run --standalone`` failed with a TypeError. None: no NUMA binding."""
    import inspect

    import wrapt

    def subprocess_handler(wrapped, instance, args, kwargs):
        if len(args) == 6 and "numa_options" not in kwargs and \
                "numa_options" in inspect.signature(wrapped).parameters:
            kwargs = dict(kwargs, numa_options=None)
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(module, "SubprocessHandler", subprocess_handler)


LAUNCHERS = {
    "dlrover-run": Launcher("dlrover-run", "dlrover.trainer.torch.elastic_run", Elastic.torch,
                            "dlrover==0.6.1", _dlrover_subprocess_handler),
    "ft_launcher": Launcher("ft_launcher", "nvidia_resiliency_ext.fault_tolerance.launcher",
                            Elastic.nvrx, "nvidia-resiliency-ext==0.4.1"),
}


def supervise(name: str) -> None:
    """In the agent of launcher ``name`` started with MEGATRON_MUSA_PATCH=1 (the .pth hook calls
    this; the workers it starts activate the layer themselves): what ``mmp run`` gives torchrun,
    from when the launcher's module is imported."""
    import wrapt

    launcher = LAUNCHERS[name]
    wrapt.register_post_import_hook(functools.partial(_supervise_module, launcher),
                                    launcher.module)


def _supervise_module(launcher: Launcher, module) -> None:
    import wrapt

    if getattr(module, "_mmp_supervised", False):  # the .pth hook ran twice (a site dir twice)
        return
    module._mmp_supervised = True

    def run(wrapped, instance, args, kwargs):
        parsed = args[0] if args else kwargs["args"]
        with supervised(list(parsed.training_script_args), parsed.max_restarts,
                        launcher=f"mmp ({launcher.name})", restarter=launcher.name,
                        elastic=launcher.elastic()):
            return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(module, "run", run)
    if launcher.fix is not None:
        launcher.fix(module)


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
