"""``startup_progress``: under ``mmp run``, a rank that prints nothing while it starts is never
silent for long: the launcher, then rank 0, say what is being done."""

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_musa_patch.features import startup_progress

from tests.conftest import subprocess_env

MMP = shutil.which("mmp", path=str(Path(sys.executable).parent))
PROBE = Path(__file__).parent / "probes" / "slow_phase.py"


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
