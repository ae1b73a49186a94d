"""One upstream test file on N ranks: started, watched for a deadlock, stopped at its timeout,
and its ranks' event streams merged into one record per test."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .classify import listed
from .tables import NOT_RUN

RANKS = Path(__file__).resolve().parent / "ranks"
WORKER = RANKS / "conformance_worker.py"
FORK_LAUNCHER = RANKS / "conformance_launch.py"

def every_test_file(lm_path: Path):
    """Every test file of the checkout's tests/unit_tests, relative to it, in path order."""
    root = lm_path / "tests" / "unit_tests"
    return sorted(str(p.relative_to(root)) for p in root.rglob("test_*.py"))


# ---------------------------------------------------------------------------- running a file
#: how long every rank of a file may sit idle (no event written, next to no CPU used) before
#: the file is taken as deadlocked and stopped, rather than at its timeout: ranks that left a
#: collective at different tests (one failed where the others wait) never resume, and a file's
#: timeout is sized for its slowest real work. Measured here: 8 ranks stuck in a barrier use
#: 0.4 CPU seconds a minute between them; one rank at work uses 60.
STALL_SECONDS = 240.0
#: the CPU the ranks may use in that window and still count as idle: 5% of one core
STALL_CPU_SHARE = 0.05
POLL_SECONDS = 5.0
PROC = Path("/proc")


class IdleWatch:
    """Whether a file's ranks have been idle for ``window`` seconds: no rank wrote an event,
    and the ranks with everything they started (each leads a session of its own) used less
    than ``STALL_CPU_SHARE`` of a core, read from /proc."""

    def __init__(self, out: Path, window: float):
        self.out, self.window = out, window
        self.samples = []  # (monotonic time, CPU seconds of the ranks' sessions, event bytes)
        self.sessions = set()

    def idle(self, now: float) -> bool:
        if not PROC.is_dir():  # no way to tell idle from busy: only the timeout stops a file
            return False
        sessions = set()
        for pid_file in self.out.glob("rank*.pid"):
            try:
                sessions.add(int(pid_file.read_text()))
            except ValueError:  # being written
                pass
        if sessions != self.sessions:  # ranks started: the window starts with them, not with
            # the launcher's start-up before them (their CPU then counted as none)
            self.sessions, self.samples = sessions, []
        events = sum(f.stat().st_size for f in self.out.glob("rank*.jsonl"))
        self.samples.append((now, session_cpu_seconds(sessions), events))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window:
            self.samples.pop(0)
        then, cpu_then, events_then = self.samples[0]
        return (bool(sessions) and now - then >= self.window and events == events_then
                and self.samples[-1][1] - cpu_then < STALL_CPU_SHARE * (now - then))


def session_cpu_seconds(sessions: set) -> float:
    """User and system CPU seconds of the live processes of these sessions (Linux /proc)."""
    ticks = 0
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[3]) in sessions:  # session id; utime and stime are fields 14 and 15
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def run_file(python: str, lm_path: Path, test_file: str, nproc: int, timeout: float,
             env_extra: dict, stall: float = STALL_SECONDS, launcher: str = "torchrun") -> dict:
    with tempfile.TemporaryDirectory(prefix="mmp-conformance-") as out:
        env = dict(os.environ)
        env.update(MEGATRON_MUSA_PATCH="1", MEGATRON_LM_PATH=str(lm_path),
                   MMP_CONFORMANCE_OUT=out, OMP_NUM_THREADS="1", **env_extra)
        env.setdefault("MEGATRON_MUSA_PATCH_DEVICE", "cpu")
        if launcher == "fork":  # conformance_launch.sizes_env: in place at its start-up, else
            # it starts itself again (the start-up hook's import of torch twice per file)
            env.update(WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc))
        deselected = {n: (outcome, why) for outcome, table in NOT_RUN.items()
                      for n, why in table.items() if n.split("::", 1)[0] == test_file}
        pytest_args = [test_file, *(f"--deselect={n}" for n in deselected)]
        command = ([python, str(FORK_LAUNCHER), f"--nproc={nproc}", "--", *pytest_args]
                   if launcher == "fork" else
                   [python, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={nproc}", str(WORKER), *pytest_args])
        begin = time.monotonic()
        # output to a file, not a pipe: a rank left behind must not keep the run waiting
        log_path = Path(out) / "output.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(command, cwd=str(lm_path), env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            watch = IdleWatch(Path(out), stall)
            while True:
                try:
                    proc.wait(timeout=POLL_SECONDS)
                    status = "finished"
                    break
                except subprocess.TimeoutExpired:
                    now = time.monotonic()
                    if now - begin >= timeout:
                        status = "timeout"
                    elif watch.idle(now):
                        status = f"stalled: every rank idle for {stall:.0f} s"
                    else:
                        continue
                    _kill(proc, Path(out))
                    break
        output = log_path.read_text(errors="replace")
        seconds = time.monotonic() - begin
        events = {}
        for rank_file in sorted(Path(out).glob("rank*.jsonl")):
            rank = int(rank_file.stem[4:])
            events[rank] = [json.loads(line) for line in rank_file.read_text().splitlines()
                            if line.strip()]
    killed = [code for code in re.findall(r"exitcode\s*:\s*(-\d+)", output)
              if code in ("-9", "-6", "-11")]  # not -15: torchrun's stop of the other ranks
    if status == "finished" and killed:
        status = f"rank killed (signal {-int(killed[0])})"
    tests = merge(events, status)
    tests.update(deselected_records(events, deselected))
    return {"file": test_file, "nproc": nproc, "launcher": launcher, "timeout": timeout,
            "status": status,
            "returncode": proc.returncode, "seconds": round(seconds, 1), "tests": tests,
            "output_tail": output[-2500:]}


def deselected_records(events: dict, deselected: dict) -> dict:
    """The records of the tests the runner deselected that the file has: pytest reports those
    (another release's parameters match nothing, and must not be counted). An entry may name
    a test without its parameters: like pytest's --deselect, it is a prefix of node ids."""
    found = {n for rank_events in events.values() for event in rank_events
             if event["event"] == "deselected" for n in event["nodeids"]}
    records = {}
    for nodeid in sorted(found):
        entry = listed(deselected, nodeid)
        if entry is not None:
            outcome, why = entry
            records[nodeid] = {"outcome": outcome, "message": why, "seconds": 0.0}
    return records





def _kill(proc, out: Path) -> None:
    """torchrun's process group, and the ranks with what they started (each rank leads a
    session of its own: a test's worker pool, e.g. preprocess_data's, is in its group)."""
    for pid_file in out.glob("rank*.pid"):
        try:
            pid = int(pid_file.read_text())
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # not a group leader any more: the rank alone
                os.kill(pid, signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def merge(events: dict, status: str) -> dict:
    """nodeid -> {outcome, message, seconds}: a test passed where every rank passed it, failed
    where one rank failed it (the lowest such rank's message), skipped as rank 0 skipped it."""
    collected, flaky = [], set()
    for rank in sorted(events):
        for event in events[rank]:
            if event["event"] == "collected" and not collected:
                collected, flaky = event["nodeids"], set(event.get("flaky", ()))
    per_test = collections.defaultdict(dict)  # nodeid -> rank -> (outcome, message, seconds)
    started = collections.defaultdict(set)
    errors, module_skips = {}, {}
    for rank, rank_events in sorted(events.items()):
        for event in rank_events:
            if event["event"] == "start":
                started[event["nodeid"]].add(rank)
            elif event["event"] == "collect_error":
                errors.setdefault(event["nodeid"], event["message"])
            elif event["event"] == "collect_skip":
                module_skips.setdefault(event["nodeid"], event["message"])
            elif event["event"] == "report":
                outcome, message, seconds = per_test[event["nodeid"]].get(rank, ("passed", "", 0))
                seconds += event["duration"]
                if event["outcome"] == "failed" and outcome != "failed":
                    outcome, message = "failed", f"[{event['when']}] {event['message']}"
                elif event["outcome"] == "skipped" and outcome == "passed":
                    outcome, message = "skipped", event["message"]
                per_test[event["nodeid"]][rank] = (outcome, message, seconds)
    ranks = sorted(events)
    result = {}
    unfinished_seen = False
    for nodeid in collected:
        by_rank = per_test.get(nodeid, {})
        finished = [r for r in ranks if r in by_rank and _complete(events[r], nodeid)]
        failed = [r for r in finished if by_rank[r][0] == "failed"]
        seconds = max((by_rank[r][2] for r in by_rank), default=0.0)
        left = [r for r in ranks if r not in finished]
        if failed and left and status != "finished" and not unfinished_seen:
            # the failing ranks went on; the file stopped in this test, not in the next one
            outcome, message = "hung", (f"ranks {failed} failed it ({by_rank[failed[0]][1]}) "
                                        f"while ranks {left} never finished it ({status})")
            unfinished_seen = True
        elif failed:
            outcome, message = "failed", by_rank[failed[0]][1]
        elif len(finished) < len(ranks):
            ran = bool(started.get(nodeid))
            why = "timeout" if status == "timeout" else status
            if ran and not unfinished_seen:
                outcome, message = "hung", f"running when the file stopped ({why})"
                unfinished_seen = True
            else:
                outcome, message = "not run", f"the file stopped before it ({why})"
        elif by_rank[ranks[0]][0] == "skipped":
            outcome, message = "skipped", by_rank[ranks[0]][1]
        else:
            outcome, message = "passed", ""
        result[nodeid] = {"outcome": outcome, "message": message[:600],
                          "seconds": round(seconds, 2)}
        if nodeid in flaky:
            result[nodeid]["flaky"] = True
    for nodeid, message in errors.items():
        result[nodeid] = {"outcome": "failed", "message": f"[collect] {message}"[:600],
                          "seconds": 0.0}
    for nodeid, message in module_skips.items():
        result.setdefault(nodeid, {"outcome": "skipped", "message": message[:600],
                                   "seconds": 0.0})
    return result


def _complete(rank_events, nodeid) -> bool:
    return any(e["event"] == "report" and e["nodeid"] == nodeid and e["when"] == "teardown"
               for e in rank_events)
