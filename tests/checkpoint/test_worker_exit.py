"""How a conversion step's process ends (``checkpoint/worker.py``, ``_leave``): with its exit
status, without the interpreter's shutdown, its output flushed, and no helper process it started
left running: Megatron's writer spawns a results manager in a step that saves another format
than it loads, and a manager left behind holds the step's output open, so ``mmp checkpoint``
(and a test capturing the step's output) would wait for it without end."""

import os

import pytest

from tests.conftest import run_probe, subprocess_env


def test_a_step_ends_with_its_status_its_output_and_no_helper_left():
    # a manager left running would keep the output's pipes open: run_probe would time out
    proc = run_probe("tests.checkpoint.probes.step_exit",
                     env=subprocess_env(MEGATRON_MUSA_PATCH_AUTOACTIVATE="0"), timeout=60)
    assert proc.returncode == 3, proc.stderr
    pid, last = proc.stdout.split("\n", 1)
    assert last == "the last words, unflushed"
    assert proc.stderr.endswith("and to stderr")
    with pytest.raises(ProcessLookupError):  # ended with the step (and reaped by it)
        os.kill(int(pid), 0)
