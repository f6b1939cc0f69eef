"""The grid's rules (specbench.grid): points, baselines and the order cells run in, pinned."""

from __future__ import annotations

from hydra.core.override_parser.overrides_parser import OverridesParser

from specbench import grid
from specbench.config import cell_from_config
from specbench.sweep import plan_cells


def _points(*arguments: str, params: dict[str, str] | None = None) -> list[grid.Job]:
    return grid.grid_points(OverridesParser.create(), params or {}, list(arguments))


def test_grid_points_expand_as_hydra_and_the_command_line_overrides_the_preset():
    assert _points("method=ngram,eagle3", "batch_size=1,4") == [
        ("method=ngram", "batch_size=1"), ("method=ngram", "batch_size=4"),
        ("method=eagle3", "batch_size=1"), ("method=eagle3", "batch_size=4"),
    ]
    assert _points("batch_size=8", params={"batch_size": "1,2", "workload": "rag"}) == [
        ("batch_size=8", "workload=rag"),
    ]


def test_a_baseline_drops_the_method_its_keys_and_k():
    job = ("+method.draft=x", "method=draft_model", "num_speculative_tokens=2", "batch_size=4", "method.alpha=0.5")
    assert grid.baseline_overrides(job) == ("batch_size=4", "method=baseline")
    assert grid.with_values(("a=1", "b=2"), a=3) == ("b=2", "a=3")


def test_the_order_of_both_engine_runs_of_a_small_grid(compose_cell):
    jobs = _points("method=ngram,eagle3", "num_speculative_tokens=2,4", "batch_size=1,4", "engine_runs=2")
    planned = plan_cells(jobs, compose_cell)
    speculative = [(m, k, b) for m in ("ngram", "eagle3") for k in (2, 4) for b in (1, 4)]
    baselines = [("baseline", 0, 1), ("baseline", 0, 4)]
    # Engine run 0 measures baselines first, engine run 1 speculative cells first.
    assert [(p.cell.method, p.cell.k, p.cell.batch_size, p.cell.engine_run) for p in planned] == (
        [(*c, 0) for c in baselines + speculative] + [(*c, 1) for c in speculative + baselines]
    )
    # Each engine's CUDA graphs cover its largest batch (4), so that batch 1 and 4 still share it.
    assert planned[0].overrides == ("batch_size=1", "engine_runs=2", "method=baseline", "engine_run=0",
                                    "engine.cudagraph_batch_size=4")
    assert planned[-1].overrides == ("batch_size=4", "engine_runs=2", "method=baseline", "engine_run=1",
                                     "engine.cudagraph_batch_size=4")
    assert planned[2].overrides == (
        "method=ngram", "num_speculative_tokens=2", "batch_size=1", "engine_runs=2", "engine_run=0",
        "engine.cudagraph_batch_size=4")
    assert len({p.cell.cell_id for p in planned}) == len(planned) == 20


def test_a_single_run_alternates_its_pair_as_a_sweep_does(compose_cell):
    cell = cell_from_config(compose_cell(["method=ngram", "engine_runs=3"]))
    planned = grid.single_run_cells(cell, 3)
    assert [(p.cell.method, p.cell.engine_run) for p in planned] == [
        ("baseline", 0), ("ngram", 0), ("ngram", 1), ("baseline", 1), ("baseline", 2), ("ngram", 2),
    ]
    swept = plan_cells([["method=ngram", "engine_runs=3"]], compose_cell)
    assert [p.cell.cell_id for p in planned] == [p.cell.cell_id for p in swept]
    base = cell_from_config(compose_cell(["method=baseline"]))
    assert [p.cell.cell_id for p in grid.single_run_cells(base, 2)] == [base.cell_id, base.in_engine_run(1).cell_id]
