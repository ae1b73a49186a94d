"""A conversion interrupted any way stops every process it started, removes what it wrote, and
says so (needs MEGATRON_LM_PATH). The import at TP2 runs its step as torchrun with two ranks
(each in a session of its own); SIGINT or SIGTERM to the ``mmp`` process alone
once those ranks run, or SIGKILL to one rank, must leave no process of the step (torchrun's
agent, its ranks, Megatron's writers) and no directory behind."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.checkpoint import tiny_models
from tests.harness import stock as runner

pytestmark = pytest.mark.stock


def processes_with(marker: str) -> dict:
    """pid -> parent of every process whose command line holds ``marker``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if marker in cmdline:
            found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])  # field 4: parent
    return found


def alive(pids) -> list:
    """Those of ``pids`` still running (not ended, not a zombie)."""
    left = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.append(pid)
    return left


def start_import(lm_path, tmp_path, log):
    """The import, its output into ``log`` (a pipe would make the test wait for every process
    that inherited it, so that one left behind would have ended by the time it is looked for)."""
    hf = tiny_models.make("llama", tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.update(MEGATRON_LM_PATH=str(lm_path), OMP_NUM_THREADS="1")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [runner.mmp_executable(), "checkpoint", "import-hf", "--hf-dir", str(hf), "--save",
             str(tmp_path / "out"), "--tensor-model-parallel-size", "2", "--ckpt-format",
             "torch"], env=env, stdout=out, stderr=subprocess.STDOUT)
    # the step's processes: torchrun's agent, a child of mmp, and its two ranks
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        step = processes_with(f"--mode fill --plan {tmp_path}")
        agent = [pid for pid, parent in step.items() if parent == proc.pid]
        ranks = [pid for pid, parent in step.items() if agent and parent == agent[0]]
        if len(ranks) == 2:
            return proc, agent + ranks
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the fill's two ranks never ran: {Path(log).read_text()[-3000:]}")


def assert_nothing_left(tmp_path, step):
    """No process of the step (nor one a rank started: they run the same command line) is
    left, and no file."""
    left = alive(set(step) | set(processes_with(f"--plan {tmp_path}")))
    assert left == [], f"processes of the step outlived the conversion: {left}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"], list(tmp_path.iterdir())


@pytest.fixture
def log(tmp_path_factory):
    return tmp_path_factory.mktemp("log") / "mmp.log"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_mmp_alone_stops_the_step_and_removes_what_it_wrote(lm_path, tmp_path,
                                                                        log, signum):
    proc, step = start_import(lm_path, tmp_path, log)
    assert os.getsid(step[0]) != os.getsid(proc.pid)  # a Ctrl-C reaches mmp alone
    proc.send_signal(signum)
    proc.wait(timeout=120)
    err = log.read_text()
    assert proc.returncode == 128 + signum, err[-3000:]
    assert (f"interrupted by {signal.Signals(signum).name}: the conversion's processes were "
            f"stopped and what it had written removed; nothing was written.") in err
    assert_nothing_left(tmp_path, step)


def test_a_killed_rank_stops_the_step_and_removes_what_it_wrote(lm_path, tmp_path, log):
    proc, step = start_import(lm_path, tmp_path, log)
    os.kill(step[1], signal.SIGKILL)
    proc.wait(timeout=120)
    err = log.read_text()
    assert proc.returncode == 1, err[-3000:]
    assert "the fill step on 2 rank(s) failed" in err and "nothing was written" in err
    assert_nothing_left(tmp_path, step)


def test_an_interrupted_export_removes_the_directory_it_was_writing(lm_path, tmp_path, log):
    """The export's Hugging Face directory is written by its step into a directory mmp made
    beside the target: a SIGTERM while the step runs leaves neither it nor the step's work."""
    from tests.checkpoint.hf_steps import import_hf

    imported = import_hf(tiny_models.make("llama", tmp_path), tmp_path / "imported", [],
                         "torch_dist", lm_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.update(MEGATRON_LM_PATH=str(lm_path), OMP_NUM_THREADS="1")
    with open(log, "w") as out:
        proc = subprocess.Popen([runner.mmp_executable(), "checkpoint", "export-hf", "--load",
                                 str(imported), "--hf-dir", str(tmp_path / "exported")],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        step = processes_with("--mode dump --plan ")
        if step and [p.name for p in tmp_path.iterdir() if p.name.startswith(".exported.tmp-")]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the dump step never ran: {log.read_text()[-3000:]}")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert proc.returncode == 143, log.read_text()[-3000:]
    assert alive(step) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imported", "llama"]


def test_a_step_takes_the_signals_that_stop_it():
    """A step's processes are started with no signal blocked (a step started while mmp blocks
    them would ignore the SIGTERM that stops it)."""
    import sys

    from megatron_musa_patch.checkpoint import processes

    code = processes.run([sys.executable, "-c", "import sys; sys.exit(int(next(l for l in open("
                          "'/proc/self/status') if l.startswith('SigBlk')).split()[1], 16) != 0)"],
                         env=dict(os.environ))
    assert code == 0
