"""The env hook in the agents of dlrover-run and ft_launcher (_megatron_musa_patch_boot.py,
launch.supervise): the agent process does not activate the layer,
gets mmp run's side once its launcher module is imported, and dlrover 0.6.1's standalone master
starts on a torch whose SubprocessHandler requires numa_options. Stand-in launcher modules here;
the real dlrover-run and ft_launcher with pretrain_gpt.py: tests/training/test_restarts.py."""

import os
import subprocess
import sys
import textwrap

import pytest

import _megatron_musa_patch_boot as boot

# a stand-in for dlrover's module: its `run` and the SubprocessHandler it calls with 6 arguments
FAKE_DLROVER = textwrap.dedent("""
    def SubprocessHandler(entrypoint, args, env, stdout, stderr, local_rank_id, numa_options):
        return ("started", numa_options)

    def run(args):
        return SubprocessHandler("python", (), {}, "", "", 0)
""")

CHECK = textwrap.dedent("""
    import os, sys, types
    import megatron_musa_patch
    from dlrover.trainer.torch import elastic_run
    from megatron_musa_patch.cli import launch
    seen = {}
    def supervised(script_args, max_restarts, elastic, **said):
        seen.update(said, script_args=script_args, max_restarts=max_restarts,
                    agent=elastic.local_agent.__module__)
        import contextlib
        return contextlib.nullcontext()
    launch.supervised = supervised
    result = elastic_run.run(types.SimpleNamespace(training_script_args=["--save", "d"],
                                                   max_restarts=3))
    print("active", megatron_musa_patch.is_active(), "result", result, "seen", sorted(seen.items()))
    print("autoactivate", os.environ.get("MEGATRON_MUSA_PATCH_AUTOACTIVATE"))
""")


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
    package = tmp_path / "dlrover" / "trainer" / "torch"
    package.mkdir(parents=True)
    for folder in (tmp_path / "dlrover", tmp_path / "dlrover" / "trainer", package):
        (folder / "__init__.py").write_text("")
    (package / "elastic_run.py").write_text(FAKE_DLROVER)
    script = tmp_path / "dlrover-run"  # how the agent is started: the script's name
    script.write_text(CHECK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.update(MEGATRON_MUSA_PATCH="1", PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    # not activated; numa_options filled in; the run under mmp run's side, named for dlrover-run
    assert lines[0] == ("active False result ('started', None) seen [('agent', "
                        "'torch.distributed.elastic.agent.server.local_elastic_agent'), "
                        "('launcher', 'mmp (dlrover-run)'), ('max_restarts', 3), ('restarter', "
                        "'dlrover-run'), ('script_args', ['--save', 'd'])]"), proc.stdout
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
