"""A rank killed with SIGKILL -- in the middle of a step, or while a checkpoint is being written --
in the stock pretrain_gpt.py under `mmp run` on 2 CPU ranks: the job ends within a bounded time
with a non-zero exit and a message naming the rank; the last complete checkpoint is intact, a
checkpoint interrupted while being written is never named the latest, and a restart resumes from
the last complete one bit for bit (the losses and parameters of the uninterrupted run).

tests/fixtures/plugins/reliability_probe.py prints exact values after every step and holds the
chosen rank at the chosen point (RELIABILITY_PAUSE) until the test kills it. Needs
MEGATRON_LM_PATH.
"""

import hashlib
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from tests.harness.stock import PROBE, TINY, command, probe_steps, run_stock

pytestmark = pytest.mark.stock

PAUSED = re.compile(r"reliability_probe paused (\w+) rank=(\d+) pid=(\d+)")
TRACKER = "latest_checkpointed_iteration.txt"
ITERS, KILL_AT = 8, 6  # checkpoints every 2 iterations: 2 and 4 complete when 6 is killed
LAYOUT = ["--use-distributed-optimizer", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"]
BOUND_S = 60  # the whole job must be gone this long after the kill (torchrun's own grace is 30 s)




def tree_digest(path):
    h = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            h.update(os.path.relpath(full, path).encode())
            with open(full, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def run_and_kill(lm_path, args, pause, extra_env=None, timeout=600):
    """Start the job with `pause` (where:rank:iteration), SIGKILL the paused rank from outside
    and wait for the job. Returns (exit status, seconds from the kill to the end, log,
    whatever `before_kill` saw)."""
    full = [*TINY, "--train-iters", str(ITERS), "--mock-data", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_MUSA_PATCH")}
    env.update(OMP_NUM_THREADS="1", MEGATRON_LM_PATH=str(lm_path), RELIABILITY_PAUSE=pause,
               **PROBE, **(extra_env or {}))
    proc = subprocess.Popen(command("mmp", lm_path, 2, full), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    watchdog = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    watchdog.start()
    lines, killed_at, paused = [], None, None
    try:
        for line in proc.stdout:
            lines.append(line)
            match = PAUSED.search(line)
            if match and killed_at is None:
                paused = (match.group(1), int(match.group(2)), int(match.group(3)))
                os.kill(paused[2], signal.SIGKILL)
                killed_at = time.monotonic()
        proc.wait()
    finally:
        watchdog.cancel()
    log = "".join(lines)
    assert killed_at is not None, f"the job never reached the pause point {pause}:\n{log[-3000:]}"
    return proc.returncode, time.monotonic() - killed_at, log, paused


@pytest.fixture(scope="module")
def continuous(lm_path):
    _, _, log = run_stock(lm_path, LAYOUT, iters=ITERS, env=PROBE)
    reference = probe_steps(log)
    assert len(reference) == 2 * ITERS, log[-3000:]
    return reference


CASES = {
    # where:rank -- what is happening when that rank is killed
    "mid-step": "step:1",           # rank 1 inside step 6, rank 0 waiting in the gradient reduce
    "during-save": "save:1",        # checkpoint 6: directory created, shards not written
    "before-commit": "commit:0",    # checkpoint 6 written by every rank, not yet named latest
    "tracker-write": "tracker:0",   # rank 0 rewriting latest_checkpointed_iteration.txt
}


@pytest.mark.parametrize("case", CASES)
def test_killed_rank_ends_the_job_and_a_restart_resumes_exactly(lm_path, tmp_path, continuous,
                                                                case):
    ckpt = tmp_path / "ckpt"
    args = [*LAYOUT, "--save", str(ckpt), "--save-interval", "2"]
    where, rank = CASES[case].split(":")
    status, seconds, log, paused = run_and_kill(lm_path, args, f"{where}:{rank}:{KILL_AT}")

    # the job ends, promptly, non-zero, naming the rank that was killed and how
    assert status != 0, log[-3000:]
    assert seconds < BOUND_S, f"the job took {seconds:.0f} s to end after the kill"
    message = " ".join(log.split())
    assert f"mmp run: rank {rank} (local rank {rank}, pid {paused[2]}) was killed by SIGKILL" \
        in message, log[-3000:]
    assert f"The latest complete checkpoint in {ckpt} is iteration 4" in message

    # the interrupted checkpoint is not the latest; the complete ones are whole
    assert (ckpt / TRACKER).read_text() == "4"
    if where in ("save", "commit"):
        assert (ckpt / f"iter_{KILL_AT:07d}").is_dir()  # begun (or written) but not committed
    assert {p.name for p in ckpt.iterdir()} >= {"iter_0000002", "iter_0000004", TRACKER}
    saved = tree_digest(ckpt / "iter_0000004")

    # the same command with --load resumes at 4 and matches the uninterrupted run exactly
    _, _, resumed_log = run_stock(lm_path, [*args, "--load", str(ckpt)], iters=ITERS, env=PROBE)
    assert re.search(r"successfully loaded checkpoint from .* at iteration 4", resumed_log)
    resumed = probe_steps(resumed_log)
    assert sorted(resumed) == [(r, i) for r in (0, 1) for i in range(5, ITERS + 1)], resumed
    assert {k: continuous[k] for k in resumed} == resumed
    assert (ckpt / TRACKER).read_text() == str(ITERS)
    assert tree_digest(ckpt / "iter_0000004") == saved  # loading did not touch it


def test_without_the_atomic_tracker_write_the_same_kill_loses_the_checkpoint(lm_path, tmp_path):
    """The hole the 'reliability.checkpoint_safety' feature closes: Megatron-LM truncates the tracker and
    then writes it; killed in between, the tracker is empty, and upstream's next job prints
    "Invalid metadata file" and exits with status 0 without training. Through the layer the
    next job fails instead, naming the file and the fix."""
    ckpt = tmp_path / "ckpt"
    args = [*LAYOUT, "--save", str(ckpt), "--save-interval", "2"]
    off = {"MEGATRON_MUSA_PATCH_DISABLE": "reliability.checkpoint_safety"}
    status, _, _, _ = run_and_kill(lm_path, args, f"tracker:0:{KILL_AT}", extra_env=off)
    assert status != 0
    assert (ckpt / TRACKER).read_text() == ""  # truncated, never written

    load = [*args, "--load", str(ckpt)]
    _, _, upstream_log = run_stock(lm_path, load, iters=ITERS, env=off)  # exit 0 (asserted)
    assert "Invalid metadata file" in upstream_log and "iteration        5/" not in upstream_log

    with pytest.raises(AssertionError) as failed:
        run_stock(lm_path, load, iters=ITERS)
    # torchrun prefixes each line of a rank's error with "[rankN]: "
    message = " ".join(re.sub(r"\[rank\d+\]: ", "", str(failed.value)).split())
    assert f"megatron_musa_patch: error: the checkpoint tracker {ckpt / TRACKER} is empty" \
        in message
    # every rank had written checkpoint 6 before rank 0 began the tracker: the newest directory
    # is offered, with the caveat to check it
    assert f"echo {KILL_AT} > {ckpt / TRACKER}` if iter_{KILL_AT:07d} is complete" in message
    assert "exited 1" in message


def test_a_finished_job_run_again_does_not_rewrite_its_latest_checkpoint(lm_path, tmp_path):
    """5 iterations with --save-interval 2 end with a final save of 5; the same job run again
    loads 5, trains nothing and would save 5 again in place (a crash then would leave the
    tracker naming a half-written checkpoint): the layer skips that save."""
    ckpt = tmp_path / "ckpt"
    args = ["--save", str(ckpt), "--load", str(ckpt), "--save-interval", "2"]
    run_stock(lm_path, args, iters=5)
    assert (ckpt / TRACKER).read_text() == "5"
    before = tree_digest(ckpt / "iter_0000005")
    _, _, log = run_stock(lm_path, args, iters=5)
    assert re.search(r"successfully loaded checkpoint from .* at iteration 5", log)
    assert "not saving iteration 5 again" in " ".join(log.split())
    assert "saving checkpoint at iteration" not in log
    assert tree_digest(ckpt / "iter_0000005") == before
