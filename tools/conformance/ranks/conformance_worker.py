"""One rank of a conformance run (tools/conformance starts N of these with torchrun, or
conformance_launch.py forks them).

Runs pytest on the given upstream test file(s) and writes what happens as it happens, one JSON
line per event into ``$MMP_CONFORMANCE_OUT/rank<RANK>.jsonl``: what was collected, each test as it
starts, each phase's report. Written line by line (not a junit file at the end) so that a file
stopped at its timeout still says which tests finished and which one was running.
"""

import json
import os
import sys

import pytest

FLAKY_MARKERS = ("flaky", "flaky_in_dev")


class Recorder:
    def __init__(self, path):
        self.file = open(path, "a", encoding="utf-8", buffering=1)

    def _write(self, **event):
        self.file.write(json.dumps(event) + "\n")

    def pytest_collection_finish(self, session):
        # upstream's CI deselects tests marked flaky (lts) or flaky_in_dev (dev):
        # tests/unit_tests/run_ci_test.sh
        flaky = [item.nodeid for item in session.items
                 if any(item.get_closest_marker(m) for m in FLAKY_MARKERS)]
        self._write(event="collected", nodeids=[item.nodeid for item in session.items],
                    flaky=flaky)

    def pytest_deselected(self, items):
        # the runner's --deselect ids that this release's file has (the others match nothing)
        self._write(event="deselected", nodeids=[item.nodeid for item in items])

    def pytest_collectreport(self, report):
        if report.failed:
            self._write(event="collect_error", nodeid=report.nodeid,
                        message=_message(report))
        elif report.skipped:  # a module-level pytest.skip: the file has no tests to report
            self._write(event="collect_skip", nodeid=report.nodeid, message=_message(report))

    def pytest_runtest_logstart(self, nodeid, location):
        self._write(event="start", nodeid=nodeid)

    def pytest_runtest_logreport(self, report):
        self._write(event="report", nodeid=report.nodeid, when=report.when,
                    outcome=report.outcome, duration=round(report.duration, 3),
                    message=_message(report) if not report.passed else "")


def _message(report) -> str:
    """The skip reason, or the failure's last lines (the exception) and its source line."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (file, line, reason)
        return str(longrepr[2])
    lines = str(longrepr or "").splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("E ")]
    if not errors:
        return "\n".join(lines)[-800:]
    # the source line that raised: the last one before the last block of E lines that is not
    # just a caret marker ("'NoneType' object is not callable" says little without it)
    first = errors[-1]
    while first - 1 in errors:
        first -= 1
    source = [line.strip() for line in lines[:first] if line.strip().strip("^~ ")][-1:]
    # and the line that called it, when it raised in a helper (typed_torch.not_none's "Expected
    # value to be not None" says nothing; its caller names the TE class that is missing)
    marked = [line.strip() for line in lines[:first] if line.startswith(">")]
    caller = [line for line in marked[-2:-1] if line not in source]
    return " | ".join(caller + source + [lines[i][1:].strip() for i in errors[-6:]])


def main(argv=None) -> int:
    """pytest on ``argv`` (default: the command line's); the rank's exit code."""
    argv = sys.argv[1:] if argv is None else argv
    out = os.environ["MMP_CONFORMANCE_OUT"]
    rank = os.environ.get("RANK", "0")
    # torchrun and conformance_launch.py start each rank in a session of its own: the runner
    # kills them by these pids
    with open(os.path.join(out, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    recorder = Recorder(os.path.join(out, f"rank{rank}.jsonl"))
    # upstream's pytest.ini adds coverage and other options of its CI: none of them here.
    # A temporary root per rank inside the run's folder: upstream's tmp_path_dist_ckpt is the
    # root's parent's "tmp_dist_ckpt", so the ranks share it, and a file starts without what an
    # earlier file stopped at its timeout left in /tmp/pytest-of-<user>
    # A class whose parameters fail to build (TE's classes without TE are MagicMocks) is a
    # collection error: reported as its own failure, the rest of the file still runs.
    args = ["-o", "addopts=", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
            f"--basetemp={os.path.join(out, f'pytest-rank{rank}')}", *argv]
    code = pytest.main(args, plugins=[recorder])
    # torchrun stops every rank once one exits non-zero: a rank that got through the file first
    # with failed tests (1) would cut short its peers' tests where the ranks do not run in step
    # (files without a process group). The outcomes are in the events; errors (2-4) still stop.
    return 0 if code in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED,
                         pytest.ExitCode.NO_TESTS_COLLECTED) else int(code)


if __name__ == "__main__":
    sys.exit(main())
