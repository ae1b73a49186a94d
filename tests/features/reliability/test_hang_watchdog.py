"""The hang watchdog (features/reliability/hang_watchdog.py, elastic/): its deadlines, that it really ends a
hung process with a report the launcher reads, what the launcher says from the reports, and the
restarted group's store prefix (features/reliability/restart_store.py). The whole path through torchrun and
pretrain_gpt.py: tests/training/test_restarts.py."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
import types

import pytest
import wrapt

from megatron_musa_patch.lib.elastic.failure_report import failure_report
from megatron_musa_patch.lib.elastic import reports
from megatron_musa_patch.lib.elastic.watchdog import Deadlines
from megatron_musa_patch.base.errors import ArgumentError
from megatron_musa_patch.upstream.checkpoint_files import TRACKER
from megatron_musa_patch.features.reliability import hang_watchdog, restart_store

from tests.conftest import probe_env, run_probe


def test_deadlines_first_of_a_kind_then_twice_the_slowest_with_a_floor():
    d = Deadlines(timeout=60, first=600)
    assert d.allowed("step") == 600 and d.allowed("save") == 600
    d.finished("step", 500.0)  # the first step warms up: it sets no deadline
    assert d.allowed("step") == 60
    d.finished("step", 20.0)
    d.finished("step", 45.0)
    assert d.allowed("step") == 90
    d.finished("save", 10.0)  # a first save counts
    assert d.allowed("save") == 60
    d.finished("save", 40.0)
    assert d.allowed("save") == 80
    assert Deadlines(timeout=60, first=5).allowed("step") == 60  # never below the timeout


#: the probe inherits the test process's environment (MEGATRON_MUSA_PATCH_AUTOACTIVATE=0): it
#: imports the package without activating it
SECTION = "tests.features.probes.watchdog_section"


def test_a_hung_process_ends_itself_with_a_report_the_launcher_reads(tmp_path):
    start = time.monotonic()
    proc = run_probe(SECTION, tmp_path, "1.5", "hang", env=dict(os.environ), timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    assert took < 15, took
    found = reports.read(str(tmp_path))
    assert list(found) == [3]
    report = found[3]
    assert report.fired and report.pid > 0 and report.timeout == 1.5
    assert report.where == "training step of iteration 2"
    assert "waits_forever" in report.innermost() and not report.was_waiting()
    assert report.main_stack_text().startswith(
        "mmp run: rank 3's main thread when its hang watchdog fired (innermost first):\n  File")


def test_the_agents_stop_signal_writes_where_a_hung_process_was(tmp_path):
    """Its peers' deadlines passed first: the agent's SIGTERM ends it before its own watchdog
    fires, and the report holds its stacks from that signal (not marked as fired)."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", SECTION, str(tmp_path), "60", "hang"],
                            env=probe_env(dict(os.environ)), stderr=subprocess.PIPE, text=True)
    report = tmp_path / "rank3.txt"
    deadline = time.monotonic() + 60
    while not (report.is_file() and "iteration 2" in report.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    time.sleep(0.3)  # inside waits_forever
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    found = reports.read(str(tmp_path))[3]
    assert not found.fired and not found.frozen and found.ended_outside_a_collective()
    assert "waits_forever" in found.innermost(), found.stacks
    assert found.main_stack_text().startswith(
        "mmp run: rank 3's main thread when it was stopped (innermost first):\n  File")


def test_a_process_that_keeps_its_deadlines_is_not_ended(tmp_path):
    proc = run_probe(SECTION, tmp_path, "1.5", "keep", env=dict(os.environ), timeout=60)
    assert proc.returncode == 0, proc.stderr
    # the loop's deadline for the next step is armed: the report names it, without stacks
    report = reports.read(str(tmp_path))[3]
    assert not report.fired
    assert report.where == "after the training step of iteration 2, before the next step"


def _report(rank, where="training step of iteration 6", stacks=""):
    return reports.RankReport(rank, 100 + rank, 60.0, where, stacks,
                              fired=stacks.startswith("Timeout ("))


COLLECTIVE = (f"Timeout (0:01:00)!\nThread 0x1 (most recent call first):\n"
              f'  File "{os.sep}x{os.sep}torch{os.sep}distributed{os.sep}distributed_c10d.py", '
              f"line 5 in all_reduce\n"
              f'  File "/x/megatron/training/training.py", line 9 in train_step\n')
PYTHON_LOOP = ("Timeout (0:01:00)!\nThread 0x2 (most recent call first):\n"
               '  File "/x/threading.py", line 355 in wait\n'
               '  File "/x/threading.py", line 1030 in _bootstrap\n\n'
               "Thread 0x3 (most recent call first):\n"
               '  File "/x/data.py", line 7 in spin\n'
               '  File "/x/pretrain_gpt.py", line 1 in <module>\n')

STOPPED_IN_LOOP = PYTHON_LOOP.split("\n", 1)[1].replace("Thread 0x3", "Current thread 0x3")
WATCHDOG = os.sep.join(["", "site-packages", "megatron_musa_patch", "lib", "elastic", "watchdog.py"])
CANCELLING = ("Timeout (0:01:00)!\nThread 0x4 (most recent call first):\n"
              f'  File "{WATCHDOG}", line 85 in cancel\n'
              f'  File "{WATCHDOG}", line 97 in section\n'
              '  File "/x/contextlib.py", line 158 in __exit__\n'
              '  File "/x/megatron/training/training.py", line 9 in train_step\n')


def test_diagnosis_tells_frozen_hung_and_waiting_ranks_apart():
    sigterm = -signal.SIGTERM
    # rank 1 frozen (armed, never fired, stopped by the agent); rank 0 waited in a collective
    frozen = reports.diagnosis({0: _report(0, stacks=COLLECTIVE), 1: _report(1)},
                               {0: 1, 1: sigterm})
    assert frozen == ("rank 1 (pid 101) stopped in the training step of iteration 6 and did not "
                      "answer its hang watchdog: it was frozen (stopped by a signal such as "
                      "SIGSTOP, held by a debugger, or stuck where Python cannot run); rank 0 "
                      "waited for it in a collective for 60 s and ended itself.")
    # rank 1 hung in a Python loop of the main thread (not the helper thread's wait)
    hung = reports.diagnosis({0: _report(0, stacks=COLLECTIVE), 1: _report(1, stacks=PYTHON_LOOP)},
                             {0: 1, 1: 1})
    assert hung.startswith("rank 1 (pid 101) made no progress for 60 s in the training step of "
                           'iteration 6 and was ended by its hang watchdog; it was at File '
                           '"/x/data.py", line 7 in spin')
    assert "frozen" not in hung and hung.endswith("rank 0 waited for it in a collective for 60 s "
                                                  "and ended itself.")
    # rank 0's collective failed as rank 1 ended, at rank 0's own deadline: its dump caught it
    # cancelling that deadline (seen in CI), which is not a hang of its own
    leaving = reports.diagnosis({0: _report(0, stacks=CANCELLING), 1: _report(1, stacks=PYTHON_LOOP)},
                                {0: 1, 1: 1})
    assert leaving == hung
    # rank 0's deadline passed a moment before rank 1's: the agent's SIGTERM found rank 1 in
    # its Python loop (seen in CI); it is named with its place, not called frozen
    late = reports.diagnosis({0: _report(0, stacks=COLLECTIVE),
                              1: _report(1, stacks=STOPPED_IN_LOOP)}, {0: 1, 1: sigterm})
    assert late == ("rank 1 (pid 101) made no progress in the training step of iteration 6 and "
                    "was stopped when its peers' watchdogs had given up waiting for it, before "
                    'its own deadline passed; it was at File "/x/data.py", line 7 in spin (its '
                    "stack is printed above); rank 0 waited for it in a collective for 60 s and "
                    "ended itself.")
    # the agent found rank 1 stopped as a whole (SIGSTOP): continued to take the stop signal,
    # it wrote stacks too, but it was frozen
    marked = reports.RankReport(1, 101, 60.0, "training step of iteration 6", STOPPED_IN_LOOP,
                                frozen=True)
    assert reports.diagnosis({0: _report(0, stacks=COLLECTIVE), 1: marked},
                             {0: 1, 1: sigterm}) == frozen
    # ... or its watchdog, whose deadline had long passed, fired first once continued (seen on
    # 2 busy cores): still frozen, whatever its exit status
    resumed = dataclasses.replace(marked, stacks=PYTHON_LOOP, fired=True)
    assert reports.diagnosis({0: _report(0, stacks=COLLECTIVE), 1: resumed}, {0: 1, 1: 1}) == \
        frozen
    assert not resumed.shows_where_it_stopped() and _report(1, stacks=PYTHON_LOOP) \
        .shows_where_it_stopped()
    # no watchdog fired: the exit statuses tell (a rank killed, or failing on its own)
    assert reports.diagnosis({0: _report(0), 1: _report(1)}, {1: -9, 0: sigterm}) is None


def test_failure_report_before_a_restart_and_when_none_is_left(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / TRACKER).write_text("4")
    failure = types.SimpleNamespace(exitcode=1, local_rank=0, pid=100, timestamp=0)
    stopped = types.SimpleNamespace(exitcode=-signal.SIGTERM, local_rank=1, pid=101, timestamp=0)
    watchdog = {0: _report(0, stacks=COLLECTIVE), 1: _report(1)}
    script = ["--save", str(ckpt), "--load", str(ckpt)]
    before = failure_report({0: failure, 1: stopped}, script, watchdog, restart=(1, 2))
    assert before.startswith("mmp run: rank 0's main thread when its hang watchdog fired")
    assert before.splitlines()[-1].endswith(
        f"torchrun restarts the group (restart 1 of 2). The latest complete checkpoint in {ckpt} "
        f"is iteration 4; the restarted group resumes from it (--load).")
    final = failure_report({0: failure, 1: stopped}, script, watchdog, max_restarts=2)
    assert "No restart was left (--max-restarts 2). The latest complete checkpoint" in final
    no_load = failure_report({0: failure}, ["--save", str(ckpt)], {}, restart=(1, 1))
    assert no_load.endswith("The script has no --load: the restarted group starts from the "
                            "beginning (give it --load with the --save directory to resume).")


@pytest.fixture
def launcher_side():
    """The launcher's records applied in this process, as mmp run applies them; undone after."""
    from megatron_musa_patch.activation import launcher as activation

    side = activation.activate_launcher()
    yield side
    activation.deactivate_launcher()


def test_the_launchers_records_wrap_the_agent_and_are_undone(launcher_side):
    from torch.distributed.elastic.agent.server import api
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    from megatron_musa_patch.activation import launcher as activation

    wrapped = (LocalElasticAgent.__dict__["_monitor_workers"],
               api.SimpleElasticAgent.__dict__["_restart_workers"],
               subprocess_handler.SubprocessHandler.__dict__["close"])
    rows = {r.id: r.status for r in launcher_side.registry.results()}
    assert {rows[f"reliability.elastic_agent.torch.{m}"] for m in ("monitor", "restart", "close")} \
        == {"applied"}
    assert all(isinstance(w, wrapt.FunctionWrapper) for w in wrapped)
    activation.deactivate_launcher()
    now = (LocalElasticAgent.__dict__["_monitor_workers"],
           api.SimpleElasticAgent.__dict__["_restart_workers"],
           subprocess_handler.SubprocessHandler.__dict__["close"])
    assert [w.__wrapped__ for w in wrapped] == list(now)
    assert not any(isinstance(w, wrapt.FunctionWrapper) for w in now)


def test_the_launchers_records_are_switched_off_like_any_feature(monkeypatch):
    from megatron_musa_patch.activation import launcher as activation

    monkeypatch.setenv("MEGATRON_MUSA_PATCH_DISABLE", "reliability.elastic_agent")
    side = activation.launcher_side()
    side.registry.preview(activation.LAUNCHER_PROCESSES)
    rows = {r.id: r for r in side.registry.results()}
    agent_rows = [r for r in rows.values() if r.feature == "reliability.elastic_agent"]
    assert len(agent_rows) == 6 and {r.status for r in agent_rows} == {"skipped"}
    assert "switched off" in agent_rows[0].reason
    assert rows["reliability.dlrover_run.run"].status == "deferred"
    assert rows["reliability.dlrover_run.run"].reason.startswith("applied by the launcher")
    # the fix dlrover-run needs to start at all is required: ONLY keeps it
    monkeypatch.setenv("MEGATRON_MUSA_PATCH_ONLY", "none")
    monkeypatch.delenv("MEGATRON_MUSA_PATCH_DISABLE")
    side = activation.launcher_side()
    side.registry.preview(activation.LAUNCHER_PROCESSES)
    statuses = {r.feature: r.status for r in side.registry.results()}
    assert statuses["upstream_fixes.dlrover_numa_options"] == "deferred"
    assert statuses["reliability.dlrover_run"] == statuses["reliability.elastic_agent"] == "skipped"


def test_a_stopped_process_takes_the_agents_stop_signal_at_once(launcher_side):
    """SubprocessHandler.close under mmp run: SIGTERM, then SIGCONT for a stopped rank."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    from megatron_musa_patch.lib.elastic.agent import stopped_as_a_whole
    from megatron_musa_patch.lib.elastic.supervision import Job

    import inspect

    extra = {"numa_options": None} if "numa_options" in inspect.signature(
        subprocess_handler.SubprocessHandler).parameters else {}  # newer torch requires it

    def stopped_child():
        handler = subprocess_handler.SubprocessHandler(
            entrypoint=sys.executable, args=("-c", "import time; time.sleep(60)"),
            env=dict(os.environ), stdout=None, stderr=None, local_rank_id=0, **extra)
        os.kill(handler.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not stopped_as_a_whole(handler.proc.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return handler

    heard = []
    handler = stopped_child()
    launcher_side.supervision.job = Job(lambda *a: None, heard.append)
    try:
        handler.close(signal.SIGTERM)
    finally:
        launcher_side.supervision.job = None
    assert handler.proc.wait(timeout=10) == -signal.SIGTERM
    assert heard == [handler.proc.pid]  # what mmp run marks in the report directory
    # no job supervised: the record passes through, and the stopped rank keeps the signal
    idle = stopped_child()
    idle.close(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        idle.proc.wait(timeout=1)  # stopped, the SIGTERM pending
    os.killpg(idle.proc.pid, signal.SIGCONT)
    assert idle.proc.wait(timeout=10) == -signal.SIGTERM
    assert not stopped_as_a_whole(os.getpid())


@pytest.mark.parametrize("flag", ["--hang-timeout", "--hang-timeout-first"])
def test_a_negative_hang_timeout_is_refused(flag):
    args = types.SimpleNamespace(hang_timeout=60.0, hang_timeout_first=600.0)
    setattr(args, flag[2:].replace("-", "_"), -5.0)
    with pytest.raises(ArgumentError) as refused:
        hang_watchdog.mmp_validate_args(args)
    assert str(refused.value) == (f"{flag} must be a number of seconds >= 0, not -5.0 "
                                  f"(--hang-timeout 0 switches the hang watchdog off).")


def test_the_restarted_attempt_gets_its_own_store_prefix_on_one_node():
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2",
           "GROUP_WORLD_SIZE": "1"}
    assert restart_store.attempt_prefix(env) == "mmp_attempt_2/"
    # a store of the job's own (mmp run: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), not torchrun
    assert restart_store.attempt_prefix({**env, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None
    assert restart_store.attempt_prefix({}) is None
    several = {**env, "GROUP_WORLD_SIZE": "4", "TORCHELASTIC_MAX_RESTARTS": "3"}
    assert restart_store.attempt_prefix(several) is None  # restart counts differ between nodes
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in restart_store.several_nodes_warning(several)
    assert restart_store.several_nodes_warning(
        {**several, "TORCHELASTIC_MAX_RESTARTS": "0"}) is None


def test_header_format_is_what_the_reader_parses(tmp_path):
    with open(reports.report_file(str(tmp_path), 0), "w") as report:
        report.write(reports.header(0, 7, 2.5, "evaluation (x)"))
    assert reports.read(str(tmp_path))[0] == reports.RankReport(0, 7, 2.5, "evaluation (x)", "")
    reports.mark_frozen(str(tmp_path), 7)
    assert reports.read(str(tmp_path))[0].frozen


def test_torchrun_shares_its_store_across_attempts_and_the_prefix_keys_them_apart():
    """The cause of the restarted group's failed connect, without Megatron: a key an attempt
    wrote is still there for the next one in torchrun's store (what a late peer's address
    lookup finds), and not under restart_store's per-attempt prefix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    env["MEGATRON_MUSA_PATCH_AUTOACTIVATE"] = "0"
    # torchrun starts the probe as a module (-m) in each rank, with run_probe's PYTHONPATH
    proc = run_probe("torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                     "--max-restarts", "1", "-m", "tests.features.probes.restart_store_stale",
                     env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(l for l in proc.stdout.splitlines() if l.startswith("rank ")) == [
        "rank 0 raw=True prefixed=False", "rank 1 raw=True prefixed=False"]
