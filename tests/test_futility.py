"""futility=true (specbench.futility): a configuration below 1x gets no more engine runs than it needs to show it.

The decision on rows judged by the merge's own code, its error rates on simulated sweeps
(tests/benchmarks/futility_sim.py, fewer draws), the sweeper's three steps on constructed cell files (no engine),
the key's validation and the plan's line.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from benchmarks import futility_sim
from rows import cell_row, write_cell

from specbench import futility
from specbench.results.merge import merge
from specbench.analytic import verdicts
from specbench.plan import DEFAULT_ALPHA, composed_cells, duration, make_plan, price_cells, time_lines, with_baselines
from specbench.plan import futility_floor as plan_floor
from specbench.sweep import CellSweeper, futility_floor, plan_cells, read_plan, without_settled, write_plan


def _judged(logs_by_config: dict[int, list[float]]) -> list[dict]:
    """Rows of configurations 0.. with these log speedups (one per engine run measured), judged by the merge."""
    logs = np.full((len(logs_by_config), futility_sim.RUNS), np.nan)
    runs = []
    for c, values in logs_by_config.items():
        logs[c, : len(values)] = values
        runs.append(list(range(len(values))))
    return futility_sim.rows_of(logs, runs)


def test_only_a_waiting_configuration_whose_interval_lies_below_one_is_settled():
    # Three configurations of three runs measure the spread (log sd ~0.03); three measured once wait.
    rows = _judged({0: [0.60, 0.64, 0.58], 1: [0.65, 0.61, 0.66], 2: [0.62, 0.59, 0.66],
                    3: [math.log(0.5)], 4: [math.log(0.97)], 5: [math.log(0.8)]})
    waiting = {"c3", "c4", "c5"}
    done = futility.settled(rows, waiting)
    assert done == {r["config_hash"] for r in rows if r["config_hash"] in waiting and r["speedup_ci_high"] < 1.0}
    assert {"c3", "c5"} <= done and "c4" not in done
    # Only waiting configurations are ever settled, and only on an interval: with no spread measured, none.
    assert futility.settled(rows, {"c0"}) == set()
    alone = _judged({0: [math.log(0.5)], 1: [math.log(0.6)]})
    assert futility.settled(alone, {"c0", "c1"}) == set()


def test_a_flagged_configuration_is_not_settled_and_below_one_takes_only_the_configurations_asking():
    rows = _judged({0: [0.60, 0.64, 0.58], 1: [0.65, 0.61, 0.66], 2: [0.62, 0.59, 0.66], 3: [math.log(0.5)]})
    assert futility.settled(rows, {"c3"}) == {"c3"}
    rows[3]["flagged"] = True
    assert futility.settled(rows, {"c3"}) == set()
    first = _judged({0: [math.log(1.4)], 1: [math.log(0.9)], 2: [math.log(0.5)], 3: [math.log(1.2)]})
    assert futility.below_one(first, {"c0", "c1", "c2", "c3"}) == {"c1", "c2"}
    assert futility.below_one(first, {"c0", "c1"}) == {"c1"}
    # Three engines at the batch size: all go on, none waits.
    assert futility.below_one(first[:3], {"c0", "c1", "c2"}) == set()


def test_a_configuration_waits_only_where_no_cell_of_its_engine_goes_on():
    # ngram K=1..4 at batch 1 and at batch 4, one engine per K serving both. K=4 is below 1x at both: its engine
    # waits. K=3 is below 1x at batch 4 only: its engine goes on for batch 1, so its batch-4 cell goes on with it
    # (waiting, then going on, it would need an engine start of its own in each later run).
    speedups = [1.5, 1.4, 1.3, 0.8, 1.2, 1.1, 0.9, 0.7]
    rows = _judged({c: [math.log(v)] for c, v in enumerate(speedups)})
    for c, row in enumerate(rows):
        row["batch_size"], row["num_speculative_tokens"] = (1, c + 1) if c < 4 else (4, c - 3)
    assert futility.below_one(rows, {r["config_hash"] for r in rows}) == {"c3", "c7"}


def test_three_configurations_go_on_to_measure_the_spread_those_nearest_to_1_first():
    # One configuration pays; five measured 0.5-0.7x once. Settling all five would leave one engine to measure the
    # spread (2 df): the two whose intervals reach highest go on with it.
    rows = _judged({0: [0.14, 0.12, 0.16], **{c: [math.log(0.5 + 0.04 * c)] for c in range(1, 6)}})
    waiting = {f"c{c}" for c in range(1, 6)}
    assert all(r["speedup_ci_high"] < 1.0 for r in rows[1:])
    assert futility.settled(rows, waiting) == {"c1", "c2", "c3"}
    # Where there are only two configurations, both go on.
    assert futility.settled(_judged({0: [0.14, 0.12, 0.16], 1: [math.log(0.5)]}), {"c1"}) == set()


def test_a_settled_configuration_never_pays_and_no_verdict_pays_falsely_more_often_than_alpha():
    # No configuration truly above 1x: the share of sweeps whose verdict pays stays within the verdict's 5%,
    # where three of them stop for futility (fewer df for the rest) as where none does.
    rng = np.random.default_rng(7)
    for speedups in [(1.0,) * 6, (1.0, 1.0, 1.0, 0.8, 0.8, 0.8)]:
        pays = 0
        for _ in range(200):
            logs = futility_sim.draws(rng, speedups, 0.038, 0.025)
            rows = futility_sim.with_futility(logs)
            chosen = verdicts.best_row(rows)
            pays += bool(chosen and chosen[1])
            for row in rows:
                if row["engine_runs"] == 1 and row["speedup_ci_high"] is not None:  # stopped after run 0
                    assert not verdicts.pays(row)
        assert pays / 200 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 200), speedups


def test_the_headline_design_stops_the_eagle_configurations_and_what_it_costs_the_intervals():
    figures = futility_sim.scenario(100, 3, futility_sim.SCENARIOS["headline (ngram 1.8-1.9, EAGLE 0.5-0.84)"],
                                    (0.038, 0.025))
    every, stopped, four = figures["all runs"], figures["futility"], figures["futility, 4 runs"]
    assert stopped["pays"] == four["pays"] == every["pays"] == 1.0
    # The EAGLE configurations at 0.67x and 0.5x stop nearly always, at 0.84x about two times in three.
    assert stopped["cells"] <= 13.0 < every["cells"] == 18.0
    assert stopped["minutes"] < 0.7 * every["minutes"] and four["minutes"] < 0.85 * every["minutes"]
    for figure in (stopped, four):
        assert figure["miss"] <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 300)
    # The settled engines leave the spread: the intervals of those that pay widen at 3 engine runs (their df fall),
    # and at 4 they are narrower than at 3 without stopping.
    assert every["half"] < stopped["half"] <= 1.3 * every["half"]
    assert four["half"] < every["half"]


def _runs_of(planned) -> dict[str, set[int]]:
    runs: dict[str, set[int]] = {}
    for p in planned:
        runs.setdefault(p.cell.config_hash, set()).add(p.cell.engine_run)
    return runs


def _futility_sweep(tmp_path: Path, compose_cell, monkeypatch, pace: dict[int, list[float]]):
    """ngram at batch 1 for each K of ``pace``, in 3 engine runs, swept by ``CellSweeper._launch_with_futility`` with its
    launches recorded and each launched cell written as measured: the baseline 2 s, a cell 2 s / its pace in that
    engine run. Returns the planned cells, the launches, and each configuration's config hash."""
    jobs = [(f"num_speculative_tokens={k}", "batch_size=1", "engine_runs=3", "hardware=cpu-amd-epyc-2-cores",
             "futility=true") for k in pace]
    planned = plan_cells(jobs, compose_cell)
    write_plan(tmp_path, planned)
    cells = tmp_path / "cells"
    launched: list[list] = []

    def launch(self, sweep_dir, todo, first_job, in_process):
        launched.append(list(todo))
        for p in todo:
            cell, run = p.cell, p.cell.engine_run
            wall = 2.0 if cell.is_baseline else 2.0 / pace[cell.k][run]
            row = cell_row(cell.cell_id, cell.method, wall, engine_run=run, config_hash=cell.config_hash, k=cell.k,
                           baseline_id=None if cell.is_baseline else cell.baseline().cell_id)
            write_cell(cells, row | {"engine_id": f"{cell.method}{cell.k}-{run}"}, [[1]])
        return [todo]

    monkeypatch.setattr(CellSweeper, "_launch", launch)
    CellSweeper()._launch_with_futility(tmp_path, planned, planned, in_process=False)
    hashes = {k: next(p.cell.config_hash for p in planned if not p.cell.is_baseline and p.cell.k == k) for k in pace}
    hashes[0] = next(p.cell.config_hash for p in planned if p.cell.is_baseline)
    return planned, launched, hashes


@pytest.mark.parametrize("k4_pace, k4_runs_again", [(0.5, False), (0.97, True)], ids=["settled", "straddles"])
def test_the_sweeper_runs_engine_run_0_then_what_pays_then_only_what_is_unsettled(
        tmp_path: Path, compose_cell, monkeypatch, k4_pace, k4_runs_again):
    # ngram K=1, 2, 3 pay (about 2x, their engine runs 5% apart); K=4 measures below 1x in engine run 0 and waits.
    # At 0.5x its interval (on the others' spread) lies below 1: it stops. At 0.97x it reaches 1: its later engine
    # runs follow, after everything else.
    paying = [2.0, 1.9, 2.1]
    planned, launched, h = _futility_sweep(tmp_path, compose_cell, monkeypatch,
                                           {1: paying, 2: paying[::-1], 3: paying[1:] + paying[:1], 4: [k4_pace] * 3})
    assert _runs_of(launched[0]) == {h[0]: {0}, h[1]: {0}, h[2]: {0}, h[3]: {0}, h[4]: {0}}
    assert _runs_of(launched[1]) == {h[0]: {1, 2}, h[1]: {1, 2}, h[2]: {1, 2}, h[3]: {1, 2}}
    if k4_runs_again:
        assert len(launched) == 3 and _runs_of(launched[2]) == {h[4]: {1, 2}}
    else:
        assert len(launched) == 2  # K=4 settled: its later engine runs never start
    assert set(read_plan(tmp_path)) == {p.cell.cell_id for p in planned}  # the plan still lists them
    # A rerun plans what is left: nothing where K=4 was settled, its later runs where it was not (here measured).
    left = [p for p in planned if not (tmp_path / "cells" / f"{p.cell.cell_id}.parquet").is_file()]
    assert len(left) == (0 if k4_runs_again else 2)
    assert without_settled(tmp_path, planned, left) == []
    # The plan's line before the first engine: the time were both configurations to stop after engine run 0.
    assert futility_floor(planned, planned).startswith("futility=true: from ")


def test_a_rerun_merges_the_cells_once_to_find_what_futility_settled(tmp_path: Path, compose_cell, monkeypatch):
    from specbench import sweep

    planned, _, h = _futility_sweep(tmp_path, compose_cell, monkeypatch,
                                    {1: [2.0, 1.9, 2.1], 2: [1.9, 2.1, 2.0], 3: [2.1, 2.0, 1.9], 4: [0.5] * 3})
    merges = []
    monkeypatch.setattr(sweep, "merge", lambda cells_dir, ids: merges.append(ids) or merge(cells_dir, ids))
    left = [p for p in planned if not (tmp_path / "cells" / f"{p.cell.cell_id}.parquet").is_file()]
    assert {p.cell.config_hash for p in left} == {h[4]} and len(left) == 2
    assert without_settled(tmp_path, planned, left) == [] and len(merges) == 1
    # Where K=4 had one later engine run measured before the sweep stopped, it went on: its last one stays.
    went_on = [p for p in left if p.cell.engine_run == 1]
    write_cell(tmp_path / "cells", cell_row(went_on[0].cell.cell_id, went_on[0].cell.method, 4.0, engine_run=1,
                                            config_hash=h[4], k=4, baseline_id=went_on[0].cell.baseline().cell_id)
               | {"engine_id": "ngram4-1"}, [[1]])
    rest = [p for p in left if p.cell.engine_run == 2]
    assert without_settled(tmp_path, planned, rest) == rest


def test_the_sweeper_prints_the_plans_futility_floor_with_the_confirmation_in_it(compose_cell):
    # One function prices the floor for the plan command and the sweeper; under confirm=true the confirmation runs
    # after the grid whatever stops for futility, so the floor includes it.
    grid = ["batch_size=1", "engine_runs=3", "hardware=cpu-amd-epyc-2-cores", "futility=true"]
    floors = {}
    for confirm in ("false", "true"):
        jobs = [(f"num_speculative_tokens={k}", *grid, f"confirm={confirm}") for k in (1, 2, 3, 4)]
        rows = price_cells(composed_cells(with_baselines(jobs), compose_cell))
        floors[confirm] = plan_floor(rows)
        line = futility_floor(plan_cells(jobs, compose_cell), plan_cells(jobs, compose_cell))
        assert line.startswith(f"futility=true: from {duration(floors[confirm].total_s)}, ")
        assert "were the 1 speculative configuration(s) that may stop (of 4; 3 engines of a batch size go on)" in line
    # The confirmation: an ngram configuration and its baseline at batch 1 again, each on an engine of its own in
    # every run.
    assert floors["true"].starts == floors["false"].starts + 2 * 3
    assert floors["true"].generation_s > floors["false"].generation_s


def test_where_every_configuration_is_below_1x_after_run_0_every_cell_runs_in_the_grids_order(
        tmp_path: Path, compose_cell, monkeypatch):
    # Nothing goes on to measure a spread: nothing can be settled, so nothing waits.
    planned, launched, h = _futility_sweep(tmp_path, compose_cell, monkeypatch, {k: [0.5 + k / 10] * 3 for k in range(1, 5)})
    assert len(launched) == 2
    assert launched[1] == [p for p in planned if p.cell.engine_run > 0]


def test_at_a_batch_size_of_three_engines_or_fewer_nothing_waits(tmp_path: Path, compose_cell, monkeypatch):
    # Three engines of a batch size always go on, so none of three can stop: K=3 below 1x in engine run 0 runs its
    # later engine runs with the others, beside their baselines, not after them.
    planned, launched, h = _futility_sweep(tmp_path, compose_cell, monkeypatch,
                                           {1: [2.0, 1.9, 2.1], 2: [1.9, 2.1, 2.0], 3: [0.5] * 3})
    assert len(launched) == 2 and _runs_of(launched[1]) == {h[k]: {1, 2} for k in (0, 1, 2, 3)}
    rows = price_cells(composed_cells(with_baselines([p.overrides for p in planned if p.cell.engine_run == 0]),
                                      compose_cell))
    assert plan_floor(rows) is None  # and the plan prices no stop


def test_the_plans_floor_stops_an_engine_whole_where_every_batch_size_it_serves_has_room(compose_cell):
    jobs = [(f"num_speculative_tokens={k}", f"batch_size={b}", "engine_runs=3", "hardware=cpu-amd-epyc-2-cores")
            for k in (1, 2, 4, 8) for b in (1, 4)]
    rows = price_cells(composed_cells(with_baselines(jobs), compose_cell))
    timings = [r.timing for r in rows if r.timing is not None]
    assert len(timings) == len(rows) == 10
    engines = {t.engine for t in timings if t.speculative}
    assert len(engines) == 4  # each K's engine serves both batch sizes
    floor = plan_floor(rows)
    # One engine of four may stop at each batch size: the costliest stops whole, both its cells at one run.
    stopped = max(engines, key=lambda e: sum(t.cost.seconds() for t in timings if t.engine == e))
    assert floor is not None and floor.starts == 5 * 3 - 2
    assert math.isclose(floor.generation_s, sum(t.cost.seconds() * (1 / 3 if t.engine == stopped else 1)
                                                for t in timings))


def test_the_plans_floor_stops_only_the_engines_beyond_three_per_batch_size(compose_cell):
    jobs = [(f"num_speculative_tokens={k}", "batch_size=1", "engine_runs=3", "hardware=cpu-amd-epyc-2-cores")
            for k in (1, 2, 4, 8)]
    rows = price_cells(composed_cells(with_baselines(jobs), compose_cell))
    timings = [r.timing for r in rows if r.timing is not None]
    assert len(timings) == len(rows) == 5
    floor = plan_floor(rows)
    # Four engines at batch 1, three go on: one (the costliest; here they cost alike) stops after engine run 0.
    assert floor is not None and floor.starts == 5 * 3 - 2
    one = next(t for t in timings if t.speculative).cost.seconds()
    assert math.isclose(floor.generation_s, sum(t.cost.seconds() for t in timings) - one * 2 / 3)


def test_futility_asks_for_three_engine_runs(compose_cell):
    jobs = [("num_speculative_tokens=2", f"engine_runs={runs}", "futility=true") for runs in (2, 3)]
    assert not futility.asking(plan_cells(jobs[:1], compose_cell))
    assert futility.asking(plan_cells(jobs[1:], compose_cell))
    # On by default; futility=false turns it off.
    assert futility.asking(plan_cells([("num_speculative_tokens=2", "engine_runs=3")], compose_cell))
    assert not futility.asking(plan_cells([("num_speculative_tokens=2", "engine_runs=3", "futility=false")],
                                          compose_cell))


def test_validation_names_a_futility_that_is_not_a_bool(compose_cell):
    from omegaconf import OmegaConf

    from specbench.config import validate

    plain = OmegaConf.to_container(compose_cell([]), resolve=True)
    assert plain["futility"] is True
    assert "futility='yes' must be true or false" in validate({**plain, "futility": "yes"})


def test_the_plan_prints_the_futility_range():
    grid = ["method=ngram,eagle", "num_speculative_tokens=2,4,8", "hardware=cpu-amd-epyc-2-cores", "futility=true"]
    lines = time_lines(make_plan(grid), DEFAULT_ALPHA)
    line = next(line for line in lines if line.startswith("futility=true: "))
    # Six engines at batch 1, three go on: three may stop (their two later engine runs: 21 - 6 starts).
    assert "each of the 3 speculative configuration(s) that may stop" in line and "15 engine start(s)" in line
    for grid in (["method=eagle", "hardware=cpu-amd-epyc-2-cores"], [*grid[:-1], "futility=false"]):
        assert not any(line.startswith("futility=true") for line in time_lines(make_plan(grid), DEFAULT_ALPHA))
