"""`pytest -n auto` (the README's test command) runs at most MAX_AUTO_WORKERS workers, and a
number the user gives xdist is theirs."""

import os

from tests import conftest


def test_auto_is_one_worker_per_usable_core_capped(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    for cores, expected in ((1, 1), (2, 2), (64, conftest.MAX_AUTO_WORKERS)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert conftest.pytest_xdist_auto_num_workers(None) == expected


def test_without_affinity_the_cpu_count_is_used(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert conftest.pytest_xdist_auto_num_workers(None) == 3


def test_the_users_number_is_left_to_xdist(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "7")
    assert conftest.pytest_xdist_auto_num_workers(None) is None
