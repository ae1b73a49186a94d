"""Which rank ``mmp run`` names when ranks fail: the first error in time, from the ranks' own
reports, with the lost connections it caused on the others said to follow from it."""

import re
import shutil
import subprocess
import sys
import types

import pytest

from megatron_musa_patch.lib.elastic.failure_report import failure_report
from megatron_musa_patch.lib.elastic import reports

from tests.conftest import subprocess_env

MMP = shutil.which("mmp", path=str(__import__("pathlib").Path(sys.executable).parent))


def _error(rank, time, kind, message):
    return reports.ErrorReport(rank=rank, pid=100 + rank, time=time, kind=kind, message=message)


def test_a_lost_connection_is_told_from_a_rank_s_own_error():
    lost = _error(1, 1.0, "RuntimeError", "[gloo/transport/tcp/pair.cc:538] Read error "
                                           "[127.0.0.1]:3210: Connection reset by peer")
    own = _error(0, 2.0, "AssertionError", "no sample to consume: 0")
    assert lost.lost_connection() and not own.lost_connection()
    # the peer's lost connection was reported first; the rank's own error still comes first
    assert reports.first_error({0: own, 1: lost}) is own
    # nothing but lost connections: the earliest
    later = _error(0, 3.0, "DistNetworkError", "failed to recv, got 0 bytes")
    assert reports.first_error({0: later, 1: lost}) is lost
    assert reports.first_error({}) is None


def test_error_reports_round_trip_through_the_report_directory(tmp_path):
    reports.write_error(str(tmp_path), 3, AssertionError("no sample to consume: 0"))
    (found,) = reports.read_errors(str(tmp_path)).values()
    assert (found.rank, found.kind, found.message) == (3, "AssertionError",
                                                       "no sample to consume: 0")
    reports.write_error(None, 3, AssertionError("x"))  # no directory: nothing, no error
    reports.clear(str(tmp_path))
    assert reports.read_errors(str(tmp_path)) == {}


def test_the_report_names_the_first_error_not_the_first_exit():
    # rank 1 exited 1 first (its lost connection), rank 0 was stopped by the agent
    failures = {0: types.SimpleNamespace(exitcode=-15, local_rank=0, pid=100, timestamp=8),
                1: types.SimpleNamespace(exitcode=1, local_rank=1, pid=101, timestamp=7)}
    errors = {0: _error(0, 5.0, "AssertionError", "no sample to consume: 0"),
              1: _error(1, 5.1, "RuntimeError", "Connection closed by peer [127.0.0.1]:1")}
    text = failure_report(failures, [], errors=errors)
    assert text.startswith("mmp run: rank 0 (local rank 0, pid 100) failed first, with "
                           "AssertionError: no sample to consume: 0"), text
    assert "rank 1 (exit 1: it lost its connection)" in text
    # without the reports, the exit statuses alone name rank 1, as before
    assert failure_report(failures, []).startswith("mmp run: rank 1 (local rank 1, pid 101) "
                                                   "failed first (exit 1)")


@pytest.mark.ranks
@pytest.mark.skipif(MMP is None, reason="the mmp console script is not installed")
@pytest.mark.parametrize("guilty", [0, 1])
def test_mmp_run_names_the_rank_that_raised(tmp_path, guilty):
    script = tmp_path / "worker.py"
    shutil.copy(__import__("pathlib").Path(__file__).parent / "probes" /
                "raise_or_lose_connection.py", script)
    proc = subprocess.run([MMP, "run", "--standalone", "--nproc-per-node", "2", str(script),
                           str(guilty)], env=subprocess_env(), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 1, proc.stderr[-3000:]
    peer = 1 - guilty
    # the peer did lose its connection (the case the exit statuses get wrong)
    assert re.search(rf"\[rank{peer}\]: .*(Connection (reset|closed) by peer)", proc.stderr), \
        proc.stderr[-3000:]
    (said,) = [line for line in proc.stderr.splitlines() if "failed first" in line]
    assert said.startswith(f"mmp run: rank {guilty} (local rank {guilty}, pid "), said
    assert "with AssertionError: no sample to consume: 0" in said
    assert f"rank {peer} (exit 1: it lost its connection)" in said


def test_a_rank_killed_from_outside_is_not_blamed_on_its_peer_s_lost_connection():
    # the out-of-memory killer ends rank 1; rank 0 then loses its connection and reports it
    failures = {0: types.SimpleNamespace(exitcode=1, local_rank=0, pid=100, timestamp=7),
                1: types.SimpleNamespace(exitcode=-9, local_rank=1, pid=101, timestamp=7)}
    errors = {0: _error(0, 5.0, "RuntimeError", "Connection reset by peer [127.0.0.1]:1")}
    text = failure_report(failures, [], errors=errors)
    assert text.startswith("mmp run: rank 1 (local rank 1, pid 101) was killed by SIGKILL"), text
    assert "rank 0 (exit 1: it lost its connection)" in text


def test_an_earlier_attempts_errors_are_not_blamed(tmp_path, monkeypatch):
    """Restarted without the launcher's records (reliability.elastic_agent off), nothing clears
    the directory between attempts: only the latest attempt's reports count."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    reports.write_error(str(tmp_path), 0, AssertionError("attempt 0's"))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    reports.write_error(str(tmp_path), 1, ValueError("attempt 1's"))
    found = reports.read_errors(str(tmp_path))
    assert list(found) == [1] and found[1].attempt == 1 and found[1].said() == "ValueError: attempt 1's"
