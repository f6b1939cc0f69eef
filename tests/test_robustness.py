"""Sweeps that survive: a killed sweep resumes, under a launcher plugin, and a damaged cell file is measured again.

The kill is real and on the real engine: the session's reference sweep (tests/conftest.py), copied with one cell
taken out, is run again and its process SIGKILLed while the engine for that cell starts (the engine must not
outlive it); the resume runs under hydra/launcher=submitit_local, whose jobs measure in processes of their own,
so that one sweep tests both, and it measures the one missing cell beside nine kept ones (each command costs a
vLLM import, and each job one more). A damaged results file is caught before any engine: the resume reads each
stored cell first (specbench.job.completed_row), and a file it cannot read is set aside and its cell measured
again. A failing cell (a draft folder that holds no model) is isolated in tests/test_e2e.py's grid run, which
measures the other cells anyway.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import REFERENCE_GRID, Sweep

from specbench.results.files import CellFiles

# Short prompts: a summarize prompt's prefill costs seconds a request on 2 cores.
SMALL = ["workload=creative", "workload.num_prompts=2", "workload.max_tokens=12", "repetitions=1", "engine_runs=1"]


def specbench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a multirun; stdout carries Hydra's log, so ``.stdout`` gets both streams."""
    return subprocess.run([sys.executable, "-m", "specbench", "-m", *args], cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)


def cell_rows(directory: Path) -> list[Path]:
    return sorted(p for p in (directory / "cells").glob("*.parquet") if not p.name.endswith(".tokens.parquet"))


def _session_members(sid: int) -> dict[int, int]:
    """Live processes of session ``sid`` (Linux /proc), each with its parent's id."""
    members = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, session
            members[int(stat.parent.name)] = int(fields[1])
    return members


@pytest.mark.engine
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_killed_sweep_takes_its_engine_along_then_resumes_under_submitit_to_complete_results(tmp_path,
                                                                                              reference_sweep: Sweep):
    """SIGKILL of the sweep process alone (not its group), while the engine of the one cell it has to measure
    starts: the fork server and the engine worker follow within seconds; the cell files it found are kept whole;
    the resume, under the submitit_local launcher, measures the missing cell in a job of its own and merges it
    with the kept cells."""
    sweep = tmp_path / "sweep"
    # The session's reference sweep with one cell (ngram at batch size 1, its baseline kept) taken out: the sweep
    # has one engine to start, and the kept cells are the ones a killed sweep had finished.
    shutil.copytree(reference_sweep.directory, sweep)
    [missing] = reference_sweep.results.query("method == 'ngram' and batch_size == 1")["cell_id"]
    missing_files = CellFiles(sweep / "cells", missing)
    missing_files.row.unlink()
    missing_files.tokens.unlink()
    kept = cell_rows(sweep)
    assert len(kept) == 9
    started = {p.name: pq.read_table(p).column("started_at")[0].as_py() for p in kept}
    grid = [*REFERENCE_GRID, f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen([sys.executable, "-m", "specbench", "-m", *grid], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        # The sweep's own children are the fork server (and multiprocessing's resource tracker); the engine
        # worker is forked by the server, once it has imported vLLM: a member neither the sweep nor its child.
        while (not any(proc.pid not in (pid, parent) for pid, parent in _session_members(proc.pid).items())
               and proc.poll() is None and time.monotonic() < deadline):
            time.sleep(0.2)
        time.sleep(1)  # the engine is now starting
        assert proc.poll() is None, "the sweep finished before it could be killed"
        assert len(_session_members(proc.pid)) >= 3  # the sweep, the fork server, the engine worker
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while _session_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _session_members(proc.pid) == {}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert cell_rows(sweep) == kept  # the missing cell was not measured before the kill
    for path in kept:  # whatever exists is whole
        assert pq.read_table(path).num_rows == 1

    # One job, measuring alone (REFERENCE_GRID's one attempt: jobs of a launcher would disturb each other).
    resumed = specbench(*grid, "hydra/launcher=submitit_local", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "1 to run on 1 engine(s), 9 already complete" in resumed.stdout
    assert (sweep / ".submitit").exists() or any(sweep.rglob("*_submitted.pkl"))
    results = pd.read_parquet(sweep / "results.parquet")
    assert sorted(results["cell_id"]) == sorted(reference_sweep.results["cell_id"])
    assert (results["status"] == "ok").all() and results["exact_match"].all()
    # The cell measured in the resume's job is merged with the kept ones: it has its speedup over the kept baseline.
    assert results.loc[results["cell_id"] == missing, "speedup"].gt(0).all()
    assert results.loc[results["method"] != "baseline", "speedup"].gt(0).all()
    for path in kept:  # finished cells were not measured again
        assert pq.read_table(path).column("started_at")[0].as_py() == started[path.name]


def test_a_damaged_cell_file_is_set_aside_and_its_cell_measured_again(compose_cell, tmp_path, caplog):
    """A cell file overwritten with garbage (a crash of the disk, a hand): the resume does not take it for a
    measurement, says so, and keeps the damaged file aside rather than losing it."""
    from specbench.config import cell_from_config
    from specbench.job import completed_row
    from specbench.results.files import REPLACED_DIR, CellFiles

    cell = cell_from_config(compose_cell(["method=ngram", "num_speculative_tokens=2", *SMALL]))
    files = CellFiles(tmp_path / "cells", cell.cell_id)
    files.cells_dir.mkdir()
    files.row.write_bytes(b"not parquet")
    with caplog.at_level("WARNING"):
        assert completed_row(files, cell) is None
    assert f"corrupt result for {cell.cell_id}" in caplog.text and "measuring it again" in caplog.text
    assert not files.row.exists()
    [aside] = (files.cells_dir / REPLACED_DIR).glob(f"{cell.cell_id}.*.parquet")
    assert aside.read_bytes() == b"not parquet"
