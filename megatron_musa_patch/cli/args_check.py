"""``mmp run`` checks the training script's arguments before any rank starts.

A flag Megatron does not know, a layout the ranks cannot hold, a layer flag whose feature is off:
each rank finds these only after importing torch and Megatron, and each says it, so a typo used to
cost every rank's start-up and printed Megatron's usage once per rank. Here the launcher starts one
process (``args_check_worker``) that activates the layer as a rank would, loads the script's
module (its imports and definitions, not its ``__main__`` block), and runs Megatron's own
``parse_args`` and ``validate_args`` of the installed release with what the script passes them
(``extra_args_provider``, ``args_defaults``) for the job's world size. A refusal is said once, as
one paragraph, and the job exits 2 without starting a rank; the words are Megatron's own (or the
layer's paragraph), the layer only adds the nearest known flag to an unknown one.

Only a Megatron entry script is checked: one whose ``if __name__ == "__main__":`` block calls
``pretrain``, ``parse_and_validate_args`` or ``initialize_megatron``. Anything else, a world size
the launcher cannot know (``--nnodes 1:4``), or ``MEGATRON_MUSA_PATCH_ARGS_CHECK=0`` starts the
ranks as before; so does a check that cannot tell (the script's module fails to import: the ranks
then say why).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

#: the calls that take Megatron's ``extra_args_provider`` and ``args_defaults``, in the order a
#: script's ``__main__`` block makes them (0.19's pretrain_gpt.py parses before ``pretrain``)
ENTRY_CALLS = ("parse_and_validate_args", "initialize_megatron", "pretrain")
#: the check's own limit: it never holds a job longer than this
TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the worker found: ``status`` is ``ok``, ``refused`` (``text`` is the paragraph),
    ``printed`` (``--help``: ``text`` is Megatron's help, the job ends 0) or ``unknown``."""

    status: str
    text: str = ""
    seconds: float = 0.0
    #: the release that checked, as the worker's Megatron reports it
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
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call) and _called_name(inner) in ENTRY_CALLS:
                    found.append(inner)
    found.sort(key=lambda call: (call.lineno, call.col_offset))
    return found[0] if found else None


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _called_name(call: ast.Call) -> Optional[str]:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


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
          environ=None) -> Verdict:
    """Run the worker for a job of ``ranks`` ranks (``local_ranks`` on this node): forked from
    this process, which has imported torch already, where the platform forks; else a new
    interpreter."""
    if hasattr(os, "fork") and environ is None:
        return _forked(script, script_args, ranks, local_ranks)
    return _spawned(script, script_args, ranks, local_ranks, environ)


def _rank_zero_env(ranks: int, local_ranks: int) -> dict:
    return dict(RANK="0", LOCAL_RANK="0", GROUP_RANK="0", WORLD_SIZE=str(ranks),
                LOCAL_WORLD_SIZE=str(local_ranks))


def _forked(script: str, script_args: List[str], ranks: int, local_ranks: int) -> Verdict:
    begin = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mmp-args-check-") as tmp:
        out = os.path.join(tmp, "verdict.json")
        pid = os.fork()
        if pid == 0:  # the child: rank 0 as far as arguments go, its output nowhere
            code = 0
            try:
                _quiet_child()
                os.environ.pop("MEGATRON_MUSA_PATCH", None)
                os.environ.update(_rank_zero_env(ranks, local_ranks))
                from . import args_check_worker

                args_check_worker.main([out, script, *script_args])
            except BaseException:  # noqa: BLE001 - the parent reads no verdict: "unknown"
                code = 1
            finally:
                os._exit(code)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                return Verdict("unknown", f"the check took over {TIMEOUT_S:.0f} s",
                               time.monotonic() - begin)
            time.sleep(0.02)
        try:
            with open(out, encoding="utf-8") as f:
                return Verdict(**json.load(f))
        except (OSError, ValueError, TypeError):
            return Verdict("unknown", f"the check ended without a verdict (wait status "
                                      f"{status})", time.monotonic() - begin)


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
    import warnings

    warnings.simplefilter("ignore")


def _spawned(script: str, script_args: List[str], ranks: int, local_ranks: int,
             environ=None) -> Verdict:
    env = dict(os.environ if environ is None else environ)
    # the worker activates itself, catching a refusal (the package's import would not)
    env.pop("MEGATRON_MUSA_PATCH", None)
    env["MEGATRON_MUSA_PATCH_AUTOACTIVATE"] = "0"
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
        try:
            with open(out, encoding="utf-8") as f:
                return Verdict(**json.load(f))
        except (OSError, ValueError, TypeError):
            pass
    # no verdict: the worker ended before writing one (a crash, or killed)
    tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    return Verdict("unknown", f"the check ended without a verdict ({tail[0][:200]})",
                   time.monotonic() - begin)
