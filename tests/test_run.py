"""The sweep's view of its machine while a cell runs (no engine)."""

from __future__ import annotations

import os

import pytest

from specbench.run import CpuTimes


def test_other_cpu_share_subtracts_the_sweeps_own_cpu_time():
    cores = os.cpu_count() or 1
    before = CpuTimes(wall_s=10.0, busy_s=100.0, own_s=50.0)
    # 2 s of wall time: the machine was busy 1.5 * cores s, the sweep itself used cores s.
    after = CpuTimes(wall_s=12.0, busy_s=100.0 + 1.5 * cores, own_s=50.0 + cores)
    assert before.other_share(after) == pytest.approx(0.25)
    assert before.other_share(CpuTimes(12.0, None, None)) is None
    # Never below 0 (clock granularity) nor above 1.
    assert before.other_share(CpuTimes(12.0, 100.0, 50.0 + cores)) == 0.0
    # The real clocks: this process is always readable on Linux.
    now = CpuTimes.now(os.getpid())
    assert now.busy_s is None or now.own_s >= 0
