"""confirm=true (specbench.confirm): what the verdicts chose, measured again on fresh engines, judged on those runs alone.

The selection and the decision on constructed rows (tests/rows.py), the merge apart on constructed cell files,
the refusals through the real command line; one engine test runs confirm=true end to end on a copy of the session's
reference sweep (tests/conftest.py), whose grid is already measured.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from rows import cell_row, make_row, write_cell, write_results
from test_cli_errors import assert_refused, command, no_engine, sweep  # noqa: F401 - fixtures

from specbench import confirm
from specbench.analytic import verdicts
from specbench.config import cell_from_config
from specbench.report import verdict_lines
from specbench.results.merge import merge
from specbench.sweep import plan_cells, write_plan

# Grid speedups at batch 1 and 4: K=4 is the fastest at the smallest batch size, the cell the verdict names.
SPEEDUPS = {2: {1: 1.4, 4: 1.2}, 4: {1: 1.9, 4: 1.3}}


def _grid(tmp_path: Path, compose_cell, workloads=("summarize",)):
    """A planned grid (plan.json written as the sweeper writes it) and its merged rows, built from the planned cells."""
    jobs = [(f"num_speculative_tokens={k}", f"batch_size={b}", f"workload={w}", "engine_runs=2")
            for w in workloads for k in SPEEDUPS for b in (1, 4)]
    planned = plan_cells(jobs, compose_cell)
    write_plan(tmp_path, planned)
    rows = []
    for p in planned:
        cell = p.cell
        if cell.engine_run:
            continue
        extra = {"cell_id": cell.cell_id, "config_hash": cell.config_hash,
                 "baseline_cell_id": None if cell.is_baseline else cell.baseline().cell_id}
        speedup = 1.0 if cell.is_baseline else SPEEDUPS[cell.k][cell.batch_size] - 0.1 * workloads.index(
            cell.workload["name"])
        rows.append(make_row(cell.method, cell.k, cell.batch_size, cell.workload["name"], speedup, **extra))
    return planned, rows


def test_the_confirmation_measures_the_cell_each_verdict_named_and_its_baseline_on_engines_of_its_own(
        tmp_path, compose_cell):
    planned, rows = _grid(tmp_path, compose_cell, workloads=("summarize", "creative"))
    compose = lambda overrides: cell_from_config(compose_cell(overrides))  # noqa: E731 - as the sweeper composes
    confirmation = confirm.plan_confirmations(tmp_path, rows, compose)
    grid_cells = {p.cell.cell_id: p.cell for p in planned}
    # Per workload the verdict's cell (ngram K=4 at batch 1) and its baseline, in both engine runs, in the grid's
    # order: engine run 0 baselines first, engine run 1 speculative cells first.
    assert [(c.cell.workload["name"], c.cell.k, c.cell.batch_size, c.cell.engine_run) for c in confirmation] == [
        ("summarize", 0, 1, 0), ("creative", 0, 1, 0), ("summarize", 4, 1, 0), ("creative", 4, 1, 0),
        ("summarize", 4, 1, 1), ("creative", 4, 1, 1), ("summarize", 0, 1, 1), ("creative", 0, 1, 1)]
    for p in confirmation:
        twin = next(g for g in grid_cells.values() if g.identity == {
            k: v for k, v in p.cell.identity.items() if k != "confirmation"})
        # The grid's own cell, overrides and all, marked: stored under an id of its own, on an engine of its own.
        assert p.cell.identity["confirmation"] is True and "confirmation=true" in p.overrides
        assert p.cell.cell_id != twin.cell_id and p.cell.config_hash != twin.config_hash
        assert p.cell.engine_spec(prepare=False) != twin.engine_spec(prepare=False)
        assert p.cell.config["engine"] == twin.config["engine"]  # the graphs' batch included
    listed = json.loads((tmp_path / confirm.CONFIRM_FILE).read_text())
    tops = {r["cell_id"] for r in rows if r["method"] == "ngram" and r["num_speculative_tokens"] == 4
            and r["batch_size"] == 1}
    assert {e["confirms"] for e in listed} == tops | {None}
    assert [e["cell_id"] for e in listed] == [p.cell.cell_id for p in confirmation]


def test_a_workload_whose_verdict_names_no_cell_has_nothing_to_confirm(tmp_path, compose_cell):
    planned, rows = _grid(tmp_path, compose_cell)
    for row in rows:
        if row["batch_size"] == 1 and row["method"] != "baseline":
            row |= {"status": "failed", "error": "engine died", "speedup": None}
    assert verdicts.confirmation_targets(rows, verdicts.Grid.of(rows)) == []
    compose = lambda overrides: cell_from_config(compose_cell(overrides))  # noqa: E731
    assert confirm.plan_confirmations(tmp_path, rows, compose) == []
    assert confirm.describe([], []) == "confirm=true: no verdict named a configuration to measure again"


def _confirmed(low: float, high: float, speedup: float, **more):
    rows = [make_row("baseline", batch=b) for b in (1, 4)]
    rows += [make_row("ngram", k, b, speedup=s) for k, by in SPEEDUPS.items() for b, s in by.items()]
    top = next(r for r in rows if r["num_speculative_tokens"] == 4 and r["batch_size"] == 1)
    top |= {"confirmation_cell_id": "ngram-k4-b1-summarize-0123456789ab-r0", "confirmation_speedup": speedup,
            "confirmation_ci_low": low, "confirmation_ci_high": high, "confirmation_not_judged": None} | more
    return rows


@pytest.mark.parametrize("confirmation, pays, clause", [
    ((1.7, 2.1, 1.9), True, "; confirmed on fresh engines: 1.90× [1.70, 2.10]"),
    ((0.95, 1.10, 1.02), False, "; not confirmed on fresh engines: 1.02× [0.95, 1.10]"),
], ids=["confirmed", "not confirmed"])
def test_the_verdict_is_confirmed_on_the_confirmation_runs_alone(tmp_path, confirmation, pays, clause):
    rows = _confirmed(*confirmation)
    top = rows[-2]
    found = verdicts.confirmation(top)
    assert found is not None and found.pays is pays and found.why_not is None
    # The grid's interval says it pays either way (1.90x [1.71, 2.09]); the fresh engines decide.
    assert verdicts.pays(top)
    write_results(tmp_path, rows)
    line = verdict_lines(tmp_path)[0]
    assert line.startswith("verdict: summarize: ngram K=4 pays ") and line.endswith(clause)


def test_a_confirmation_that_cannot_judge_confirms_nothing(tmp_path):
    rows = _confirmed(1.7, 2.1, 1.9, confirmation_not_judged="flagged: engine runs disagree: 1.20x, 2.90x")
    found = verdicts.confirmation(rows[-2])
    assert found is not None and not found.pays
    write_results(tmp_path, rows)
    assert verdict_lines(tmp_path)[0].endswith(
        "; not confirmed: its confirmation on fresh engines cannot judge (flagged: engine runs disagree: 1.20x, 2.90x)")


def test_a_verdict_that_does_not_pay_says_what_the_fresh_engines_found(tmp_path):
    rows = _confirmed(1.2, 1.4, 1.3)
    for row in rows:
        if row["method"] != "baseline":
            row |= {"speedup_ci_low": 0.9, "speedup_ci_high": 1.5}
    write_results(tmp_path, rows)
    line = verdict_lines(tmp_path)[0]
    assert "nothing is shown to pay at batch 1" in line
    assert line.endswith("; measured again on fresh engines it pays: 1.30× [1.20, 1.40]")
    # A row never measured again has no confirmation; its verdict says nothing of one.
    assert verdicts.confirmation(rows[0]) is None


def _pair(cells: Path, ids: list[str], config_hash: str, base_hash: str, paces: tuple[float, ...], engine: str):
    """ngram K=4 at batch 1 and its baseline in each engine run: baseline 2 s, the cell 2 s / pace."""
    for run, pace in enumerate(paces):
        base_id, cell_id = f"baseline-k0-b1-summarize-{base_hash}-r{run}", f"ngram-k4-b1-summarize-{config_hash}-r{run}"
        write_cell(cells, cell_row(base_id, "baseline", 2.0, engine_run=run, config_hash=base_hash)
                   | {"engine_id": f"{engine}base{run}"}, [[1]])
        write_cell(cells, cell_row(cell_id, "ngram", 2.0 / pace, baseline_id=base_id, engine_run=run, k=4,
                                   config_hash=config_hash) | {"engine_id": f"{engine}k4-{run}"}, [[1]])
        ids += [base_id, cell_id]


def test_the_confirmation_is_merged_apart_and_leaves_the_grids_rows_as_they_were(tmp_path):
    cells = tmp_path / "cells"
    grid_ids: list[str] = []
    again_ids: list[str] = []
    _pair(cells, grid_ids, "aaaaaaaaaaaa", "bbbbbbbbbbbb", (2.0, 2.1, 1.9), "grid-")
    _pair(cells, again_ids, "cccccccccccc", "dddddddddddd", (1.25, 1.3, 1.2), "fresh-")
    grid_rows = merge(cells, grid_ids)
    top = next(r for r in grid_rows if r["method"] == "ngram")
    (tmp_path / confirm.CONFIRM_FILE).write_text(json.dumps(
        [{"cell_id": c, "overrides": [], "confirms": top["cell_id"] if c.startswith("ngram") else None}
         for c in again_ids]))
    rows, confirmed = confirm.with_confirmations(grid_rows, tmp_path)
    chosen = next(r for r in rows if r["method"] == "ngram")
    alone = next(r for r in merge(cells, again_ids) if r["method"] == "ngram")
    # The confirmation's figures are its own runs' alone; the grid's row keeps its speedup and interval.
    assert chosen["confirmation_speedup"] == pytest.approx(1.25, rel=0.01) == alone["speedup"]
    assert (chosen["confirmation_ci_low"], chosen["confirmation_ci_high"]) == (
        alone["speedup_ci_low"], alone["speedup_ci_high"])
    assert chosen["confirmation_cell_id"] == alone["cell_id"] and chosen["confirmation_not_judged"] is None
    def grid_part(row):
        return {k: v for k, v in row.items() if not k.startswith("confirmation_")}

    assert grid_part(chosen) == grid_part(top) and all(top[k] is None for k in top if k.startswith("confirmation_"))
    assert chosen["speedup"] == pytest.approx(2.0, rel=0.01)
    assert [r["cell_id"] for r in confirmed] == [r["cell_id"] for r in merge(cells, again_ids)]
    # Written and read back through the results file, the verdict reads it.
    write_results(tmp_path, rows)
    assert "; confirmed on fresh engines: 1.25×" in verdict_lines(tmp_path)[0]


def test_a_confirmation_never_measured_says_so_and_without_confirm_json_nothing_changes(tmp_path):
    cells = tmp_path / "cells"
    ids: list[str] = []
    _pair(cells, ids, "aaaaaaaaaaaa", "bbbbbbbbbbbb", (2.0, 2.1), "grid-")
    rows = merge(cells, ids)
    assert confirm.with_confirmations(rows, tmp_path) == (rows, [])
    top = next(r for r in rows if r["method"] == "ngram")
    (tmp_path / confirm.CONFIRM_FILE).write_text(json.dumps(
        [{"cell_id": "ngram-k4-b1-summarize-cccccccccccc-r0", "overrides": [], "confirms": top["cell_id"]}]))
    again, _ = confirm.with_confirmations(rows, tmp_path)
    assert verdicts.confirmation(next(r for r in again if r["method"] == "ngram")) == verdicts.Confirmation(
        None, None, None, False, "never measured")


@pytest.mark.parametrize("overrides, expected", [
    (["confirm=maybe"], "Value 'maybe' is not a valid bool (type str)\n    full_key: confirm"),
    (["confirm=true"], "confirm=true measures again the configuration a sweep's verdict chose among several; "
                       "a single run chooses none"),
], ids=["not-a-bool", "single-run"])
def test_confirm_is_refused_in_one_line_before_any_engine(command, no_engine, tmp_path, overrides,  # noqa: F811
                                                          expected):
    result = command(sweep(*overrides, multirun=False, out=tmp_path))
    assert result.returncode == 2
    assert_refused(result, expected)
    assert not (tmp_path / "run" / "cells").exists()


def test_validation_names_a_confirm_that_is_not_a_bool(compose_cell):
    from omegaconf import OmegaConf

    from specbench.config import validate

    plain = OmegaConf.to_container(compose_cell([]), resolve=True)
    assert "confirm='yes' must be true or false" in validate({**plain, "confirm": "yes"})
    assert validate(compose_cell(["confirm=true"])) == []


def _undisturbed(cells: Path) -> None:
    """Every cell file of ``cells`` marked as measured on a quiet machine (no other process's CPU time)."""
    from specbench.results.files import write_table
    from specbench.results.schema import read_rows, rows_to_table

    for path in cells.glob("*-r[0-9].parquet"):
        row = read_rows(path)[0] | {"other_cpu_share": 0.0, "other_cpu_share_per_attempt": [0.0]}
        write_table(rows_to_table([row]), path)


@pytest.mark.engine
def test_a_sweep_with_confirm_measures_the_chosen_cell_again_on_fresh_engines_and_a_rerun_keeps_it(
        tmp_path, reference_sweep, compose_cell):
    from conftest import REFERENCE_GRID, specbench
    from specbench.job import completed_row
    from specbench.results.files import CellFiles
    from specbench.sweep import merged_grid

    # The session's reference sweep, copied: its grid is complete, so confirm=true measures the confirmation alone
    # (a grid of its own would cost a vLLM import and two engines more). A flagged cell is named by no verdict, and a
    # shared machine flags every cell as disturbed: the copy's cells are marked undisturbed, so that what is tested
    # does not hang on the machine's load (a no-op on a quiet one).
    directory = tmp_path / "sweep"
    shutil.copytree(reference_sweep.directory, directory)
    _undisturbed(directory / "cells")
    done = specbench("-m", *REFERENCE_GRID, "confirm=true", f"hydra.sweep.dir={directory}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    # A multirun into a complete directory resumes: none of the grid's cells is measured again.
    assert "0 to run on 0 engine(s), 10 already complete" in done.stdout
    listed = json.loads((directory / confirm.CONFIRM_FILE).read_text())
    assert len(listed) == 2 and all((directory / "cells" / f"{e['cell_id']}.parquet").is_file() for e in listed)
    results = pd.read_parquet(directory / "results.parquet")
    assert len(results) == 10  # the grid's cells only: the confirmation is merged apart
    # The verdict names one cell of the one workload (the fastest at batch 1 of several speculative ones: which
    # depends on the machine); it and its baseline are measured again.
    [chosen] = [row for _, row in results.iterrows() if pd.notna(row["confirmation_cell_id"])]
    assert chosen["method"] != "baseline" and chosen["batch_size"] == 1
    assert (f"confirming on fresh engines what the verdicts chose: {chosen['method_label']} at batch 1 on creative, "
            "with their baselines: 2 cells, 2 to run") in done.stdout
    assert chosen["confirmation_cell_id"] in {e["cell_id"] for e in listed}
    assert pd.notna(chosen["confirmation_speedup"])
    # Fresh engines: none of the confirmation's engine ids is one of the grid's.
    cells = [pd.read_parquet(directory / "cells" / f"{e['cell_id']}.parquet").iloc[0] for e in listed]
    assert not {c["engine_id"] for c in cells} & set(",".join(results["engine_id"]).split(","))
    assert any("on fresh engines" in line for line in done.stdout.splitlines() if line.startswith("verdict:"))
    # A rerun (after a crash, say) measures nothing again: the sweeper's confirmation step (plan, then the cells not
    # yet complete), taken in this process on what the command wrote (a second command would cost an interpreter
    # and a report to print the same line), plans the same cells, and finds each complete.
    again = confirm.plan_confirmations(directory, merged_grid(directory),
                                       lambda point: cell_from_config(compose_cell(point)))
    assert [p.cell.cell_id for p in again] == [e["cell_id"] for e in listed]
    todo = [p for p in again if completed_row(CellFiles(directory / "cells", p.cell.cell_id), p.cell) is None]
    assert confirm.describe(again, todo).endswith("2 cells, 0 to run, 2 already measured")


def test_a_sweep_run_again_without_confirm_leaves_the_earlier_confirmation_out(command, tmp_path, monkeypatch):  # noqa: F811
    # An earlier run with confirm=true left confirm.json naming its chosen cell; the grid is run again with
    # confirm=false (the default). Its finish must not attach the earlier confirmation to this run's rows.
    import specbench.sweep as sweeping

    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    grid = ["method=ngram", "num_speculative_tokens=2", "batch_size=1", "engine_runs=1", "workload.num_prompts=2"]
    finished: list[Path] = []
    monkeypatch.setattr(sweeping.CellSweeper, "_launch", lambda self, *args: [])  # no engine: the grid is not run
    monkeypatch.setattr(sweeping, "finish", finished.append)
    earlier = [{"cell_id": "ngram-k2-b1-summarize-cccccccccccc-r0", "overrides": [], "confirms": "the-grid-cell"}]
    (sweep_dir / confirm.CONFIRM_FILE).write_text(json.dumps(earlier))
    rows = [make_row("ngram", 2, 1, speedup=1.4, cell_id="the-grid-cell")]
    assert confirm.with_confirmations(rows, sweep_dir)[0][0]["confirmation_not_judged"] == "never measured"
    result = command(sweep(*grid, multirun=True, out=tmp_path))
    assert result.returncode == 0 and finished == [sweep_dir], result.output[-2000:]
    assert "confirm=false: the confirmation an earlier run measured (confirm.json) is left out of these results" \
        in result.output
    assert confirm.with_confirmations(rows, sweep_dir) == (rows, [])
