"""``mmp run`` checks the training script's arguments before any rank starts.

A flag Megatron does not know, a layout the ranks cannot hold, a layer flag whose feature is off:
each rank finds these only after importing torch and Megatron, and each says it, so a typo used to
cost every rank's start-up and printed Megatron's usage once per rank. Here the launcher forks a
child (``args_check_worker``; a new interpreter where forking is not safe: the MUSA row, whose
torchada must come before torch, or a launcher that asked torch about its GPUs) that activates the
layer as rank 0 would, evaluates what the script's entry call passes Megatron
(``extra_args_provider``, ``args_defaults``), and runs Megatron's own ``parse_args`` and
``validate_args`` of the installed release for the job's world size. A refusal is said once, as
one paragraph, and the job exits 2 without starting a rank; the words are Megatron's own (or the
layer's paragraph), the layer only adds the nearest known flag to an unknown one.

Only a Megatron entry script is checked (``megatron_entry``): one whose
``if __name__ == "__main__":`` block calls ``pretrain``, ``parse_and_validate_args`` or
``initialize_megatron`` with Megatron's own parsing. Anything else, a world size the launcher
cannot know (``--nnodes 1:4``), or ``MEGATRON_MUSA_PATCH_ARGS_CHECK=0`` starts the ranks as
before; so does a check that cannot tell (the script fails to load, Megatron fails for a reason
other than its arguments): the ranks then say it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from typing import List, Optional

from megatron_musa_patch.base.env_names import ACTIVATE_ENV, AUTOACTIVATE_ENV, WATCHDOG_DIR_ENV

from .megatron_entry import Verdict, entry_call

#: the check's own limit: it never holds a job longer than this
TIMEOUT_S = 120.0


def world_size(nnodes: str, nproc_per_node: str) -> Optional[int]:
    """The job's ranks, when the launcher's options fix them (``--nnodes 2``, not ``1:4``)."""
    if ":" in str(nnodes):
        low, high = str(nnodes).split(":", 1)
        if low != high:
            return None
        nnodes = low
    try:
        nodes = int(nnodes)
    except ValueError:
        return None
    try:
        local = int(nproc_per_node)
    except ValueError:
        # "gpu" / "auto" ask torch about the devices: the check is then not forked (below)
        from torch.distributed.run import determine_local_world_size

        try:
            local = determine_local_world_size(nproc_per_node)
        except ValueError:
            return None
    return nodes * local


def wanted(script: str, environ=os.environ) -> bool:
    """Whether ``script`` is a Megatron entry script and the check is on."""
    from megatron_musa_patch.core.settings import from_env

    if not from_env(environ).args_check:
        return False
    try:
        with open(script, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError):
        return False
    return entry_call(source) is not None


def check(script: str, script_args: List[str], ranks: int, local_ranks: int,
          may_fork: bool = True) -> Verdict:
    """Run the worker for a job of ``ranks`` ranks (``local_ranks`` on this node): forked from
    this process, which has imported torch already, where that is safe (``forkable``); else in a
    new interpreter."""
    if may_fork and forkable():
        try:
            return _forked(script, script_args, ranks, local_ranks)
        except OSError:  # no fork to be had (limits): a new interpreter
            pass
    return _spawned(script, script_args, ranks, local_ranks)


def forkable() -> bool:
    """Whether a child forked from the launcher can activate the layer as a rank does: Linux
    (forking after importing torch is not safe on macOS), and not where torch_musa is installed
    (the MUSA row imports torchada before torch, and the launcher has imported torch)."""
    return sys.platform.startswith("linux") and importlib.util.find_spec("torch_musa") is None


def _rank_zero_env(ranks: int, local_ranks: int) -> dict:
    return dict(RANK="0", LOCAL_RANK="0", GROUP_RANK="0", WORLD_SIZE=str(ranks),
                LOCAL_WORLD_SIZE=str(local_ranks))


#: what the check must not inherit: it activates itself (a refusal caught, not printed), and it
#: leaves nothing in the launcher's report directory (it is no rank)
_NOT_INHERITED = (ACTIVATE_ENV, WATCHDOG_DIR_ENV)


def _forked(script: str, script_args: List[str], ranks: int, local_ranks: int) -> Verdict:
    begin = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mmp-args-check-") as tmp:
        out = os.path.join(tmp, "verdict.json")
        with warnings.catch_warnings():
            # 3.12+ warns of a fork with threads running: the launcher's heartbeat, which the
            # child does not use (it writes through new streams, _quiet_child)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: rank 0 as far as arguments go, its output nowhere
            code = 0
            try:
                _quiet_child()
                for name in _NOT_INHERITED:
                    os.environ.pop(name, None)
                os.environ.update(_rank_zero_env(ranks, local_ranks))
                from . import args_check_worker

                args_check_worker.main([out, script, *script_args])
            except BaseException:  # noqa: BLE001 - the parent reads no verdict: "unknown"
                code = 1
            finally:
                os._exit(code)
        status = _reap(pid, time.monotonic() + TIMEOUT_S)
        if status is None:
            return Verdict("unknown", f"the check took over {TIMEOUT_S:.0f} s",
                           time.monotonic() - begin)
        return _read_verdict(out) or Verdict(
            "unknown", f"the check ended without a verdict (wait status {status})",
            time.monotonic() - begin)


def _read_verdict(path: str) -> Optional[Verdict]:
    """The verdict the check wrote, or None where it wrote none (it crashed or was killed)."""
    try:
        with open(path, encoding="utf-8") as f:
            return Verdict(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def _reap(pid: int, deadline: float) -> Optional[int]:
    """The child's wait status, or None once it was killed at ``deadline`` (or the launcher was
    interrupted: the child does not outlive it)."""
    try:
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored)
                return 0
            if done:
                return status
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
    except BaseException:
        _kill(pid)
        raise
    _kill(pid)
    return None


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _quiet_child() -> None:
    """The forked child prints nothing, through new stream objects (a thread of the parent may
    have held the old ones' locks at the fork)."""
    import io

    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    warnings.simplefilter("ignore")


def _spawned(script: str, script_args: List[str], ranks: int, local_ranks: int) -> Verdict:
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    # the package's import would activate, and print a refusal instead of handing it over
    env[AUTOACTIVATE_ENV] = "0"
    env.update(_rank_zero_env(ranks, local_ranks), PYTHONWARNINGS="ignore")
    begin = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mmp-args-check-") as tmp:
        out = os.path.join(tmp, "verdict.json")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "megatron_musa_patch.cli.args_check_worker", out, script,
                 *script_args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Verdict("unknown", f"the check took over {TIMEOUT_S:.0f} s",
                           time.monotonic() - begin)
        found = _read_verdict(out)
        if found is not None:
            return found
    # no verdict: the worker ended before writing one (a crash, or killed)
    tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    return Verdict("unknown", f"the check ended without a verdict ({tail[0][:200]})",
                   time.monotonic() - begin)
