"""The quiet terminal: what it shows (plan, a line per cell) and where the rest goes (the sweep's log)."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import sys
from pathlib import Path

import pytest
from hydra.types import RunMode

from specbench.config import cell_from_config
from specbench.logs import LOG_FILE, TerminalFilter, redirect_output, sweep_log_file
from specbench.results.files import CellFiles
from specbench.results.metrics import measured_fields
from specbench.job import cell_summary
from specbench.sweep import describe_plan, engine_starts, plan_cells


def record(level: int) -> logging.LogRecord:
    return logging.LogRecord("vllm", level, __file__, 1, "message", None, None)


def test_terminal_shows_warnings_unless_verbose():
    quiet, verbose = TerminalFilter(), TerminalFilter(verbose=True)
    assert not quiet.filter(record(logging.INFO)) and quiet.filter(record(logging.WARNING))
    assert verbose.filter(record(logging.INFO)) and verbose.filter(record(logging.DEBUG))


def test_one_log_file_per_sweep_or_single_run(tmp_path):
    handler = sweep_log_file(str(tmp_path / "run"), str(tmp_path / "sweep"), RunMode.MULTIRUN)
    handler.close()
    assert Path(handler.baseFilename) == tmp_path / "sweep" / LOG_FILE
    handler = sweep_log_file(str(tmp_path / "run"), str(tmp_path / "sweep"), RunMode.RUN)
    handler.close()
    assert Path(handler.baseFilename) == tmp_path / "run" / LOG_FILE


def _print_both(path: Path) -> None:
    redirect_output(path)
    print("to stdout", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    import os

    os.write(2, b"from C, fd 2\n")  # what a C extension writes bypasses sys.stderr


def test_worker_output_is_appended_to_the_log_at_the_descriptor_level(tmp_path):
    log = tmp_path / LOG_FILE
    log.write_text("before\n")
    process = mp.get_context("spawn").Process(target=_print_both, args=(log,))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert log.read_text().splitlines() == ["before", "to stdout", "to stderr", "from C, fd 2"]


def row(cell, wall: float, accepted: int) -> dict:
    from specbench.job import current_provenance

    # A stored row counts as complete only with this run's provenance (resume checks it).
    return {"cell_id": cell.cell_id, "status": "ok", "config_hash": cell.config_hash} | current_provenance(
        cell) | measured_fields(
        rep_wall_s=[wall], rep_output_tokens=[64], num_requests=2, drafts=0 if not accepted else 20,
        draft_tokens=2 * accepted, accepted_tokens=accepted, accepted_per_pos=[accepted // 2] * 2 if accepted else [],
        ttft_s=[], tpot_s=[], e2e_s=[],
    )


def test_cell_line_has_speedup_acceptance_and_exactness(compose_cell, tmp_path):
    spec = cell_from_config(compose_cell(["method=ngram", "num_speculative_tokens=2", "batch_size=4"]))
    base = spec.baseline()
    CellFiles(tmp_path, spec.cell_id).write(row(spec, 1.0, 20), [[1, 2], [3, 4]], ["a", "b"])
    # Before its baseline is measured (odd engine runs measure speculative cells first): tokens/s only.
    assert cell_summary(spec, row(spec, 1.0, 20), tmp_path) == (
        "ngram K=2 batch 4 summarize engine run 0: 64.0 tok/s, acceptance length 2.00, "
        "speedup once its baseline is measured")
    assert cell_summary(base, row(base, 1.5, 0), tmp_path) == "baseline batch 4 summarize engine run 0: 42.7 tok/s"
    CellFiles(tmp_path, base.cell_id).write(row(base, 1.5, 0), [[1, 2], [3, 5]], ["a", "b"])
    assert cell_summary(spec, row(spec, 1.0, 20), tmp_path) == (
        "ngram K=2 batch 4 summarize engine run 0: 1.50x, 64.0 tok/s, acceptance length 2.00, "
        "NOT EXACT: 1 request(s) differ at a clear winner")
    # In bfloat16 the same divergence to a token within the tolerance of the baseline's is a tie.
    tie = row(base, 1.5, 0) | {"dtype": "bfloat16", "top2_margins": [[2.0, 2.0], [2.0, 0.1]],
                               "near_tie_tokens": [[[1], [2]], [[3], [5, 4]]]}
    CellFiles(tmp_path, base.cell_id).write(tie, [[1, 2], [3, 5]], ["a", "b"])
    assert cell_summary(spec, row(spec, 1.0, 20), tmp_path).endswith("exact but for 1 numerical tie(s)")
    CellFiles(tmp_path, base.cell_id).write(row(base, 1.5, 0), [[1, 2], [3, 5]], ["a", "b"])
    # The baseline measured after it names its speedup.
    CellFiles(tmp_path, spec.cell_id).write(row(spec, 1.0, 20) | {
        "baseline_cell_id": base.cell_id, "method": "ngram", "num_speculative_tokens": 2}, [[1, 2], [3, 5]], ["a", "b"])
    assert cell_summary(base, row(base, 1.5, 0), tmp_path) == (
        "baseline batch 4 summarize engine run 0: 42.7 tok/s; measured before it: ngram K=2 1.50x exact")


def test_plan_estimates_the_wall_time_of_the_cells_to_run(compose_cell, tmp_path):
    """The plan line's time is the cells' wall time (specbench.analytic.walltime): each cell's generation
    (warm-up and repetitions over its batches, from prompt lengths in characters), an engine start wherever
    the engine changes, and the sweep's own work."""
    from specbench.analytic import prediction, profiles, steps, walltime
    from specbench.measure import WARMUP_MAX_TOKENS
    from specbench.plan import run_time
    from specbench.workloads import estimated_requests

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": "x" * 900}) + "\n" for i in range(6)))
    workload = [f"workload.source=jsonl", f"workload.path={prompts}", "workload.num_prompts=3",
                "workload.max_tokens=16", "hardware=h200", "repetitions=2", "engine_runs=2"]
    planned = plan_cells([["method=baseline", "batch_size=2"] + workload], compose_cell)
    time, basis = run_time(planned)
    assert estimated_requests(planned[0].cell.config["workload"]) == (3, 200.0)  # 900 characters: 200 tokens
    hw = profiles.HardwareProfile.from_mapping(planned[0].cell.config["hardware"])
    target = prediction.model_profile("embedded:smollm2-135m-instruct", "float32")
    batch = lambda tokens: steps.plain_batch_time(target, hw, 2, 200.0, tokens, 16384)  # noqa: E731
    # Per engine run: a warm-up of 8 tokens, then 2 repetitions of 2 batches (3 prompts, batch 2); a fresh engine.
    assert time.generation_s == pytest.approx(2 * (batch(WARMUP_MAX_TOKENS) + 2 * 2 * batch(16)))
    assert time.starts == engine_starts(planned) == 2 and time.start_s > 2 * walltime.GPU_START_FIXED_S
    assert time.overhead_s == walltime.overhead_s(2)
    assert basis == "h200; speculative cells at their predicted speedup, alpha=0.7"
    text = describe_plan(tmp_path, planned, planned, 1, verbose=False, estimate=(time, basis))
    minutes = lambda s: f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"  # noqa: E731
    assert text.splitlines()[1] == (
        f"  estimated wall time: {minutes(time.total_s)} = generation {minutes(time.generation_s)} + 2 engine "
        f"start(s) {minutes(time.start_s)} + the sweep's own work {minutes(time.overhead_s)} ({basis})")
    # Only what is left to run is priced: a resumed sweep's second engine run.
    left, _ = run_time(planned[1:])
    assert left.starts == 1 and left.total_s == pytest.approx(
        time.total_s - time.start_s / 2 - time.generation_s / 2 - walltime.CELL_OVERHEAD_S)


def test_the_plan_lines_wall_time_counts_the_confirmation_of_confirm_true(compose_cell, tmp_path):
    """With confirm=true the sweep measures, after the grid, the verdict's configuration and its baseline again on
    fresh engines, in each engine run: the line's estimate prices them (the costliest candidate at batch 1)."""
    from specbench.analytic import walltime
    from specbench.plan import run_time

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": "x" * 900}) + "\n" for i in range(6)))
    workload = ["workload.source=jsonl", f"workload.path={prompts}", "workload.num_prompts=3",
                "workload.max_tokens=16", "hardware=h200", "repetitions=1", "engine_runs=2", "confirm=true"]
    jobs = [["method=ngram", f"num_speculative_tokens={k}", f"batch_size={b}"] + workload for k in (2, 4) for b in (1, 4)]
    planned = plan_cells(jobs, compose_cell)
    grid, confirming = run_time(planned)[0], run_time(planned, planned=planned)[0]
    alone = {(p.cell.k, p.cell.batch_size): run_time([p])[0] for p in planned if p.cell.engine_run == 0}
    chosen = max(alone[2, 1].generation_s, alone[4, 1].generation_s)
    # The baseline at batch 1 and the costliest candidate there, in both engine runs, each run on fresh engines.
    assert confirming.generation_s == pytest.approx(grid.generation_s + 2 * (alone[0, 1].generation_s + chosen))
    assert confirming.starts == grid.starts + 4
    assert confirming.overhead_s == pytest.approx(grid.overhead_s + 4 * walltime.CELL_OVERHEAD_S)
    # Without confirm=true nothing is added.
    plain = plan_cells([[o for o in job if o != "confirm=true"] for job in jobs], compose_cell)
    assert run_time(plain, planned=plain)[0] == run_time(plain)[0]


def test_the_plan_lines_wall_time_is_the_plan_commands_for_the_same_grid():
    # What python -m specbench prints before its first engine and what python -m specbench.plan prints for the
    # same grid are one estimate (the demo preset on a CPU profile, every cell still to run).
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from specbench.analytic import walltime
    from specbench.plan import GridComposer, grid_jobs, make_plan, plan_time, run_time

    overrides = ["sweep=cpu_demo", "hardware=cpu-amd-epyc-2-cores"]
    GlobalHydra.instance().clear()
    jobs = grid_jobs(overrides)
    expected = plan_time(make_plan(overrides))
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        # The sweep's cells, composed by the plan's GridComposer: test_presets holds it equal to Hydra's compose of
        # each cpu_demo point, and Hydra's 60 composes (the grid's, then each engine run's) took 13 s of this test.
        planned = plan_cells(jobs, GridComposer())
    GlobalHydra.instance().clear()
    time, basis = run_time(planned)
    assert basis == "cpu-amd-epyc-2-cores; speculative cells at plain-decoding speed, as the CPU build measures them"
    assert time.starts == expected.starts == engine_starts(planned)
    assert time.total_s == pytest.approx(expected.total_s)
    assert time.overhead_s == walltime.overhead_s(len(planned))


def test_plan_says_why_it_has_no_time_estimate(compose_cell, tmp_path, monkeypatch):
    from specbench.analytic import prediction
    from specbench.plan import run_time

    monkeypatch.setattr(prediction, "calibrated_path", lambda: tmp_path / "none.yaml")
    planned = plan_cells([["method=ngram", "engine_runs=1"]], compose_cell)
    time, basis = run_time(planned)
    assert time is None and "calibrate" in basis
    assert f"  estimated wall time: none ({basis})" in describe_plan(
        tmp_path, planned, planned, 1, verbose=False, estimate=(time, basis)).splitlines()


def test_plan_counts_cells_and_engines(compose_cell, tmp_path):
    jobs = [["method=ngram", "num_speculative_tokens=2", "batch_size=1"],
            ["method=ngram", "num_speculative_tokens=2", "batch_size=4"],
            ["method=ngram", "num_speculative_tokens=4", "batch_size=1"]]
    planned = plan_cells([job + ["engine_runs=1"] for job in jobs], compose_cell)
    # Baselines (batch 1 and 4) share an engine; so do the K=2 cells.
    assert engine_starts(planned) == 3
    text = describe_plan(tmp_path, planned, planned[1:], len(jobs), verbose=False)
    assert text.splitlines() == [
        f"sweep {tmp_path}: 5 cells (3 grid points, their baselines, 1 engine run(s)); 4 to run on 3 engine(s), "
        "1 already complete",
        f"  results and report: {tmp_path}/",
        f"  log: {tmp_path / LOG_FILE} (vLLM and engine output; verbose=true shows it here)",
    ]


def test_the_sweeps_plan_line_and_the_plan_command_format_durations_alike(compose_cell, tmp_path):
    # A GPU sweep of hours: the sweeper's line says hours as the plan command does, not hundreds of minutes.
    from specbench.analytic import walltime
    from specbench.plan import duration

    planned = plan_cells([["method=ngram", "engine_runs=1"]], compose_cell)
    long = walltime.SweepTime(generation_s=3 * 3600.0, starts=2, start_s=60.0, overhead_s=5.0)
    line = describe_plan(tmp_path, planned, planned, 1, verbose=False, estimate=(long, "h200")).splitlines()[1]
    assert line.startswith("  estimated wall time: 3.0 h = generation 3.0 h + 2 engine start(s) 60 s")
    assert [duration(s) for s in (59.4, 89.0, 90.0, 5399.0, 5400.0)] == ["59 s", "89 s", "2 min", "90 min", "1.5 h"]
