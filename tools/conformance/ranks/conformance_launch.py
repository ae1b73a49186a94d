"""Starts a conformance run's ranks by forking them from one process that has imported
megatron-core, instead of torchrun's N fresh interpreters.

Why: on a small machine the ranks' start-up is most of a file's time. Each fresh rank imports
torch, megatron-core and what upstream's conftest.py imports (about 15 s of CPU each on the AMD
EPYC 2-core machine: with 8 ranks, a minute per file before the first test); forked ranks share
that one import. What the ranks then run is unchanged: the same worker, pytest session and
layer activation (the ``MEGATRON_MUSA_PATCH=1`` start-up hook activates the layer here, before
megatron-core is imported, as in every rank). What a fresh process would not share is redone
per rank: the layer reads the local rank when asked, numpy's global generator is reseeded, and
the sizes the layer reads as it activates are set before this process starts.

What torchrun gives a rank, it gives too: the environment (RANK, LOCAL_RANK, WORLD_SIZE, ...,
MASTER_ADDR/PORT), a store the ranks only join (this process hosts it, as torchrun's agent
does, so a rank that finishes first does not take it away from the others), a session of its
own per rank, and the stop of every rank once one exits non-zero, with each rank's exit code
printed as torchrun prints it (``exitcode : -9``). Only for the CPU row: a GPU runtime that an
import initialised does not survive a fork (CUDA's cannot be initialised again in a forked
child), and nothing here has checked that importing megatron-core leaves MUSA's or CUDA's alone.

    python conformance_launch.py --nproc 8 -- tests/unit_tests/test_x.py [pytest args]
"""

import argparse
import atexit
import os
import signal
import socket
import sys
import time
import traceback

import pytest  # noqa: F401 - imported once here, for every rank

import conformance_worker

TERMINATE_GRACE_SECONDS = 30  # torchrun's too: SIGTERM, then SIGKILL


#: what upstream's tests/unit_tests/conftest.py imports on every release (through
#: tests/unit_tests/dist_checkpointing/utils.py and the dataset downloader), before any test: the
#: bulk of a rank's start-up. Nothing of tests/ itself: its Utils reads LOCAL_RANK as it is
#: imported.
PRELOAD = ("megatron.core", "megatron.training.training", "megatron.training.arguments",
           "requests", "click")


def preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # the ranks' own import of it fails again, with their report
            pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sizes_env(nproc: int) -> dict:
    """The part of a rank's environment that the layer reads as it activates (the CPU row
    makes one device, and one generator, per local rank): it must be in place when this
    process starts."""
    return {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc)}


def rank_env(rank: int, nproc: int, port: int) -> dict:
    """What torchrun --standalone sets for a rank of a one-node run."""
    return {**sizes_env(nproc), "RANK": rank, "LOCAL_RANK": rank, "GROUP_RANK": 0,
            "GROUP_WORLD_SIZE": 1, "ROLE_RANK": rank, "ROLE_WORLD_SIZE": nproc,
            "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": 0,
            "TORCHELASTIC_MAX_RESTARTS": 0, "TORCHELASTIC_RUN_ID": "conformance"}


def fresh_random_state() -> None:
    """numpy's global generator as a new process has it, seeded from the OS (Python's random
    reseeds itself in a forked child; torch's seeds are fixed in both)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def run_rank(rank: int, nproc: int, port: int, pytest_args: list) -> None:
    """The forked child: becomes rank ``rank`` and never returns into the launcher's code."""
    code = 1
    try:
        os.setsid()
        os.environ.update({k: str(v) for k, v in rank_env(rank, nproc, port).items()})
        fresh_random_state()
        code = conformance_worker.main(pytest_args)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - the rank's error is printed, its exit code says it
        traceback.print_exc()
    finally:
        try:  # what an interpreter does at exit (its handlers, its buffers), then leave here
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def stop(children: dict) -> list:
    """SIGTERM every live rank's session, SIGKILL what is left after the grace period; the
    ranks' exit codes as :func:`reap` gives them."""
    ended = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in children:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + TERMINATE_GRACE_SECONDS
        while children and sig == signal.SIGTERM and time.monotonic() < deadline:
            ended += reap(children, block=False)
            time.sleep(0.2)
        if sig == signal.SIGKILL:
            ended += reap(children, block=True)
    return ended


def reap(children: dict, block: bool) -> list:
    """The ranks that have ended, [(rank, exit code)], a signal as its negative number; with
    ``block``, waits for one first."""
    ended, flags = [], 0 if block else os.WNOHANG
    while children:
        pid, status = os.waitpid(-1, flags)
        if pid == 0:
            break
        if pid in children:
            ended.append((children.pop(pid), os.waitstatus_to_exitcode(status)))
        flags = os.WNOHANG  # then only those that have ended too
    return ended


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    sizes = sizes_env(args.nproc)
    if any(os.environ.get(k) != v for k, v in sizes.items()):  # started without them: again
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv],
                  {**os.environ, **sizes})
    import megatron_musa_patch

    device = megatron_musa_patch.activate().device.name  # the start-up hook's session
    if device != "cpu":
        print(f"conformance_launch: the layer chose the {device} row; forked ranks are for the "
              f"CPU row only (a GPU runtime does not survive a fork): use --launcher torchrun",
              file=sys.stderr)
        return 2
    preload()
    threads = len(os.listdir(f"/proc/{os.getpid()}/task"))
    if threads > 1:  # a fork copies one thread: a lock another one held would stay held
        print(f"conformance_launch: {threads} threads after the imports; forking "
              f"is not safe: use --launcher torchrun", file=sys.stderr)
        return 2
    port = free_port()
    children = {}
    for rank in range(args.nproc):
        pid = os.fork()
        if pid == 0:
            run_rank(rank, args.nproc, port, pytest_args)
        children[pid] = rank
    # the store after the forks: its server thread must not be copied into the ranks
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)  # noqa: F841
    codes = {}
    while children:
        for rank, code in reap(children, block=True):
            codes[rank] = code
            if code != 0 and children:  # as torchrun: one rank failed, the others are stopped
                codes.update(stop(children))
    failed = {rank: code for rank, code in sorted(codes.items()) if code != 0}
    for rank, code in failed.items():
        print(f"conformance_launch: rank {rank} exitcode : {code}", flush=True)
    return next(iter(failed.values())) if failed else 0


if __name__ == "__main__":
    sys.exit(main())
