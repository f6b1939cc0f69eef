"""The sweep's view of its machine while a cell runs (no engine)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

import pytest

from specbench import job
from specbench.results.provenance import CpuTimes


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


# --- a disturbed cell is measured again -------------------------------------------------------------


class _SleepingWorker:
    """Stands in for the engine worker (its pid is this process): a measurement is half a second
    of idling, during which whatever else runs on the machine is what the sweep sees as others."""

    pid = os.getpid()

    def __init__(self, busy: subprocess.Popen | None) -> None:
        self.busy = busy
        self.calls = 0

    def measure(self, plan, timeout_s):
        self.calls += 1
        time.sleep(0.5)
        if self.busy is not None:  # the other work ends after the first attempt
            self.busy.kill()
            self.busy.wait()
            self.busy = None
        return f"measurement {self.calls}"

    def memory(self):
        return f"memory after {self.calls}"


def test_a_cell_disturbed_by_a_real_busy_process_is_measured_again_and_the_least_disturbed_kept(monkeypatch):
    monkeypatch.setattr(job, "DISTURBED_WAIT_S", 0.0)
    # A real competing process spinning on a core during the first attempt: the
    # disturbance is caused, not mocked. Later attempts see whatever else this
    # machine runs, so the test asserts the rule, not a quiet machine.
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.2)
    worker = _SleepingWorker(busy)
    kept, shares = job._least_disturbed(worker, None, None, 3, "ngram K=4 batch 1 summarize engine run 0")
    assert shares[0] > job.DISTURBED_SHARE
    assert worker.calls == len(shares) >= 2
    assert all(s > job.DISTURBED_SHARE for s in shares[:-1])  # it stops at the first quiet attempt
    kept_attempt = shares.index(min(shares)) + 1
    assert kept == (f"measurement {kept_attempt}", f"memory after {kept_attempt}")
    once = _SleepingWorker(None)
    assert job._least_disturbed(once, None, None, 1, "one attempt allowed")[0][0] == "measurement 1"
    assert once.calls == 1


def test_the_terminal_line_says_how_often_a_cell_was_measured():
    row = {"other_cpu_share_per_attempt": [0.39, 0.35, 0.04], "other_cpu_share": 0.04}
    assert job._attempts_note(row) == "measured 3 times: others took 39%, 35%, 4% of the cores; kept 4%"
    still = {"other_cpu_share_per_attempt": [0.4, 0.3], "other_cpu_share": 0.3}
    assert job._attempts_note(still).endswith("kept 30% (still disturbed)")
    assert job._attempts_note({"other_cpu_share_per_attempt": [0.0]}) is None


# --- resume: a stored row must have been measured the way this run would measure it --------------


class _CharTokenizer:
    """Token ids are character codes: enough to fingerprint the requests, no model needed."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def apply_chat_template(self, conversation, **kwargs):  # pragma: no cover - chat_template=false here
        raise AssertionError("not used")


@pytest.fixture
def resumable(tmp_path, compose_cell, monkeypatch):
    """A cell over a jsonl prompt file, and a stored ok row that matches this run exactly."""
    from specbench import job
    from specbench.config import cell_from_config
    from specbench.workloads import tokens
    from specbench.results.files import CellFiles

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "one"}\n{"id": "b", "prompt": "two"}\n')
    monkeypatch.setattr(job, "_tokenizer", lambda path: _CharTokenizer())
    monkeypatch.setattr(job.models, "resolve", lambda ref, prepare=True: "unused")
    # Caches of their own, dropped after the test: workloads tokenized by the fake, and the
    # "no tokenizer on disk" that the faked resolve gives, never leak into later tests.
    monkeypatch.setattr(job, "_workload", functools.lru_cache(maxsize=16)(job._workload.__wrapped__))
    monkeypatch.setattr(tokens, "local_tokenizer", functools.lru_cache(maxsize=8)(tokens.local_tokenizer.__wrapped__))
    cell = cell_from_config(compose_cell([
        "workload.source=jsonl", f"workload.path={prompts}", "workload.num_prompts=2",
        "workload.chat_template=false", "method=baseline",
    ]))
    files = CellFiles(tmp_path / "cells", cell.cell_id)
    row = {"cell_id": cell.cell_id, "status": "ok", "config_hash": cell.config_hash} | job.current_provenance(cell)
    files.write(row, [], [])
    return cell, files, row, prompts


def test_resume_reuses_a_row_measured_by_this_exact_setup(resumable):
    from specbench.job import completed_row

    cell, files, _, _ = resumable
    assert completed_row(files, cell) is not None


@pytest.mark.parametrize(
    ("column", "stored"),
    [("schema_version", 2), ("vllm_version", "0.31.0"), ("torch_version", "2.12.0"), ("git_commit", "0123abc")],
)
def test_resume_measures_again_a_row_from_another_schema_or_software(resumable, caplog, column, stored):
    from specbench.results.files import CellFiles
    from specbench.job import completed_row

    cell, files, row, _ = resumable
    CellFiles(files.cells_dir, cell.cell_id).write(row | {column: stored}, [], [])
    with caplog.at_level("WARNING"):
        assert completed_row(files, cell) is None
    assert f"{column} {stored}" in caplog.text and "measuring it again" in caplog.text


def test_resume_measures_again_after_the_prompt_file_changed(resumable, caplog):
    from specbench import job
    from specbench.job import completed_row

    cell, files, _, prompts = resumable
    prompts.write_text('{"id": "a", "prompt": "one!"}\n{"id": "b", "prompt": "two"}\n')
    job._workload.cache_clear()  # a new process, as a resumed sweep is
    with caplog.at_level("WARNING"):
        assert completed_row(files, cell) is None
    assert "workload_fingerprint" in caplog.text and "requests_fingerprint" in caplog.text


def test_remeasure_flagged_measures_again_disturbed_rows_and_cells_the_last_merge_flagged(resumable, caplog):
    from dataclasses import replace

    from specbench.results.files import write_results
    from specbench.job import completed_row

    cell, files, row, _ = resumable
    again = replace(cell, config=dict(cell.config, remeasure="flagged"))
    assert completed_row(files, again) is not None  # neither disturbed nor flagged
    files.write(row | {"other_cpu_share": 0.35}, [], [])
    with caplog.at_level("INFO"):
        assert completed_row(files, again) is None
    assert "other processes kept 35%" in caplog.text
    assert completed_row(files, cell) is not None  # without the key, a resume only fills in
    files.write(row | {"other_cpu_share": 0.02}, [], [])
    merged = row | {"flagged": True, "flag_reasons": ["engine runs disagree: 2.00x, 1.40x"]}
    write_results([merged], files.cells_dir.parent / "results.parquet")
    caplog.clear()
    with caplog.at_level("INFO"):
        assert completed_row(files, again) is None
    assert "engine runs disagree" in caplog.text


def test_remeasure_flagged_measures_a_flagged_cell_again_with_its_baseline_and_all_the_baselines_cells(tmp_path):
    # A speedup pairs a cell with its baseline in the same engine runs, order reversed in odd runs: a
    # flagged cell measured again alone would be compared with a baseline of engines long gone. So the
    # unit measured again is the baseline's family: the baseline, and every cell measured against it.
    from rows import make_row, write_results

    from specbench.job import _flagged_families

    rows = [
        make_row("baseline", batch=1) | {"config_hash": "B1"},
        make_row("ngram", 2, batch=1) | {"config_hash": "S2", "flagged": True,
                                         "flag_reasons": ["engine runs disagree: 2.00x, 1.40x"]},
        make_row("ngram", 4, batch=1) | {"config_hash": "S4"},
        # A shifted baseline: flagged with its cells, as the merge flags them.
        make_row("baseline", batch=4) | {"config_hash": "B4", "flagged": True, "flag_reasons": ["engine run 1 ..."]},
        make_row("ngram", 2, batch=4) | {"config_hash": "T2"},
        make_row("baseline", batch=16) | {"config_hash": "B16"},  # a sound family: left as it was
        make_row("ngram", 2, batch=16) | {"config_hash": "U2"},
    ]
    path = write_results(tmp_path, rows)
    again = _flagged_families(path, path.stat().st_mtime_ns)
    assert set(again) == {"B1", "S2", "S4", "B4", "T2"}
    assert again["S2"] == "engine runs disagree: 2.00x, 1.40x"
    assert again["S4"] == again["B1"] == "measured again with its baseline's cells (ngram-k2-b1-summarize-r0 is flagged)"


def test_a_cell_measured_again_keeps_its_earlier_measurement_aside(resumable):
    from specbench import job
    from specbench.engine import EngineError
    from specbench.results.files import REPLACED_DIR
    from specbench.results.schema import read_rows

    class NoEngine:  # the engine's start fails, as a missing checkpoint makes it: the cell's row is written
        def get(self, spec, log_path=None):
            raise EngineError("engine failed to start")

        def discard(self):
            pass

    from dataclasses import replace

    cell, files, row, _ = resumable
    files.write(row | {"other_cpu_share": 0.35}, [[1, 2]], ["a"])
    again = replace(cell, config=dict(cell.config, remeasure="flagged"))
    assert job.run_cell(again, files.cells_dir, engine_runs=1, pool=NoEngine()).status == "failed"
    kept = sorted((files.cells_dir / REPLACED_DIR).iterdir())
    assert [p.name.startswith(f"{cell.cell_id}.") for p in kept] == [True, True]
    assert read_rows(next(p for p in kept if not p.name.endswith(".tokens.parquet")))[0]["other_cpu_share"] == 0.35
    assert read_rows(files.row)[0]["status"] == "failed"


def test_a_corrupt_cell_file_is_kept_aside_before_its_cell_is_measured_again(resumable):
    from specbench.job import completed_row
    from specbench.results.files import REPLACED_DIR

    cell, files, _, _ = resumable
    files.row.write_bytes(b"PAR1 damaged by a full disk")
    assert completed_row(files, cell) is None
    assert not files.row.exists()  # the cell is measured again
    (kept,) = (files.cells_dir / REPLACED_DIR).iterdir()
    assert kept.name.startswith(f"{cell.cell_id}.") and kept.read_bytes() == b"PAR1 damaged by a full disk"


def test_requests_fingerprint_covers_prompt_tokens_and_max_tokens():
    from specbench.measure import CellPlan

    plan = CellPlan(prompts=((1, 2), (3,)), batch_size=1, max_tokens=8, repetitions=1)
    same = CellPlan(prompts=((1, 2), (3,)), batch_size=2 - 1, max_tokens=8, repetitions=3, warmup=False)
    assert plan.fingerprint == same.fingerprint
    assert plan.fingerprint != CellPlan(prompts=((1, 2), (4,)), batch_size=1, max_tokens=8, repetitions=1).fingerprint
    assert plan.fingerprint != CellPlan(prompts=((1, 2), (3,)), batch_size=1, max_tokens=9, repetitions=1).fingerprint


def _stored_with_config(resumable, **changed):
    """The fixture's stored row, as a real cell file holds it: with its resolved config (and ``changed`` columns)."""
    from specbench.results.files import CellFiles

    cell, files, row, _ = resumable
    CellFiles(files.cells_dir, cell.cell_id).write(
        row | {"config_json": json.dumps(cell.config, sort_keys=True)} | changed, [], [])
    return cell, files.cells_dir.parent


def test_a_second_grid_into_the_same_directory_plans_the_union_of_both(resumable):
    from specbench.grid import PlannedCell
    from specbench.sweep import read_plan, write_plan

    first, sweep_dir = _stored_with_config(resumable)
    assert write_plan(sweep_dir, [PlannedCell(("method=baseline",), first)]) == []
    second = first.in_engine_run(1)  # a cell the first grid did not have
    lines = write_plan(sweep_dir, [PlannedCell(("method=baseline", "engine_run=1"), second)])
    assert read_plan(sweep_dir) == [first.cell_id, second.cell_id]
    assert lines == ["  + 1 cell(s) of earlier grids in this directory, merged with these"]
    # The second grid again (a resume) keeps the union as it is, each cell once.
    write_plan(sweep_dir, [PlannedCell(("method=baseline", "engine_run=1"), second)])
    assert read_plan(sweep_dir) == [first.cell_id, second.cell_id]
    assert json.loads((sweep_dir / "plan.json").read_text())[0]["overrides"] == ["method=baseline"]


@pytest.mark.parametrize(
    ("changed", "why"),
    [({"git_commit": "0123abc"}, "stale (stored vs now: git_commit 0123abc vs "),
     ({"schema_version": 2}, "stale (stored vs now: schema_version 2 vs "),
     ({"status": "failed", "error": "EngineError: boom"}, "it failed (EngineError: boom)")],
)
def test_a_second_grid_leaves_out_earlier_cells_a_resume_would_measure_again(resumable, changed, why):
    from specbench.grid import PlannedCell
    from specbench.sweep import read_plan, write_plan

    first, sweep_dir = _stored_with_config(resumable, **changed)
    write_plan(sweep_dir, [PlannedCell((), first)])
    second = first.in_engine_run(1)
    lines = write_plan(sweep_dir, [PlannedCell((), second)])
    assert read_plan(sweep_dir) == [second.cell_id]
    assert len(lines) == 1 and lines[0].startswith(f"  left out of the merge: {first.cell_id}: {why}")


def test_an_earlier_cell_never_measured_is_left_out_of_the_union(resumable):
    from specbench.grid import PlannedCell
    from specbench.sweep import read_plan, write_plan

    first, sweep_dir = _stored_with_config(resumable)
    unmeasured = first.in_engine_run(2)
    write_plan(sweep_dir, [PlannedCell((), first), PlannedCell((), unmeasured)])
    lines = write_plan(sweep_dir, [PlannedCell((), first.in_engine_run(1))])
    assert read_plan(sweep_dir) == [first.cell_id, first.in_engine_run(1).cell_id]
    assert f"{unmeasured.cell_id}: never measured" in "\n".join(lines)


def test_the_plan_is_written_atomically(resumable, monkeypatch):
    from specbench.grid import PlannedCell
    from specbench.sweep import write_plan

    first, sweep_dir = _stored_with_config(resumable)
    write_plan(sweep_dir, [PlannedCell((), first)])
    before = (sweep_dir / "plan.json").read_bytes()

    def disk_full(fd: int) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # the write fails after the new plan's bytes went out
    with pytest.raises(OSError, match="No space left"):
        write_plan(sweep_dir, [PlannedCell((), first.in_engine_run(1))])
    assert (sweep_dir / "plan.json").read_bytes() == before
    assert not [p.name for p in sweep_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_single_run_writes_where_a_sweep_of_the_same_name_does():
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=["sweep_name=mine"], return_hydra_config=True)
            assert cfg.hydra.run.dir == cfg.hydra.sweep.dir == "outputs/mine"
    finally:
        GlobalHydra.instance().clear()


def test_a_failed_cells_machine_is_read_without_opening_the_device_in_the_sweep(device_closed_here):
    # The sweep's process must not open the device (a context the next engine would find taken): the
    # child, a fresh interpreter, reads it.
    job._local_machine.cache_clear()
    try:
        assert job._local_machine().startswith("CPU ")  # no GPU here: the child describes the CPU
    finally:
        job._local_machine.cache_clear()
