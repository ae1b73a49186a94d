"""examples/quickstart.sh in CI mode without a Megatron-LM checkout (what CI has): every data
step, then training through the megatron-core path on 2 CPU ranks, stopping half-way with a
checkpoint, and a resume whose losses must equal an uninterrupted run's (here, in both of
train_core.py's checkpoint formats). The environment is this interpreter's (--python), so nothing
is installed (the environment step: test_quickstart_environment.py). The stock pretrain_gpt.py
path runs in tests/examples/test_examples.py."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, subprocess_env

pytestmark = pytest.mark.ranks

SCRIPT = REPO / "examples" / "quickstart.sh"


def installed_tag():
    """The Megatron-LM tag of the installed megatron-core's row (0.19.2 -> core_v0.19.0)."""
    from importlib.metadata import version

    from megatron_musa_patch.upstream import tables
    from megatron_musa_patch.upstream.ranges import row_of

    core = version("megatron-core")
    tag = row_of(tables.MEGATRON, core).lm_tag
    assert tag.startswith("core_v" + ".".join(core.split(".")[:2])), (core, tag)
    return tag


def quickstart(*args, cache, timeout=600, **env):
    run_env = subprocess_env(MMP_CACHE_DIR=str(cache))
    run_env.pop("MEGATRON_LM_PATH", None)
    run_env.update(env)
    return subprocess.run(["bash", str(SCRIPT), *args], env=run_env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("quickstart")
    proc = quickstart("--ci", "--python", sys.executable, "--workdir", str(work / "run"),
                      "--iters", "8", cache=work / "empty-cache")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc, work / "run"


def test_data_steps(ci_run):
    proc, run = ci_run
    assert (run / "corpus" / "pydoc_topics.jsonl").stat().st_size > 100_000
    # --max-mb 2 of source text; JSON's escapes make the file larger
    assert 1_000_000 < (run / "corpus" / "stdlib_source.jsonl").stat().st_size < 3_000_000
    assert (run / "tokenizer" / "tokenizer.json").is_file()
    for name in ("pydoc_topics", "stdlib_source"):
        assert (run / "data" / f"{name}.jsonl_document.bin").stat().st_size > 0
        assert (run / "data" / f"{name}.jsonl_document.idx").is_file()
    data_path = next(line for line in proc.stdout.splitlines() if line.startswith("DATA_PATH="))
    parts = data_path.split("=", 1)[1].split()
    assert len(parts) == 4 and all(int(w) > 0 for w in parts[::2])  # two weighted prefixes


def test_stock_steps_are_reported_skipped(ci_run):
    proc, _ = ci_run
    assert "SKIPPED: the stock pretrain_gpt.py steps (MEGATRON_LM_PATH is unset" in proc.stdout
    assert "cloning is off (--ci)" in proc.stdout
    assert "megatron-core path" in proc.stdout


def test_the_path_and_the_stock_command_are_said_before_anything_starts(tmp_path):
    # the first line, before the environment step; the switch is named as it was typed
    proc = quickstart("--offline", "--python", "/nonexistent/python", "--workdir",
                      str(tmp_path / "run"), cache=tmp_path / "empty-cache")
    first = " ".join(proc.stdout.split("== [1] environment")[0].split())
    assert first.startswith("quickstart: no Megatron-LM checkout (MEGATRON_LM_PATH is unset, none "
                            "in "), proc.stdout[-2000:]
    assert "and --offline: this run trains through megatron-core alone " \
           "(examples/quickstart/train_core.py), not the stock pretrain_gpt.py." in first
    assert first.endswith("For the stock path, with a checkout of your megatron-core's tag "
                          "(core_v0.16.1 ... core_v0.19.0): MEGATRON_LM_PATH=/path/to/Megatron-LM "
                          "bash examples/quickstart.sh --offline")
    # with a checkout it says so instead
    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "pretrain_gpt.py").write_text("")
    proc = quickstart("--offline", "--python", "/nonexistent/python", "--workdir",
                      str(tmp_path / "run"), cache=tmp_path / "empty-cache",
                      MEGATRON_LM_PATH=str(lm))
    assert proc.stdout.startswith(f"quickstart: training with the stock pretrain_gpt.py of "
                                  f"MEGATRON_LM_PATH={lm}")


def train_core(run, data_path, *args):
    """examples/quickstart/train_core.py under mmp run on 2 CPU ranks, on the quickstart's data."""
    proc = subprocess.run(
        [sys.executable, "-c", "import _megatron_musa_patch_boot as b; b.cli()", "run",
         "--standalone", "--nproc-per-node", "2", str(REPO / "examples/quickstart/train_core.py"),
         "--data-path", data_path, "--tokenizer-model", "tokenizer", "--tp", "2",
         "--iters", "8", "--cache", "data-cache", *args],
        cwd=run, env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cpu"), capture_output=True,
        text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def uninterrupted(ci_run):
    """8 iterations in one job, saving at 4 in dist_checkpointing's format (and going on), then
    a second job resumed from that checkpoint."""
    proc, run = ci_run
    data_path = next(line.split("=", 1)[1] for line in proc.stdout.splitlines()
                     if line.startswith("DATA_PATH="))
    train_core(run, data_path, "--ckpt-format", "torch_dist", "--save", "dist-ckpt", "--save-at", "4",
               "--losses", "losses-whole.json")
    resumed = train_core(run, data_path, "--ckpt-format", "torch_dist", "--load", "dist-ckpt",
                         "--losses", "losses-dist-resumed.json")
    assert "loaded checkpoint dist-ckpt at iteration 4" in resumed.stdout
    return (json.loads((run / "losses-whole.json").read_text()),
            json.loads((run / "losses-dist-resumed.json").read_text()))


def test_core_training_stops_half_way_and_resumes_exactly(ci_run, uninterrupted):
    proc, run = ci_run
    first = json.loads((run / "losses-1.json").read_text())
    resumed = json.loads((run / "losses-2.json").read_text())
    whole, dist_resumed = uninterrupted
    assert sorted(map(int, first)) == [1, 2, 3, 4]  # --exit-interval 8 / 2
    assert sorted(map(int, resumed)) == [5, 6, 7, 8]
    assert sorted(map(int, whole)) == list(range(1, 9))
    assert {**first, **resumed} == whole  # the torch format, bit for bit
    assert dist_resumed == {k: whole[k] for k in resumed}  # and torch_dist's
    assert "saved checkpoint checkpoints at iteration 4 (torch, " in (run / "train-1.log").read_text()
    summary = json.loads((run / "summary.json").read_text())
    losses = {int(k): v for k, v in summary["losses"].items()}
    assert losses[8] < losses[1] - 0.5, losses
    assert summary["tokens_per_s_per_device"] > 0 and 0 < summary["mfu_percent"] < 100
    assert "loss curve:" in proc.stdout and "tokens/s per device" in proc.stdout
    assert "quickstart finished" in proc.stdout


def test_each_step_prints_its_time_and_the_total(ci_run):
    import re

    proc, _ = ci_run
    took = {int(n): float(t) for n, t in re.findall(r"^-- \[(\d+)\] took ([0-9.]+) s$",
                                                   proc.stdout, re.M)}
    assert sorted(took) == list(range(1, 10)), proc.stdout[-3000:]
    table = proc.stdout.split("time per step:\n", 1)[1]
    rows = re.findall(r"^ +([0-9.]+) s  \[(\d+)\] (.+)$", table, re.M)
    assert [int(n) for _, n, _ in rows] == list(range(1, 10))
    assert {int(n): float(t) for t, n, _ in rows} == took  # the table repeats the step lines
    assert rows[4][2] == "tokenize and binarize: mmp data prepare"
    total = float(re.search(r"quickstart finished in ([0-9.]+) s", proc.stdout).group(1))
    assert sum(took.values()) - 0.5 <= total  # the steps cover the run
    assert took[7] > 1.0 and took[1] < total  # training takes time; the table is not all zeros


def test_without_checkout_outside_ci_it_says_what_to_do(tmp_path):
    proc = quickstart("--python", sys.executable, "--workdir", str(tmp_path / "run"),
                      "--no-clone", cache=tmp_path / "cache", timeout=120)
    message = " ".join(proc.stderr.split())
    tag = installed_tag()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"the training steps need Megatron-LM ({tag}) and none was found" in message
    assert (f"git clone --branch {tag} --depth 1 https://github.com/NVIDIA/Megatron-LM "
            f"{tmp_path / 'cache'}/Megatron-LM-{tag}") in message
    assert "MEGATRON_LM_PATH" in message and "--ci" in message
    assert not (tmp_path / "run").exists()  # it stopped before doing any work


def test_a_failed_clone_says_what_to_do(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "git").write_text("#!/bin/sh\necho 'fatal: unable to access GitHub' >&2\nexit 128\n")
    (fake / "git").chmod(0o755)
    proc = quickstart("--python", sys.executable, "--workdir", str(tmp_path / "run"),
                      cache=tmp_path / "cache", timeout=120,
                      PATH=f"{fake}:{subprocess_env()['PATH']}")
    message = " ".join(proc.stderr.split())
    tag = installed_tag()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cloning tag {tag} there" in proc.stdout
    assert "fatal: unable to access GitHub" in proc.stderr
    assert "git clone of https://github.com/NVIDIA/Megatron-LM failed" in message
    assert not (tmp_path / "cache" / f"Megatron-LM-{tag}.partial").exists()


def test_bad_inputs_fail_clearly(tmp_path):
    proc = quickstart("--python", str(tmp_path / "nope"), cache=tmp_path, timeout=60)
    assert proc.returncode == 1 and f"--python {tmp_path / 'nope'}: no such interpreter" in \
        proc.stderr
    proc = quickstart("--ci", "--python", sys.executable, cache=tmp_path, timeout=60,
                      MEGATRON_LM_PATH=str(tmp_path))
    assert proc.returncode == 1
    assert f"MEGATRON_LM_PATH={tmp_path} has no pretrain_gpt.py" in " ".join(proc.stderr.split())
    proc = quickstart("--iters", "two", cache=tmp_path, timeout=60)
    assert proc.returncode == 2 and "--iters must be a number" in proc.stderr
