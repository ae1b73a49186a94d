"""``logs.startup_progress``: under ``mmp run``, a rank that prints nothing while it starts is never
silent for long: the launcher, then rank 0, say what is being done."""

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import _megatron_musa_patch_boot as boot

from megatron_musa_patch.features.logs import startup_progress

from megatron_musa_patch.lib.elastic import reports

from tests.conftest import REPO, subprocess_env

MMP = shutil.which("mmp", path=str(Path(sys.executable).parent))
PROBE = Path(__file__).parents[1] / "probes" / "slow_phase.py"


@pytest.mark.parametrize("argv, helper", [
    (["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"], True),
    (["python", "-c", "from multiprocessing.forkserver import main; main()"], True),
    (["python", "-m", "megatron_musa_patch.cli.run_worker", "--script", "x.py"], False),
    (["python", "-c", "print(1)"], False),
])
def test_a_helper_of_rank_0_is_not_rank_0(monkeypatch, argv, helper):
    """dist_checkpointing's Manager, a persistent checkpoint worker, a spawned data worker
    inherit RANK=0: they say nothing (they would until their MOST_S)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert boot.multiprocessing_helper(argv) is helper
    monkeypatch.setattr(sys, "orig_argv", argv, raising=False)
    assert (startup_progress.launched_rank_zero() is True) is (not helper)


def test_an_earlier_job_s_reports_are_forgotten(tmp_path):
    reports.write_error(str(tmp_path), 0, AssertionError("an earlier job's"))
    reports.mark_rank_started(str(tmp_path))
    reports.launcher_said(str(tmp_path), 1.0)
    (tmp_path / "unrelated").write_text("kept")
    reports.forget_attempt(str(tmp_path))
    assert reports.read_errors(str(tmp_path)) == {}
    assert not reports.rank_started(str(tmp_path))
    assert reports.launcher_last_line(str(tmp_path)) is None
    assert (tmp_path / "unrelated").read_text() == "kept"


def test_the_first_training_step_ends_the_lines():
    stopped = []
    beat = type("Beat", (), {"stop": lambda self: stopped.append(True)})()
    assert startup_progress._train_step(beat, lambda: 7, None, (), {}) == 7
    assert stopped == [True]


@pytest.mark.ranks
@pytest.mark.ci
@pytest.mark.skipif(MMP is None, reason="the mmp console script is not installed")
def test_a_silent_phase_is_said_while_it_lasts(tmp_path):
    script = tmp_path / "slow_phase.py"
    shutil.copy(PROBE, script)
    proc = subprocess.Popen([MMP, "run", "--standalone", "--nproc-per-node", "2", str(script),
                             "20"], env=subprocess_env(PYTHONUNBUFFERED="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    start, stamped = time.monotonic(), []
    for line in proc.stdout:
        stamped.append((time.monotonic(), line.rstrip("\n")))
    assert proc.wait(timeout=120) == 0, "\n".join(line for _, line in stamped)
    said = [line for _, line in stamped]
    phase = [line for line in said if line.startswith(
        "megatron_musa_patch: rank 0 is building the datasets and their sample indices (")]
    assert len(phase) >= 2, said  # 20 s in that phase: every 5 s without output
    assert said.count("done") == 2
    # never silent for long: without the lines the phase alone is 20 s of nothing (the bound
    # leaves room for a loaded machine, where an import can hold the interpreter for seconds)
    times = [start] + [t for t, _ in stamped]
    assert max(b - a for a, b in zip(times, times[1:])) < 12, stamped


@pytest.mark.ranks
@pytest.mark.skipif(MMP is None, reason="the mmp console script is not installed")
def test_the_launcher_speaks_while_the_ranks_start(tmp_path):
    """The ranks take 12 s to activate (a slow plugin): the launcher says they are starting,
    until rank 0 is up, and is never silent for long."""
    script = tmp_path / "quiet_script.py"
    shutil.copy(Path(__file__).parents[1] / "probes" / "quiet_script.py", script)
    env = subprocess_env(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), MMP_SLOW_PLUGIN_S="12",
                         MEGATRON_MUSA_PATCH_PLUGINS="tests.features.probes.slow_plugin")
    proc = subprocess.Popen([MMP, "run", "--standalone", "--nproc-per-node", "2", str(script)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path)
    start, stamped = time.monotonic(), []
    for line in proc.stdout:
        stamped.append((time.monotonic(), line.rstrip("\n")))
    assert proc.wait(timeout=120) == 0, "\n".join(line for _, line in stamped)
    said = [line for _, line in stamped]
    assert any(line.startswith("mmp run: the ranks are starting (each imports torch and "
                               "Megatron; ") for line in said), said
    assert said.count("done") == 2
    times = [start] + [t for t, _ in stamped]
    assert max(b - a for a, b in zip(times, times[1:])) < 12, stamped
