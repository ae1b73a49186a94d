"""``mmp run`` checks a Megatron script's arguments before any rank starts: a refusal is one
paragraph, printed once, exit 2, with Megatron's words (the layer adds the nearest flag)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_musa_patch.cli import args_check, args_check_worker, megatron_entry

from tests.conftest import subprocess_env
from tests.harness.stock import TINY

MMP = shutil.which("mmp", path=str(Path(sys.executable).parent))


def test_a_megatron_entry_script_is_told_by_its_main_block(lm_path):
    call = megatron_entry.entry_call((lm_path / "pretrain_gpt.py").read_text())
    assert call is not None and megatron_entry.called_name(call) in megatron_entry.ENTRY_CALLS
    assert {kw.arg for kw in call.keywords} >= {"extra_args_provider", "args_defaults"}


@pytest.mark.parametrize("source, found", [
    ("from megatron.training import pretrain\nif __name__ == '__main__':\n    pretrain(1, 2)\n",
     True),
    # outside the main block: importing the module would run it, so it is not checked
    ("from megatron.training import pretrain\npretrain(1, 2)\n", False),
    ("import torch\nif __name__ == '__main__':\n    print(torch.ones(1))\n", False),
    ("def broken(:\n", False),
])
def test_only_scripts_that_call_megatron_s_entry_in_their_main_block(source, found):
    assert (megatron_entry.entry_call(source) is not None) is found


@pytest.mark.parametrize("nnodes, nproc, ranks", [("1", "2", 2), ("1:1", "8", 8), ("2", "4", 8),
                                                  ("1:4", "2", None), ("x", "2", None)])
def test_the_world_size_is_known_only_for_a_fixed_number_of_nodes(nnodes, nproc, ranks):
    assert args_check.world_size(nnodes, nproc) == ranks


#: a script whose extra flag is added by a statement that binds nothing
REGISTRY_SCRIPT = Path(__file__).parent / "probes" / "entry_with_a_registry.py"


def test_the_first_pass_runs_what_binds_the_entry_call_s_arguments():
    namespace = args_check_worker._needed_part(
        str(REGISTRY_SCRIPT), megatron_entry.entry_call(REGISTRY_SCRIPT.read_text()))
    assert "add_flags" in namespace and namespace["FLAGS"] == []  # the append is left out
    assert "pretrain" not in namespace  # the callee is not needed: both are keywords


def _mmp_run(lm_path, args, **env):
    return subprocess.run(
        [MMP, "run", "--standalone", "--nproc-per-node", "2", str(lm_path / "pretrain_gpt.py"),
         *TINY, "--mock-data", "--train-iters", "1", *args],
        env=subprocess_env(MEGATRON_LM_PATH=str(lm_path), **env), capture_output=True,
        text=True, timeout=300)


def _refused_once(proc, text):
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stderr.count(text) == 1, proc.stderr[-3000:]
    # no rank started: no rank's lines, no usage text, no traceback, no fatal error
    for absent in ("[rank", "usage:", "Traceback", "Fatal Python error", "patches:"):
        assert absent not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


@pytest.mark.stock
@pytest.mark.ci
@pytest.mark.skipif(MMP is None, reason="the mmp console script is not installed")
def test_bad_arguments_are_refused_once_before_any_rank_starts(lm_path):
    proc = _mmp_run(lm_path, ["--tensor-model-paralel-size", "2"])
    _refused_once(proc, "mmp run: error: unrecognized arguments: --tensor-model-paralel-size 2")
    assert "did you mean --tensor-model-parallel-size?" in " ".join(proc.stderr.split())
    # a layout the ranks cannot hold: Megatron's own assertion, said by the launcher
    proc = _mmp_run(lm_path, ["--tensor-model-parallel-size", "3"])
    _refused_once(proc, "mmp run: error: Megatron's validate_args refuses these arguments for 2 "
                        "ranks")
    assert "world size (2) is not divisible by" in " ".join(proc.stderr.split())
    # a flag whose feature is off: the layer's paragraph, as a rank would say it
    proc = _mmp_run(lm_path, ["--attn-recompute"], MEGATRON_MUSA_PATCH_DISABLE="recompute")
    _refused_once(proc, "megatron_musa_patch: error: --attn-recompute needs the feature "
                        "'recompute'")
    # a bad layer setting: its paragraph once, with the near miss, and no fatal error
    proc = _mmp_run(lm_path, [], MEGATRON_MUSA_PATCH_DISABLE="fused_ops.rop")
    _refused_once(proc, "megatron_musa_patch: error: MEGATRON_MUSA_PATCH_DISABLE names an "
                        "unknown feature 'fused_ops.rop'")
    assert "(did you mean 'fused_ops.rope'?)" in proc.stderr


@pytest.mark.stock
@pytest.mark.skipif(MMP is None, reason="the mmp console script is not installed")
def test_the_check_can_be_switched_off_and_the_ranks_then_refuse(lm_path):
    proc = _mmp_run(lm_path, ["--tensor-model-paralel-size", "2"],
                    MEGATRON_MUSA_PATCH_ARGS_CHECK="0")
    assert proc.returncode == 1
    assert "unrecognized arguments: --tensor-model-paralel-size" in proc.stderr
    assert "checking pretrain_gpt.py's arguments" not in proc.stdout


@pytest.mark.stock
@pytest.mark.skipif(MMP is None, reason="the mmp console script is not installed")
def test_a_refusal_is_confirmed_with_the_whole_script(lm_path, tmp_path):
    """The script adds --my-flag only through a statement that binds nothing: the first pass
    refuses it, the whole module accepts it, and the ranks start."""
    script = tmp_path / "entry.py"
    shutil.copy(REGISTRY_SCRIPT, script)
    proc = subprocess.run(
        [MMP, "run", "--standalone", "--nproc-per-node", "2", str(script), *TINY, "--mock-data",
         "--my-flag", "3"], env=subprocess_env(MEGATRON_LM_PATH=str(lm_path)),
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stdout.count("ranks started") == 2
    assert "error" not in proc.stderr


@pytest.mark.stock
@pytest.mark.skipif(MMP is None, reason="the mmp console script is not installed")
def test_help_is_megatron_s_help_printed_once(lm_path):
    proc = _mmp_run(lm_path, ["--help"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("usage: ") == 1 and "--tensor-model-parallel-size" in proc.stdout
    assert "[rank" not in proc.stdout + proc.stderr
