"""A test's verdict from its merged record: passed, failed (with its cause), off CUDA by design,
needs upstream's CI, skipped by upstream, hung or not run."""

from __future__ import annotations

import re

from .tables import (CI_DATA, DERAILS, KNOWN_CAUSES, LOST_PEERS, NEEDS_CI_ENVIRONMENT, NOT_RUN,
                     NOT_RUN_DERAILS, OFF_CUDA, OFF_CUDA_NAMES, RUNNABLE, UPSTREAM_CI)


def listed(table: dict, nodeid: str):
    """``table``'s value for ``nodeid``: its own entry, else the longest entry that is a prefix
    of it (as pytest's --deselect matches), else None."""
    if nodeid in table:
        return table[nodeid]
    prefixes = [n for n in table if nodeid.startswith(n)]
    return table[max(prefixes, key=len)] if prefixes else None


def classify(test: dict, nodeid: str = "", file_status: str = "finished") -> tuple:
    """(category, reason, belongs to) of one merged test."""
    outcome, message = test["outcome"], test["message"]
    if test.get("flaky"):  # counted apart whatever its outcome: upstream's CI does not run it
        return "flaky upstream", f"{outcome} here" + (f": {message}" if message else ""), \
            "upstream marks it flaky; its CI deselects it"
    if outcome == "passed":
        return "passed", "", ""
    if outcome in NOT_RUN:  # the reason is the runner's, as it reads now
        message = listed(NOT_RUN[outcome], nodeid) or message
    if outcome == "deselected":
        return "off CUDA by design", message, "upstream's test needs CUDA; not run here"
    if outcome == NEEDS_CI_ENVIRONMENT:
        return CI_DATA, message, "not ours: no such data or network here; not run here"
    if outcome == DERAILS:
        return "failed", message, (listed(NOT_RUN_DERAILS, nodeid) or (None, "not ours"))[1] + \
            "; not run here"
    if file_status != "finished" and outcome == "failed" and re.search(LOST_PEERS, message):
        return "not run", f"lost its peers when the file was stopped ({file_status})", \
            "see the file's time line"
    for pattern, why in OFF_CUDA_NAMES:
        if outcome in ("failed", "skipped") and re.search(pattern, nodeid):
            return "off CUDA by design", why, "upstream's test needs CUDA"
    for pattern, why in OFF_CUDA:
        if outcome in ("failed", "skipped") and re.search(pattern, message):
            return "off CUDA by design", why, "upstream's test needs CUDA"
    for pattern, why in UPSTREAM_CI:
        if outcome == "failed" and re.search(pattern, f"{nodeid} {message}"):
            return CI_DATA, why, "not ours: no such data or network here"
    if outcome == "skipped":
        return "skipped", message or "upstream's skip condition", ""
    if outcome in ("hung", "not run"):
        return outcome, message, "see the file's time line"
    for pattern, cause, where in KNOWN_CAUSES:
        if re.search(pattern, f"{nodeid} {message}"):
            return "failed", cause, where
    return "failed", message, "not yet classified"



def verdicts(files):
    """(file result, nodeid, category, reason, belongs to) of every test of ``files``."""
    for file_result in files:
        for nodeid, test in file_result["tests"].items():
            yield (file_result, nodeid, *classify(test, nodeid, file_result["status"]))


def pass_rate(counts) -> tuple:
    """(passed, runnable, percent or None) from a Counter of categories."""
    runnable = sum(counts[c] for c in RUNNABLE)
    return counts["passed"], runnable, (100.0 * counts["passed"] / runnable if runnable else None)
