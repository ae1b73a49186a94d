"""The bad-input catalogue (docs/bad_inputs.md): every row names a test that exists, and the rows
not covered elsewhere are tested here -- one clear message naming the culprit and the fix, a
non-zero exit (or the error class that gives one), nothing written.

Fast: in-process checks of the layer's functions, or a short subprocess where the exit status is
the point. End-to-end counterparts with the stock pretrain_gpt.py are in
tests/training/ (test_bad_data.py, test_faults.py, test_resume.py).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from megatron_musa_patch.data.errors import DataError
from megatron_musa_patch.base.errors import MegatronMusaPatchError, UnsupportedOnDeviceError

from tests.conftest import REPO, run_python, subprocess_env
from tools.docs_reference import catalogue_rows  # the one reader of the catalogue

MMP = shutil.which("mmp", path=os.path.dirname(sys.executable)) or shutil.which("mmp")


def one_paragraph(stderr: str, prog: str = "megatron_musa_patch") -> str:
    """The one error paragraph of ``stderr``, spoken by ``prog`` (an ``mmp`` command: the command
    as typed, as argparse has it)."""
    assert "Traceback" not in stderr, stderr
    assert sum(l.startswith(f"{prog}: error:") for l in stderr.splitlines()) == 1, stderr
    return " ".join(stderr.split())


# ----------------------------------------------------------------------------- the catalogue


def test_every_row_names_a_real_test():
    rows = catalogue_rows()
    assert rows, "the catalogue has rows"
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1)), "rows numbered 1..n"
    for number, bad_input, caught, message, status, tests in rows:
        assert bad_input and caught and message, number
        assert re.fullmatch(r"[0-9 ,()a-z-]+", status) and re.search(r"[1-9]", status), \
            f"row {number}: exit status {status!r}"
        refs = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", tests)
        assert refs, f"row {number} names no test"
        for path, name in refs:
            source = (REPO / path).read_text(encoding="utf-8")
            assert re.search(rf"^def {name}\(", source, re.M), f"row {number}: {path}::{name}"


# ----------------------------------------------------------------------------- environment


def test_cuda_requested_without_a_cuda_device():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a usable CUDA device")
    proc = run_python("import megatron_musa_patch",
                      env=subprocess_env(MEGATRON_MUSA_PATCH_DEVICE="cuda"))
    assert proc.returncode == 2
    text = one_paragraph(proc.stderr)
    assert "MEGATRON_MUSA_PATCH_DEVICE=cuda but torch reports no usable CUDA device" in text
    assert "MEGATRON_MUSA_PATCH_DEVICE=cpu" in text


def fake_checkout(root: Path, version=None) -> Path:
    (root / "megatron" / "training").mkdir(parents=True)
    (root / "megatron" / "training" / "__init__.py").write_text("")
    (root / "megatron" / "core").mkdir()
    if version is not None:
        major, minor, patch = version.split(".")
        (root / "megatron" / "core" / "package_info.py").write_text(
            f"MAJOR = {major}\nMINOR = {minor}\nPATCH = {patch}\nPRE_RELEASE = ''\n")
    return root


def test_megatron_lm_checkout_of_an_unverified_version(tmp_path):
    old = fake_checkout(tmp_path / "old", "0.15.0")
    proc = run_python("import megatron_musa_patch", env=subprocess_env(MEGATRON_LM_PATH=old))
    assert proc.returncode == 2
    text = one_paragraph(proc.stderr)
    assert f"the Megatron-LM checkout at {old} (MEGATRON_LM_PATH, or the first one on sys.path) " \
        f"is Megatron-LM 0.15.0" in text
    from megatron_musa_patch.upstream import installed, tables
    from megatron_musa_patch.upstream.ranges import row_of

    tag = row_of(tables.MEGATRON, installed.megatron_core_version()).lm_tag
    assert "git -C" in text and f"checkout {tag}" in text
    assert "MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED=1" in text
    unknown = fake_checkout(tmp_path / "unknown")
    proc = run_python("import megatron_musa_patch", env=subprocess_env(MEGATRON_LM_PATH=unknown))
    assert proc.returncode == 2 and "has no readable version" in one_paragraph(proc.stderr)
    # the escape hatch the message names works
    proc = run_python("import megatron_musa_patch", env=subprocess_env(
        MEGATRON_LM_PATH=old, MEGATRON_MUSA_PATCH_ALLOW_UNVERIFIED="1"))
    assert proc.returncode == 0, proc.stderr


def test_plugin_module_that_cannot_be_imported():
    proc = run_python("import megatron_musa_patch", env=subprocess_env(
        MEGATRON_MUSA_PATCH_PLUGINS="no_such_plugin_module"))
    assert proc.returncode == 2
    text = one_paragraph(proc.stderr)
    assert "MEGATRON_MUSA_PATCH_PLUGINS names 'no_such_plugin_module'" in text
    assert "PYTHONPATH" in text


def test_unknown_jit_mode():
    proc = run_python("import megatron_musa_patch",
                      env=subprocess_env(MEGATRON_MUSA_PATCH_JIT="fast"))
    assert proc.returncode == 2
    assert "MEGATRON_MUSA_PATCH_JIT='fast' is not a value this layer knows: use one of auto, " \
        "compile, eager" in one_paragraph(proc.stderr)


# ----------------------------------------------------------------------------- commands, flags


def test_unknown_mmp_command(capsys):
    from megatron_musa_patch.cli.main import main

    assert main(["frobnicate"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("mmp: error: unknown command 'frobnicate'")


def test_mmp_run_with_a_missing_script(tmp_path, capsys):
    from megatron_musa_patch.cli.main import main

    missing = tmp_path / "pretrain_gpt.py"
    assert main(["run", "--nproc-per-node", "2", str(missing), "--train-iters", "1"]) == 2
    text = one_paragraph(capsys.readouterr().err, prog="mmp run")
    assert f"the training script {missing} does not exist" in text and "-m" in text


def test_selftest_with_an_unknown_layout(capsys):
    from megatron_musa_patch.cli.selftest import main

    with pytest.raises(SystemExit) as exited:
        main(["--layouts", "tp3"])
    assert exited.value.code == 2  # a usage error, through argparse
    err = capsys.readouterr().err
    assert "mmp selftest: error: --layouts: unknown layouts ['tp3']" in err and "tp2" in err


def test_unknown_distributed_backend(capsys):
    import argparse

    from megatron_musa_patch.features.device import collectives

    parser = argparse.ArgumentParser(prog="pretrain_gpt.py")
    parser.add_argument("--distributed-backend", default="nccl", choices=["nccl", "gloo"])
    collectives.mmp_add_arguments(parser)
    assert parser.parse_args(["--distributed-backend", "mccl"]).distributed_backend == "mccl"
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--distributed-backend", "hccl"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--distributed-backend: invalid choice: 'hccl'" in err and "'mccl'" in err


def test_batch_invariant_mode_without_triton():
    from megatron_musa_patch.features.startup import cuda_free_startup

    stand_in = types.ModuleType("batch_invariant_kernels")
    cuda_free_startup._batch_invariant_stand_in(stand_in)
    assert stand_in.is_batch_invariant_mode_enabled() is False
    with pytest.raises(UnsupportedOnDeviceError,
                       match="--batch-invariant-mode needs Megatron's triton kernels"):
        stand_in.enable_batch_invariant_mode()
    # upstream's own tests toggle it with the context manager (test_*_batch_invariant.py)
    with pytest.raises(UnsupportedOnDeviceError, match="triton is not installed"):
        with stand_in.set_batch_invariant_mode(True):
            pass
    with stand_in.set_batch_invariant_mode(False):
        assert stand_in.is_batch_invariant_mode_enabled() is False
    assert stand_in.disable_batch_invariant_mode() is None


# ----------------------------------------------------------------------------- training data


def write_pair(prefix: Path, docs, dtype=np.uint16):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        builder.add_document(np.asarray(doc, dtype=np.int64), [len(doc)])
    builder.finalize(f"{prefix}.idx")
    return prefix


def build_low_level(prefix, vocab_size=1001):
    """What megatron-core runs for each --data-path prefix, through the data_checks wrapper."""
    from megatron.core.datasets.gpt_dataset import GPTDataset

    from megatron_musa_patch.features.reliability import data_checks

    original = vars(GPTDataset)["build_low_level_dataset"]
    original = getattr(original, "__wrapped__", original)  # unwrapped if a test activated
    original = original.__func__ if isinstance(original, staticmethod) else original
    config = types.SimpleNamespace(mmap_bin_files=True, mock=False, sequences_per_dataset=None,
                                   fast_cache_load=False, token_dtype_code=None,
                                   tokenizer=types.SimpleNamespace(vocab_size=vocab_size))
    return data_checks._build_low_level_dataset(set(), original, None, (str(prefix), config), {})


DOCS = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]


def test_training_data_path_that_does_not_exist(tmp_path):
    with pytest.raises(DataError) as failed:
        build_low_level(tmp_path / "corpus_text_document")
    text = " ".join(str(failed.value).split())
    assert f"--data-path {tmp_path / 'corpus_text_document'}: no such .bin/.idx pair" in text
    assert "without .bin/.idx" in text
    assert len(build_low_level(write_pair(tmp_path / "good", DOCS))) == 3  # a good one opens


def test_training_data_damaged_bin_or_missing_idx(tmp_path):
    prefix = write_pair(tmp_path / "cut", DOCS)
    with open(f"{prefix}.bin", "r+b") as f:
        f.truncate(8)  # lost its tail
    with pytest.raises(DataError, match=r"damaged \(\.bin is 8 bytes, the index points at 18\)"):
        build_low_level(prefix)
    half = write_pair(tmp_path / "half", DOCS)
    os.remove(f"{half}.idx")  # the preparation never finished
    with pytest.raises(DataError, match=r"\.idx file missing .*Fix: rebuild it"):
        build_low_level(half)


def test_training_data_empty_pair(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = tmp_path / "empty"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    builder.finalize(f"{prefix}.idx")
    with pytest.raises(DataError, match=r"--data-path .*empty: empty"):
        build_low_level(prefix)


def test_training_data_tokenized_with_a_larger_vocabulary(tmp_path):
    prefix = write_pair(tmp_path / "big_vocab", [[1, 2], [3, 4, 5], [6, 31999, 7]])
    with pytest.raises(DataError) as failed:
        build_low_level(prefix, vocab_size=1001)
    text = " ".join(str(failed.value).split())
    assert "token id 31999 (document 2) is outside the training tokenizer's vocabulary" in text
    assert "vocab_size 1001" in text and "--tokenizer-model" in text
    assert len(build_low_level(prefix, vocab_size=32000)) == 3  # the right tokenizer passes


def test_token_check_reads_windows_of_a_large_file(tmp_path, monkeypatch):
    from megatron_musa_patch.features.reliability import data_checks

    monkeypatch.setattr(data_checks, "SCAN_TOKENS", 64)
    ids = np.arange(10_000, dtype=np.uint16) % 900
    ids[-1] = 5000  # the last window ends at the last token
    ids.tofile(tmp_path / "x.bin")
    assert data_checks.first_out_of_range(str(tmp_path / "x.bin"), np.uint16, ids.size, 1000) \
        == (ids.size - 1, 5000)
    assert data_checks.first_out_of_range(str(tmp_path / "x.bin"), np.uint16, ids.size - 1,
                                          1000) is None


# ----------------------------------------------------------------------------- checkpoints


def save_dir(tmp_path, tracker, iterations=(2, 4)):
    for i in iterations:
        (tmp_path / f"iter_{i:07d}").mkdir()
    path = tmp_path / "latest_checkpointed_iteration.txt"
    path.write_text(tracker)
    return path


@pytest.mark.parametrize("content, shown", [("", "is empty"), ("4\x00\x00", "is '4\\x00\\x00'"),
                                            ("latest", "is 'latest'")])
def test_checkpoint_tracker_that_is_not_an_iteration(tmp_path, content, shown):
    from megatron_musa_patch.features.reliability.checkpoint_safety import CheckpointError, check_tracker

    tracker = save_dir(tmp_path, content)
    with pytest.raises(CheckpointError) as failed:
        check_tracker(str(tracker))
    text = " ".join(str(failed.value).split())
    assert f"the checkpoint tracker {tracker} {shown}" in text
    assert "iter_0000004, iter_0000002" in text and f"echo 4 > {tracker}" in text
    assert isinstance(failed.value, MegatronMusaPatchError)


def test_checkpoint_tracker_naming_a_missing_checkpoint(tmp_path):
    from megatron_musa_patch.features.reliability.checkpoint_safety import CheckpointError, check_tracker

    tracker = save_dir(tmp_path, "6")
    with pytest.raises(CheckpointError, match=r"names iteration 6, but .*iter_0000006 does not "
                                              r"exist \(checkpoint directories there: "
                                              r"iter_0000004, iter_0000002\)"):
        check_tracker(str(tracker))
    ok = tmp_path / "ok"
    ok.mkdir()
    check_tracker(str(save_dir(ok, "4")))  # a good one passes, and so does "release"
    check_tracker(str(save_dir(ok, "release", iterations=())))


def test_legacy_checkpoint_format_with_experts_split_unlike_dense_layers():
    from megatron_musa_patch.base.errors import ArgumentError
    from megatron_musa_patch.features.reliability.checkpoint_safety import legacy_format_experts
    from megatron_musa_patch.features.reliability.checkpoint_safety.legacy_format_experts import \
        mmp_validate_args

    from tests.harness.sessions import make_session

    session = make_session(legacy_format_experts)
    args = types.SimpleNamespace(ckpt_format="torch", num_experts=4, save="/ckpt", load=None,
                                 tensor_model_parallel_size=2, expert_tensor_parallel_size=1)
    if session.upstream("legacy_checkpoint_saves_every_shard", "megatron.training"):
        mmp_validate_args(args=args, session=session)  # upstream writes every shard from 0.19
        return
    with pytest.raises(ArgumentError, match=r"--ckpt-format torch with "
                                            r"--expert-tensor-parallel-size 1 and "
                                            r"--tensor-model-parallel-size 2: .* Use "
                                            r"--ckpt-format torch_dist \(the default\), or "
                                            r"--expert-tensor-parallel-size 2"):
        mmp_validate_args(args=args, session=session)
    for fine in (dict(ckpt_format="torch_dist"), dict(expert_tensor_parallel_size=None),
                 dict(expert_tensor_parallel_size=2), dict(num_experts=None),
                 dict(save=None)):
        mmp_validate_args(args=types.SimpleNamespace(**{**vars(args), **fine}), session=session)


def test_tracker_is_replaced_atomically(tmp_path):
    from megatron_musa_patch.features.reliability.checkpoint_safety import AtomicTextFile

    tracker = save_dir(tmp_path, "4")
    crashed = AtomicTextFile(str(tracker))  # a writer that dies before it closes
    crashed.write("6")
    assert tracker.read_text() == "4"
    with pytest.raises(RuntimeError):
        with AtomicTextFile(str(tracker)) as f:
            f.write("6")
            raise RuntimeError("interrupted")
    assert tracker.read_text() == "4"
    with AtomicTextFile(str(tracker)) as f:
        f.write("6")
    assert tracker.read_text() == "6"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "iter_0000002", "iter_0000004", "latest_checkpointed_iteration.txt"]  # no leftovers


def test_finished_job_rerun_does_not_rewrite_the_loaded_checkpoint(tmp_path):
    from megatron_musa_patch.features.reliability.checkpoint_safety import loaded_latest_unchanged

    save_dir(tmp_path, "5", iterations=(4, 5))
    d = str(tmp_path)
    assert loaded_latest_unchanged(5, d, d, 5, 5)
    assert not loaded_latest_unchanged(6, d, d, 5, 5)  # trained since loading
    assert not loaded_latest_unchanged(5, d, d, 5, 0)  # --finetune: started from 0
    assert not loaded_latest_unchanged(5, d, str(tmp_path / "elsewhere"), 5, 5)
    assert not loaded_latest_unchanged(5, d, d, None, 5)  # nothing was loaded


def test_save_with_args_that_lack_load_goes_to_upstream(monkeypatch):
    """Upstream's own tests patch checkpointing.get_args with a SimpleNamespace holding only
    what save_checkpoint reads; the wrapper reads the same args (not the unset global ones:
    "args is not initialized") and asks for nothing more (it raised AttributeError: 'load')."""
    from megatron_musa_patch.features.reliability.checkpoint_safety import common, no_rewrite_of_loaded

    checkpointing = types.ModuleType(common.CHECKPOINTING)
    checkpointing.get_args = lambda: types.SimpleNamespace(save="/ckpt")
    monkeypatch.setitem(sys.modules, common.CHECKPOINTING, checkpointing)
    session = types.SimpleNamespace(is_rank_zero=lambda: True)

    def save_checkpoint(iteration, model, optimizer, opt_param_scheduler, flops, **kwargs):
        return ("saved", iteration)

    assert no_rewrite_of_loaded._skip_rewrite_of_loaded_latest(
        session, save_checkpoint, None, (2, None, None, None, 0), {}) == ("saved", 2)


# ----------------------------------------------------------------------------- a dead rank


def test_dead_rank_report_names_the_rank_and_the_checkpoint(tmp_path):
    from megatron_musa_patch.lib.elastic.failure_report import failure_report

    save_dir(tmp_path, "4")
    failures = {0: types.SimpleNamespace(exitcode=1, local_rank=0, pid=100, timestamp=7),
                1: types.SimpleNamespace(exitcode=-signal.SIGKILL, local_rank=1, pid=101,
                                         timestamp=7)}
    text = failure_report(failures, ["--save", str(tmp_path), "--load", str(tmp_path)])
    assert text.startswith("mmp run: rank 1 (local rank 1, pid 101) was killed by SIGKILL")
    assert "rank 0 (exit 1)" in text
    assert f"The latest complete checkpoint in {tmp_path} is iteration 4" in text
    assert "rerun the same command to resume" in text
    stopped = {0: types.SimpleNamespace(exitcode=-signal.SIGTERM, local_rank=0, pid=5,
                                        timestamp=1),
               1: types.SimpleNamespace(exitcode=3, local_rank=1, pid=6, timestamp=2)}
    text = failure_report(stopped, [])
    assert text.startswith("mmp run: rank 1 (local rank 1, pid 6) failed first (exit 3)")
    assert "rank 0 (killed by SIGTERM)" in text


@pytest.mark.skipif(MMP is None, reason="the mmp console script is not installed")
def test_dead_rank_under_mmp_run_ends_the_job_and_is_named(tmp_path):
    script = tmp_path / "worker.py"
    shutil.copy(REPO / "tests" / "project" / "probes" / "killed_worker.py", script)
    start = time.monotonic()
    # capture_output waits for every holder of the pipes: the leftover child too
    proc = subprocess.run([MMP, "run", "--nproc-per-node", "2", str(script)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1
    assert time.monotonic() - start < 120
    child = int(re.search(r"leftover child pid=(\d+)", proc.stderr).group(1))
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    text = " ".join(proc.stderr.split())
    assert re.search(r"mmp run: rank 1 \(local rank 1, pid \d+\) was killed by SIGKILL", text), \
        proc.stderr[-3000:]
    assert "The job ended without finishing." in text
