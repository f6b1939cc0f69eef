"""Sweeps that survive: a killed sweep resumes, a launcher plugin runs it.

All on the real engine (small cells for 2 cores). The faults are real: the
sweep process is SIGKILLed mid-cell (its engine must not outlive it), a results
file is overwritten with garbage. A failing cell (a draft folder that holds no
model) is isolated in tests/test_e2e.py's grid run, which measures the other cells anyway.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import TEST_ATTEMPTS

pytestmark = pytest.mark.engine

# Short prompts: a summarize prompt's prefill costs seconds a request on 2 cores.
SMALL = ["workload=creative", "workload.num_prompts=2", "workload.max_tokens=12", "repetitions=1", "engine_runs=1"]


def specbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a multirun; stdout carries Hydra's log, so ``.stdout`` gets both streams."""
    return subprocess.run([sys.executable, "-m", "specbench", "-m", *args, *SMALL], cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)


def cell_rows(directory: Path) -> list[Path]:
    return sorted(p for p in (directory / "cells").glob("*.parquet") if not p.name.endswith(".tokens.parquet"))


def _session_members(sid: int) -> list[int]:
    """Live processes of session ``sid`` (Linux /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, session
            members.append(int(stat.parent.name))
    return members


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_killed_sweep_takes_its_engine_along_then_resumes_to_complete_results_and_reruns_corrupt_cells(tmp_path):
    """SIGKILL of the sweep process alone (not its group), mid-cell: the fork server and the engine worker
    follow within seconds; whatever cell files exist are whole; the resume measures the rest."""
    sweep = tmp_path / "sweep"
    grid = ["method=ngram", "num_speculative_tokens=2", "batch_size=1,2", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen([sys.executable, "-m", "specbench", "-m", *grid, *SMALL], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while len(cell_rows(sweep)) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # the next cell is now being measured
        assert proc.poll() is None, "the sweep finished before it could be killed"
        assert len(_session_members(proc.pid)) >= 3  # the sweep, the fork server, the engine worker
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while _session_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _session_members(proc.pid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    survivors = cell_rows(sweep)
    assert 1 <= len(survivors) < 4
    for path in survivors:  # atomic writes: whatever exists is whole
        assert pq.read_table(path).num_rows == 1
    # One survivor's file is then damaged, as a crash of the disk or a hand could: the resume measures
    # that cell again with those it never reached (one command, not two: each costs an engine import).
    victim, kept = survivors[0], survivors[1:]
    victim.write_bytes(b"not parquet")
    started = {p.name: pq.read_table(p).column("started_at")[0].as_py() for p in kept}

    # (The killed sweep itself keeps the default attempts: the kill must still find it mid-cell, as before.)
    resumed = specbench(*grid, TEST_ATTEMPTS, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"{4 - len(kept)} to run on" in resumed.stdout
    assert (f", {len(kept)} already complete" in resumed.stdout) == bool(kept)
    assert f"corrupt result for {victim.stem}" in resumed.stdout
    results = pd.read_parquet(sweep / "results.parquet")
    assert len(results) == 4 and (results["status"] == "ok").all()
    assert results.loc[results["method"] == "ngram", "exact_match"].all()
    assert pq.read_table(victim).num_rows == 1
    for path in kept:  # finished cells were not measured again
        assert pq.read_table(path).column("started_at")[0].as_py() == started[path.name]


def test_submitit_local_launcher_runs_cells_and_merges(tmp_path):
    sweep = tmp_path / "sweep"
    # Its two jobs run at once: each disturbs the other, and would be measured three times with the default.
    done = specbench("hydra/launcher=submitit_local", "method=ngram", "num_speculative_tokens=2",
                     f"hydra.sweep.dir={sweep}", TEST_ATTEMPTS, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    results = pd.read_parquet(sweep / "results.parquet")
    assert sorted(results["method"]) == ["baseline", "ngram"]
    assert (results["status"] == "ok").all() and results["exact_match"].all()
    assert (sweep / ".submitit").exists() or any(sweep.rglob("*_submitted.pkl"))
