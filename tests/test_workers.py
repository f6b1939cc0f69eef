"""How the test passes share the cores: each pytest-xdist worker's OpenMP pool gets its share (tests/conftest.py)."""

from __future__ import annotations

import os

import pytest
import torch

from tests import conftest


@pytest.fixture
def threads_kept():
    """This process's torch pool as it was, whatever a test sets."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_each_worker_gets_its_share_of_the_cores(monkeypatch, threads_kept):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    conftest.pytest_configure(None)
    assert os.environ["OMP_NUM_THREADS"] == "4" and torch.get_num_threads() == 4
    # More workers than cores: one thread each, never none.
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "16")
    monkeypatch.delenv("OMP_NUM_THREADS")
    conftest.pytest_configure(None)
    assert os.environ["OMP_NUM_THREADS"] == "1" and torch.get_num_threads() == 1


@pytest.mark.parametrize("setting", [{"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"}, {}],
                         ids=["the user's own", "no workers"])
def test_a_users_setting_and_a_pass_without_workers_are_left_alone(monkeypatch, threads_kept, setting):
    for name in ("PYTEST_XDIST_WORKER_COUNT", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    torch.set_num_threads(5)
    conftest.pytest_configure(None)
    assert os.environ.get("OMP_NUM_THREADS") == setting.get("OMP_NUM_THREADS") and torch.get_num_threads() == 5
