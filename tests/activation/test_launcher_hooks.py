"""The env hook in the agents of dlrover-run and ft_launcher (_megatron_musa_patch_boot.py,
the launcher's records): the agent process does not activate the layer,
gets mmp run's side once its launcher module is imported, and dlrover 0.6.1's standalone master
starts on a torch whose SubprocessHandler requires numa_options. Stand-in launcher modules here;
the real dlrover-run and ft_launcher with pretrain_gpt.py: tests/training/test_restarts.py."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import _megatron_musa_patch_boot as boot

from tests.conftest import FIXTURES

#: the agent's program, run under the name dlrover-run
AGENT = Path(__file__).resolve().parent / "probes" / "dlrover_agent.py"


@pytest.mark.parametrize("argv, launcher", [
    (["/v/bin/python", "/v/bin/torchrun", "--nproc-per-node", "2"], boot.TORCHRUN),
    (["python", "-m", "torch.distributed.run", "x.py"], boot.TORCHRUN),
    (["/v/bin/python3", "/v/bin/dlrover-run", "--standalone"], boot.DLROVER_RUN),
    (["python", "-m", "dlrover.trainer.torch.main", "x.py"], boot.DLROVER_RUN),
    (["python", "-u", "-m", "dlrover.python.master.main"], boot.DLROVER_MASTER),
    (["/v/bin/python", "/v/bin/ft_launcher", "x.py"], boot.FT_LAUNCHER),
])
def test_launchers_are_told_apart_by_how_they_started(monkeypatch, argv, launcher):
    monkeypatch.setattr(sys, "orig_argv", argv)
    names = (boot.TORCHRUN, boot.DLROVER_RUN, boot.DLROVER_MASTER, boot.FT_LAUNCHER)
    assert [n for n in names if boot._started_as(n)] == [launcher]


def test_a_training_script_is_no_launcher(monkeypatch):
    monkeypatch.setattr(sys, "orig_argv", ["python", "-u", "pretrain_gpt.py", "--run", "x"])
    assert not any(boot._started_as(n) for n in (boot.TORCHRUN, boot.DLROVER_RUN,
                                                   boot.DLROVER_MASTER, boot.FT_LAUNCHER))


def test_dlrover_runs_agent_is_supervised_and_not_activated(tmp_path):
    # a stand-in for dlrover's elastic_run: its `run` and the SubprocessHandler it calls with
    # 6 arguments
    shutil.copytree(FIXTURES / "fake_dlrover", tmp_path, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "dlrover-run"  # how the agent is started: the script's name
    shutil.copy(AGENT, script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.update(MEGATRON_MUSA_PATCH="1", PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    # not activated; numa_options filled in; the run under mmp run's side, named for dlrover-run
    assert lines[0] == ("active False result ('started', None) seen [('elastic', 'torch'), "
                        "('launcher', 'mmp (dlrover-run)'), ('max_restarts', 3), ('restarter', "
                        "'dlrover-run'), ('script_args', ['--save', 'd']), ('state', "
                        "'Supervision')]"), proc.stdout
    assert lines[1] == "autoactivate None"  # restored: the workers it starts activate


def test_the_ft_package_fix_stays_out_of_a_job_without_it(monkeypatch):
    """No nvidia-resiliency-ext, or a job without --enable-ft-package: nothing is imported or
    changed (the job's own setup runs as upstream's)."""
    from megatron_musa_patch.features.upstream_fixes import ft_warmup_iters

    monkeypatch.setattr(ft_warmup_iters, "NVRX", "no_such_package_mmp")
    calls = []
    assert ft_warmup_iters._setup(lambda *a, **k: calls.append((a, k)) or "done", None,
                                  (1,), {"x": 2}) == "done"
    assert calls == [((1,), {"x": 2})]


@pytest.mark.parametrize("argv, entry", [
    (["python", "-u", "-X", "dev", "-m", "pkg.mod", "-m", "x"], "pkg.mod"),
    (["python", "-um", "pkg.mod"], "pkg.mod"),
    (["python", "-W", "ignore", "/a/b/run.py", "-m", "x"], "run.py"),
    (["python", "-c", "import x", "-m", "y"], ""),
])
def test_the_entry_is_read_past_the_interpreters_own_options(monkeypatch, argv, entry):
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert boot._entry() == entry


def test_a_refusal_in_the_agent_is_its_paragraph(tmp_path):
    """The launcher's records are read when dlrover-run's module is imported: a misspelt toggle
    there is the settings' paragraph and exit 2, not a traceback from inside the import."""
    shutil.copytree(FIXTURES / "fake_dlrover", tmp_path, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "dlrover-run"
    shutil.copy(AGENT, script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.update(MEGATRON_MUSA_PATCH="1", PYTHONPATH=str(tmp_path),
               MEGATRON_MUSA_PATCH_DISABLE="reliability.elastic_agnet")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert ("MEGATRON_MUSA_PATCH_DISABLE names an unknown feature 'reliability.elastic_agnet' "
            "(did you mean 'reliability.elastic_agent'?)") in " ".join(proc.stderr.split())
