"""The grid's rules: its points, each speculative cell's baseline, and the order cells run in.

One module for what the sweeper (:mod:`specbench.sweep`), a single run
(:mod:`specbench.__main__`) and the plan command (:mod:`specbench.plan`) must
agree on:

- **grid points**: a preset's ``hydra.sweeper.params`` and the command line's
  overrides, expanded as Hydra's basic sweeper expands them (a cartesian
  product of comma-separated values);
- **baselines**: a speculative cell is compared with plain decoding of the
  same model, workload, batch size and engine settings; its overrides are
  the cell's without the method, the method's own keys and K;
- **engine-run order**: each engine run measures its baselines and its
  speculative cells; odd engine runs measure the speculative cells first, so
  that drift over a sweep does not always favour one side; within an engine
  run, cells that share an engine run back to back, so the engine is reused;
- **CUDA graphs**: cells that share an engine share its capture sizes, which
  cover the largest step any of them takes (:func:`shared_graph_batches`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from specbench.analytic import graphs
from specbench.config import Cell
from specbench.engine import EngineSpec

Job = tuple[str, ...]
T = TypeVar("T")


@dataclass(frozen=True)
class PlannedCell:
    """A cell and the Hydra overrides that compose it."""

    overrides: Job
    cell: Cell


def override_key(override: str) -> str:
    """The key an override sets (``+a.b=1``, ``~a.b`` and ``a.b=1`` all set ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def with_values(overrides: Sequence[str], **values: Any) -> Job:
    """Overrides with the given keys set (replacing any existing value), those keys last."""
    kept = [o for o in overrides if override_key(o) not in values]
    return tuple(kept + [f"{k}={v}" for k, v in values.items()])


def grid_points(parser: OverridesParser, params: Mapping[str, Any], arguments: Sequence[str]) -> list[Job]:
    """The grid points (full override lists) of a preset's sweeper ``params`` and the command line's overrides.

    The command line comes last, so it overrides the preset; the expansion is
    Hydra's basic sweeper's own.
    """
    parsed = parser.parse_overrides([f"{k}={v}" for k, v in params.items()] + list(arguments))
    return [tuple(job) for job in BasicSweeper.split_arguments(parsed, None)[0]]


def baseline_overrides(job: Sequence[str]) -> Job:
    """The overrides of the baseline a speculative grid point is compared with.

    Overrides inside the method (``method.alpha``, ``method.draft``, ...) and
    K do not exist in, or do not matter to, the baseline; many points share it.
    """
    kept = [o for o in job if override_key(o) not in ("method", "num_speculative_tokens")
            and not override_key(o).startswith("method.")]
    return with_values(kept, method="baseline")


def engine_run_order(baselines: Sequence[T], speculative: Sequence[T], engine_run: int) -> list[T]:
    """One engine run's cells in the order they are measured: odd engine runs measure the speculative ones first."""
    return [*baselines, *speculative] if engine_run % 2 == 0 else [*speculative, *baselines]


def order_cells(cells: Sequence[tuple[Job, Cell, int]], compose: Callable[[Job], Cell]) -> list[PlannedCell]:
    """Every cell of the grid in the order it runs, each speculative cell's baseline added once.

    ``cells`` are the grid points with their cell and engine runs;
    ``compose`` makes the cell of a baseline's overrides (called once for each).
    """
    baselines_by_overrides: dict[Job, Cell] = {}

    def baseline_of(job: Job) -> tuple[Job, Cell]:
        overrides = baseline_overrides(job)
        if overrides not in baselines_by_overrides:
            baselines_by_overrides[overrides] = compose(overrides)
        return overrides, baselines_by_overrides[overrides]

    planned: list[PlannedCell] = []
    seen: set[str] = set()
    for engine_run in range(max((runs for _, _, runs in cells), default=0)):
        baselines, speculative = [], []
        for job, cell, runs in cells:
            if engine_run >= runs:
                continue
            item = PlannedCell(with_values(job, engine_run=engine_run), cell.in_engine_run(engine_run))
            if cell.is_baseline:
                baselines.append(item)
                continue
            speculative.append(item)
            base_overrides, base = baseline_of(job)
            baselines.append(PlannedCell(with_values(base_overrides, engine_run=engine_run),
                                         base.in_engine_run(engine_run)))
        # Cells sharing an engine back to back; the pool keeps it alive.
        engine_rank: dict[Any, int] = {}
        for item in speculative:
            engine_rank.setdefault(engine_key(item.cell), len(engine_rank))
        speculative.sort(key=lambda p: engine_rank[engine_key(p.cell)])
        for item in engine_run_order(baselines, speculative, engine_run):
            if item.cell.cell_id not in seen:
                seen.add(item.cell.cell_id)
                planned.append(item)
    return shared_graph_batches(planned)


def engine_key(cell: Cell) -> EngineSpec:
    """What makes two cells share an engine, whatever their run: the engine spec without its
    instance and its CUDA-graph sizes (those follow from the cells the engine serves)."""
    return replace(cell.engine_spec(prepare=False), instance=0, cudagraph_capture_sizes=())


GRAPH_BATCH_KEY = "engine.cudagraph_batch_size"


def shared_graph_batches(planned: Sequence[PlannedCell]) -> list[PlannedCell]:
    """The cells with one CUDA-graph batch per engine: the largest any cell of that engine steps.

    One engine serves every cell of its configuration (batch sizes, workloads,
    sampling; see :func:`engine_key`), and vLLM captures its graphs once, at
    start. Each cell's engine gets capture sizes that cover the largest step
    of all of them (:func:`specbench.analytic.graphs.capture_sizes` of the
    largest graph batch), so that no cell's steps outgrow its graphs and cells
    that share an engine still share one (equal specs). A speculative cell and
    its baseline run on different engines: each covers its own steps, batch x
    (K+1) and batch. A graph batch set on the command line
    (``engine.cudagraph_batch_size``) is kept. The batch joins the overrides,
    so a job composed from them builds the same engine.
    """
    largest: dict[EngineSpec, int] = {}
    for p in planned:
        key = engine_key(p.cell)
        largest[key] = max(largest.get(key, 0), graphs.graph_batch(p.cell.config))
    out = []
    for p in planned:
        if p.cell.config["engine"].get("cudagraph_batch_size") is not None:
            out.append(p)
            continue
        requests = largest[engine_key(p.cell)]
        out.append(PlannedCell(with_values(p.overrides, **{GRAPH_BATCH_KEY: requests}),
                               p.cell.with_graph_batch(requests)))
    return out


def single_run_cells(cell: Cell, engine_runs: int) -> list[PlannedCell]:
    """A single run's cells in order: the cell (and, if speculative, its baseline) in each engine run."""
    planned: list[PlannedCell] = []
    for engine_run in range(engine_runs):
        measured = cell.in_engine_run(engine_run)
        baselines = [measured] if measured.is_baseline else [measured.baseline()]
        speculative = [] if measured.is_baseline else [measured]
        planned += [PlannedCell((), c) for c in engine_run_order(baselines, speculative, engine_run)]
    return planned
