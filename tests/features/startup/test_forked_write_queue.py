"""startup.forked_write_queue: the torch_dist writer's results queue is served by a manager
forked before the process groups exist (not spawned at the first save), ends with its rank, and
the checkpoints are those upstream writes (the stock pretrain_gpt.py with the feature off)."""

import os
import re
import signal
import subprocess
import sys
import time
import types

import pytest

from megatron_musa_patch.base.errors import PatchError
from megatron_musa_patch.features.startup import forked_write_queue as feature
from tests.conftest import probe_env
from tests.harness.stock import FIXTURES, run_stock

PROBE = {"MEGATRON_MUSA_PATCH_PLUGINS": "write_queue_probe",
         "PYTHONPATH": str(FIXTURES / "plugins")}
SAVED = re.compile(r"write_queue_probe rank=(\d) iteration=(\d+) managers=(\S*) queue=(\d)")


@pytest.mark.parametrize("args, saves", [
    (types.SimpleNamespace(save="/ckpt", ckpt_format="torch_dist"), True),
    (types.SimpleNamespace(save="/ckpt", ckpt_format="fsdp_dtensor"), True),
    (types.SimpleNamespace(save="/ckpt", ckpt_format="torch"), False),  # torch.save per rank
    (types.SimpleNamespace(save=None, ckpt_format="torch_dist"), False),
    (types.SimpleNamespace(save=None, non_persistent_global_ckpt_dir="/np",
                           ckpt_format="torch_dist"), True),
])
def test_only_a_run_that_saves_through_the_distributed_writer_gets_the_queue(args, saves):
    assert feature.saves_distributed(args) is saves


def test_a_release_without_the_writers_queue_is_refused_by_name(monkeypatch):
    monkeypatch.setitem(sys.modules, feature.WRITER, types.ModuleType(feature.WRITER))
    with pytest.raises(PatchError) as caught:
        feature.install_forked_queue()
    text = " ".join(str(caught.value).split())
    assert f"{feature.WRITER} has no _results_queue" in text
    assert "MEGATRON_MUSA_PATCH_DISABLE=startup.forked_write_queue" in text


HOLDER = "tests.features.probes.forked_queue_holder"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def _manager_after_its_owner_is_killed(kind: str) -> bool:
    """Whether the manager of a process that is SIGKILLed is still alive 5 s later."""
    proc = subprocess.Popen([sys.executable, "-m", HOLDER, kind], stdout=subprocess.PIPE,
                            text=True, env=probe_env())
    try:
        manager = int(proc.stdout.readline())
        assert _alive(manager)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while _alive(manager) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(manager)
    if alive:
        os.kill(manager, signal.SIGKILL)
    return alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_manager_ends_with_a_killed_owner_where_a_plain_one_outlives_it():
    assert not _manager_after_its_owner_is_killed("feature")
    assert _manager_after_its_owner_is_killed("plain")


def _saves(log):
    """{rank: (managers started, queue set)} after the last save, with every save's line."""
    found = SAVED.findall(log)
    assert sorted({(int(r), int(i)) for r, i, _, _ in found}) == [(0, 2), (0, 4), (1, 2), (1, 4)], \
        log[-3000:]
    return {int(r): (managers, int(queue)) for r, i, managers, queue in found if i == "4"}


#: (what MEGATRON_MUSA_PATCH_DISABLE holds, the managers each rank started: method and whether
#: torch.distributed was up). CI's subset runs the feature; the comparison with upstream's
#: spawned manager, in the whole stock suite, adds a start-up of the main module per rank
VARIANTS = [pytest.param("", "fork:0", id="feature", marks=pytest.mark.ci),
            pytest.param("startup.forked_write_queue", "spawn:1", id="upstream")]


@pytest.fixture(scope="module")
def saved(lm_path, tmp_path_factory):
    """{disable: (losses, log, checkpoint directory)}, each variant run once when first asked."""
    runs = {}

    def run(disable):
        if disable not in runs:
            ckpt = tmp_path_factory.mktemp("forked_write_queue") / "ckpt"
            env = dict(PROBE, MEGATRON_MUSA_PATCH_DISABLE=disable) if disable else PROBE
            losses, _, log = run_stock(lm_path, ["--save", str(ckpt), "--save-interval", "2"],
                                       env=env)
            runs[disable] = losses, log, ckpt
        return runs[disable]

    return run


@pytest.mark.stock
@pytest.mark.parametrize("disable, managers", VARIANTS)
def test_each_rank_starts_one_manager_forked_before_its_process_groups(saved, disable, managers):
    """Two saves on 2 ranks: with the feature, one manager a rank, forked before
    torch.distributed was initialised; with it off, upstream's, spawned at the first save (the
    process groups up). Either way the checkpoint is complete."""
    losses, log, ckpt = saved(disable)
    assert _saves(log) == {0: (managers, 1), 1: (managers, 1)}
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "4"
    assert (ckpt / "iter_0000004" / ".metadata").is_file()
    assert len(losses) == 4


@pytest.mark.stock
def test_the_run_and_its_checkpoint_are_upstreams(saved, lm_path):
    """The losses with the feature are upstream's, and the checkpoint loads in a new run."""
    (feature, _, ckpt), (upstream, _, _) = saved(""), saved("startup.forked_write_queue")
    assert feature == upstream
    resumed, _, _ = run_stock(lm_path, ["--load", str(ckpt), "--finetune", "--no-load-optim",
                                        "--no-load-rng"], iters=1)
    assert set(resumed) == {1}
