"""Across cells: plan a sweep, check it whole, order it, resume it, and finish it.

:class:`CellSweeper` extends Hydra's basic sweeper (same grid syntax, same
launchers) with what a benchmark sweep needs before the first engine loads:

- every cell of the grid is composed and validated; all problems are reported
  together;
- the hub checkpoints the cells load are found in the local cache or downloaded
  once, or refused in one line each (:mod:`specbench.hub`): engines load them offline;
- each speculative cell's baseline (same model, workload, batch size, engine
  settings) is added once, whether or not ``method=baseline`` was listed, and
  never repeated per K;
- ``engine_runs`` independent engine runs: each gets fresh engines (engine reuse
  holds within one); odd engine runs measure speculative cells before baselines so
  that drift does not always favour one side;
- cells already complete in the sweep directory are skipped (resume);
- cells that share an engine run consecutively, so the engine is reused.
- with ``confirm=true``, once the grid is measured, the cell each verdict chose is
  measured again with its baseline on fresh engines (:mod:`specbench.confirm`).

The grid's rules (points, baselines, engine-run order) are :mod:`specbench.grid`'s,
shared with single runs and the plan command.

Speedups are not computed by the jobs: :class:`FinishSweep`, a Hydra
callback, merges the cell files into ``results.parquet`` once all jobs are
done (on whichever launcher), writes the report, and exits non-zero naming
any failed cell. Because comparison happens at merge time, baseline and
speculative cells have no ordering dependency and a cluster launcher can run
them all at once.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from specbench import calibrate, confirm, futility, grid, hub, job
from specbench.analytic import memory
from specbench.config import ConfigError, batch_prompt_tokens, cell_from_config, engine_start_environment, refuse, validate
from specbench.logs import LOG_FILE, engine_log
from specbench.analytic import walltime
from specbench.analytic.prediction import predict_sweep, with_serving_predictions
from specbench.plan import cell_rows, duration, may_stop, run_time, within_budget
from specbench.plan import futility_floor as floor_time
from specbench.grid import PlannedCell
from specbench.results.files import PLAN_FILE, CellFiles, write_atomic, write_results
from specbench.results import serving
from specbench.results.merge import merge
from specbench.results.provenance import provenance_differences
from specbench.results.schema import ResultsError, read_rows, results_path
from specbench.job import completed_row, current_provenance
from specbench.workloads import check_source

log = logging.getLogger(__name__)


def plan_cells(
    jobs: Sequence[Sequence[str]], compose: Callable[[Sequence[str]], DictConfig], *, fetch: bool = False
) -> list[PlannedCell]:
    """Every cell a grid needs, validated, deduplicated and in run order (:func:`specbench.grid.order_cells`).

    ``jobs`` are the grid points as override lists; ``compose`` turns one into
    a config. ``fetch``: once every point is valid, bring the hub checkpoints
    the cells load into the local cache (:func:`specbench.hub.fetch_all`), so
    that the prompts are then measured with their tokenizer; a sweep does,
    pricing a grid (the plan command) does not.

    Raises:
        ConfigError: listing every invalid grid point.
        HubError: with ``fetch``, one line per hub checkpoint that can be neither found nor downloaded.
    """
    errors: list[str] = []
    composed: list[tuple[tuple[str, ...], DictConfig]] = []
    valid: list[tuple[str, DictConfig]] = []
    for job in jobs:
        where = " ".join(job) or "(defaults)"
        try:
            cfg = compose(job)
        except Exception as exc:  # Hydra's own message names the group and its options
            errors.append(f"{where}: {exc}")
            continue
        problems = validate(cfg)
        errors += [f"{where}: {e}" for e in problems]
        composed.append((tuple(job), cfg))
        if not problems:
            valid.append((where, cfg))
    # Every point valid: each becomes its cell (once), and a sweep brings their checkpoints to disk.
    cells = [] if errors else [(job, cell_from_config(cfg), int(cfg.engine_runs)) for job, cfg in composed]
    if fetch and cells:
        hub.fetch_all([pair for _, cell, _ in cells for pair in cell.checkpoints()],
                      {reference for _, cell, _ in cells for reference in cell.tokenizer_checkpoints()},
                      {ref: pin for _, cell, _ in cells for ref, pin in cell.revisions().items()})
    sources_read: set[str] = set()
    for where, cfg in valid:
        # A prompt file that cannot be read, or too few prompts within
        # max_prompt_tokens, would fail every cell of the workload; check
        # each distinct workload (and tokenizer) once, now, before any engine.
        workload = OmegaConf.to_container(cfg.workload, resolve=True)
        key = json.dumps([workload, cfg.model.path], sort_keys=True, default=str)
        if key not in sources_read:
            sources_read.add(key)
            errors += [f"{where}: {e}" for e in check_source(workload, cfg.model.path)]  # type: ignore[arg-type]
    if errors:
        unique = list(dict.fromkeys(errors))
        raise ConfigError(f"{len(unique)} invalid setting(s) in the sweep:\n  " + "\n  ".join(unique))
    return grid.order_cells(cells, lambda overrides: cell_from_config(compose(overrides)))


def waves_line(planned: Sequence[PlannedCell]) -> str | None:
    """One line for the plan when some cells' batches exceed the KV cache; None when every batch fits at once.

    Not a refusal: each request fits, and vLLM admits a batch's remaining
    requests as earlier ones finish, so such a cell runs, with fewer requests
    at a time than its batch_size. Priced as validation prices them
    (:func:`specbench.config.batch_prompt_tokens`); the largest batch is named.
    """
    notes: dict[str, tuple[int, str | None]] = {}
    for p in planned:
        if p.cell.config_hash not in notes:
            config = p.cell.config
            notes[p.cell.config_hash] = (p.cell.batch_size, memory.batch_waves(config, batch_prompt_tokens(config)))
    overflowing = [(batch, note) for batch, note in notes.values() if note is not None]
    if not overflowing:
        return None
    _, largest = max(overflowing, key=lambda item: item[0])
    return (f"note: {len(overflowing)} cell(s) send batches that can outgrow the KV cache; vLLM then runs "
            f"them in waves, fewer requests at a time than batch_size (largest: {largest})")


def write_plan(sweep_dir: Path, planned: Sequence[PlannedCell]) -> list[str]:
    """Record which cells make up this sweep, for the merge, atomically; return lines for the terminal.

    A grid run into a directory that holds an earlier grid's plan adds to it:
    the plan becomes the union, so ``results.parquet`` and the report cover
    both grids. An earlier cell stays only while its stored row would pass a
    resume (:func:`earlier_cells`); the lines name those left out and why.
    """
    planned_ids = {p.cell.cell_id for p in planned}
    earlier, left_out = earlier_cells(sweep_dir, planned_ids)
    plan = earlier + [{"cell_id": p.cell.cell_id, "overrides": list(p.overrides)} for p in planned]
    text = (json.dumps(plan, indent=1) + "\n").encode()
    write_atomic(sweep_dir / PLAN_FILE, lambda f: f.write(text))
    lines = [f"  + {len(earlier)} cell(s) of earlier grids in this directory, merged with these"] if earlier else []
    return lines + [f"  left out of the merge: {line} (run its grid again to measure it)" for line in left_out]


def earlier_cells(sweep_dir: Path, planned_ids: set[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The plan entries of earlier grids in ``sweep_dir`` that still stand, and why the others do not.

    An earlier cell stands when its stored row is complete and was measured
    by this run's setup (schema, vLLM, torch, git commit, prompt file and
    requests: :func:`specbench.results.provenance.provenance_differences`),
    as a resume requires; otherwise merging it would compare measurements of
    different software. Cells of the current grid are not earlier cells.
    """
    path = sweep_dir / PLAN_FILE
    if not path.is_file():
        return [], []
    try:
        entries = json.loads(path.read_text())
    except ValueError as exc:
        return [], [f"{path} cannot be read ({exc})"]
    kept: list[dict[str, Any]] = []
    left_out: list[str] = []
    for entry in entries:
        if entry["cell_id"] in planned_ids:
            continue
        why = _earlier_cell_problem(CellFiles(sweep_dir / "cells", entry["cell_id"]))
        if why is None:
            kept.append(entry)
        else:
            left_out.append(f"{entry['cell_id']}: {why}")
    return kept, left_out


def _earlier_cell_problem(files: CellFiles) -> str | None:
    """Why an earlier grid's stored cell cannot join this sweep's merge, or None when it can."""
    if not files.row.exists():
        return "never measured"
    try:
        row = read_rows(files.row)[0]
    except (ResultsError, IndexError) as exc:
        return f"its file cannot be read ({exc})"
    if row.get("status") != "ok":
        return f"it failed ({row.get('error')})"
    try:
        # The row's own resolved config rebuilds the cell whose requests it measured.
        stale = provenance_differences(row, current_provenance(cell_from_config(json.loads(row["config_json"]))))
    except Exception as exc:  # noqa: BLE001 - a row that cannot be checked is not merged
        return f"it cannot be checked against this run ({type(exc).__name__}: {exc})"
    return f"stale (stored vs now: {'; '.join(stale)})" if stale else None


def engine_starts(planned: Sequence[PlannedCell]) -> int:
    """Engines the cells need in this order: a new one wherever the engine spec changes."""
    specs = [p.cell.engine_spec(prepare=False) for p in planned]
    return sum(1 for i, spec in enumerate(specs) if i == 0 or spec != specs[i - 1])


def describe_plan(sweep_dir: Path, planned: Sequence[PlannedCell], todo: Sequence[PlannedCell],
                  grid_points: int, verbose: bool,
                  estimate: tuple[walltime.SweepTime | None, str] | None = None) -> str:
    """The plan as the terminal shows it before the first engine: cells, engines, time, where things go.

    ``estimate``: the cells to run's wall time and the hardware profile that priced it, or None and why
    not (:func:`specbench.plan.run_time`)."""
    skipped = len(planned) - len(todo)
    runs = max((p.cell.engine_run for p in planned), default=0) + 1
    engines = engine_starts(todo)
    lines = [
        f"sweep {sweep_dir}: {len(planned)} cells ({grid_points} grid points, their baselines, "
        f"{runs} engine run(s)); {len(todo)} to run on {engines} engine(s)"
        + (f", {skipped} already complete" if skipped else ""),
    ]
    if estimate is not None and todo:
        time, basis = estimate
        lines.append(
            f"  estimated wall time: {duration(time.total_s)} = generation {duration(time.generation_s)} + "
            f"{time.starts} engine start(s) {duration(time.start_s)} + the sweep's own work "
            f"{duration(time.overhead_s)} ({basis})"
            if time is not None else f"  estimated wall time: none ({basis})"
        )
    lines += [
        f"  results and report: {sweep_dir}/",
        f"  log: {sweep_dir / LOG_FILE}" + ("" if verbose else " (vLLM and engine output; verbose=true shows it here)"),
    ]
    return "\n".join(lines)


def without_settled(sweep_dir: Path, planned: Sequence[PlannedCell], todo: Sequence[PlannedCell]) -> list[PlannedCell]:
    """``todo`` less the later engine runs of configurations a ``futility=true`` sweep already settled: on a rerun
    whose engine run 0 and whose cells that went on are all measured, the decision the first run made
    (:mod:`specbench.futility`), so that the plan counts what will run. ``todo`` as it is otherwise.

    The cells are merged once, as the sweeper's third step merges them. A configuration with no later engine run
    measured reads its engine run 0's speedup there (the merge's mean over the runs it has); one with some measured
    went on, so it is never dropped.
    """
    if not futility.asking(planned) or any(p.cell.engine_run == 0 for p in todo):
        return list(todo)
    pending = {p.cell.cell_id for p in todo}
    went_on = {p.cell.config_hash for p in planned if p.cell.engine_run > 0 and p.cell.cell_id not in pending}
    rows = merge(sweep_dir / "cells", [p.cell.cell_id for p in planned])
    waiting = futility.below_one(rows, futility.asking(planned) - went_on)
    if not waiting or any(p.cell.cell_id in pending for p in futility.later_now(planned, waiting)):
        return list(todo)
    done = futility.settled(rows, waiting)
    return [p for p in todo if not (p.cell.engine_run > 0 and p.cell.config_hash in done)]


def futility_floor(planned: Sequence[PlannedCell], todo: Sequence[PlannedCell]) -> str | None:
    """The plan's line under ``futility=true``: the time were every configuration that may stop measured in engine
    run 0 only, as the plan command prices it (:func:`specbench.plan.futility_floor`), over the configurations with a
    cell still to run; None where the cells cannot be priced."""
    rows = cell_rows(todo)
    floor = floor_time(rows)
    if floor is None:
        return None
    return (f"futility=true: from {duration(floor.total_s)}, were the {may_stop(rows)} speculative configuration(s) "
            f"that may stop (of {len(futility.asking(planned))}; {futility.MIN_GOING_ON} engines of a batch size go "
            "on) below 1x after engine run 0 (each that is, its interval below 1, stops there; one that pays runs "
            "every engine run)")


def read_plan(sweep_dir: Path) -> list[str]:
    """Cell ids of the sweep planned in ``sweep_dir``."""
    path = sweep_dir / PLAN_FILE
    return [entry["cell_id"] for entry in json.loads(path.read_text())]


class CellSweeper(BasicSweeper):
    """Hydra's basic sweeper, planned cell by cell (see the module docstring)."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        # Not BasicSweeper.__init__: Hydra's plugin scan re-executes its module,
        # after which its `super(BasicSweeper, self)` no longer matches this class.
        Sweeper.__init__(self)
        self.max_batch_size = max_batch_size
        self.params = params or {}
        self.overrides = None
        self.batch_index = 0
        self.hydra_context = None
        self.config = None
        self.launcher = None

    def sweep(self, arguments: list[str]) -> Any:
        """Plan, validate, skip completed cells, and launch the rest."""
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        jobs = grid.grid_points(parser, self.params, arguments)
        loader = self.hydra_context.config_loader
        if self.config.get("budget") is not None:
            # Sized to the budget, or refused in one line, before any checkpoint is fetched or engine starts.
            try:
                extra, note = within_budget(jobs, lambda point: loader.load_sweep_config(self.config, list(point)))
            except ConfigError as exc:
                refuse(exc)
            if extra:
                jobs = grid.grid_points(parser, self.params, [*arguments, *extra])
            if note:
                print(note, flush=True)
        try:
            planned = plan_cells(jobs, lambda point: loader.load_sweep_config(self.config, list(point)), fetch=True)
            hardware = next((h for p in planned if (h := p.cell.config.get("hardware"))), None)
            calibrate.time_missing([p.cell for p in planned], hardware, bool(self.config.get("verbose")))
        except (ConfigError, hub.HubError) as exc:
            refuse(exc)

        sweep_dir = Path(self.config.hydra.sweep.dir)
        earlier = write_plan(sweep_dir, planned)
        # Read from the cells: a preset's sweeper params set it in the jobs, not in the sweeper's own config.
        confirming = any(p.cell.config.get("confirm") for p in planned)
        if not confirming and (stale := confirm.set_aside(sweep_dir)) is not None:
            earlier.append(f"  {stale}")
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        cells_dir = sweep_dir / "cells"
        todo = [p for p in planned if completed_row(CellFiles(cells_dir, p.cell.cell_id), p.cell) is None]
        todo = without_settled(sweep_dir, planned, todo)
        plan = describe_plan(sweep_dir, planned, todo, len(jobs), bool(self.config.get("verbose")),
                             run_time(todo, planned=planned))
        if futility.asking(planned) and (floor := futility_floor(planned, todo)) is not None:
            plan += f"\n  {floor}"
        if (waves := waves_line(planned)) is not None:
            plan += f"\n  {waves}"
        plan += "".join(f"\n{line}" for line in earlier)
        log.info("%s", plan)
        print(plan, flush=True)
        # By name: Hydra's plugin scan re-executes core plugin modules, so the
        # class imported here need not be the one the launcher was made from.
        in_process = type(self.launcher).__name__ == "BasicLauncher"
        returns = (self._launch_with_futility(sweep_dir, planned, todo, in_process) if futility.asking(planned)
                   else self._launch(sweep_dir, todo, 0, in_process))
        if confirming:
            returns += self._confirm(sweep_dir, lambda point: cell_from_config(
                loader.load_sweep_config(self.config, list(point))), len(todo), in_process)
        return returns

    def _launch_with_futility(self, sweep_dir: Path, planned: Sequence[PlannedCell], todo: Sequence[PlannedCell],
                              in_process: bool) -> list[Any]:
        """``futility=true``: engine run 0, then the later runs of what is not below 1x, then those of the
        configurations below 1x whose interval still reaches it (:mod:`specbench.futility`).

        Decided from the cells on disk, so a rerun decides as the first run did and skips what is measured.
        """
        cells_dir = sweep_dir / "cells"
        to_run = {p.cell.cell_id for p in todo}
        first = [p for p in todo if p.cell.engine_run == 0]
        returns = self._launch(sweep_dir, first, 0, in_process)
        launched = len(first)
        waiting = futility.below_one(merge(cells_dir, [p.cell.cell_id for p in planned if p.cell.engine_run == 0]),
                                     futility.asking(planned))
        now = [p for p in futility.later_now(planned, waiting) if p.cell.cell_id in to_run]
        if not any(not p.cell.is_baseline for p in now):
            # Nothing goes on to measure a spread by which to settle the rest: every cell, in the grid's order.
            later = [p for p in todo if p.cell.engine_run > 0]
            return returns + (self._launch(sweep_dir, later, launched, in_process) if later else [])
        returns += self._launch(sweep_dir, now, launched, in_process)
        launched += len(now)
        if not waiting:
            return returns
        done = futility.settled(merge(cells_dir, read_plan(sweep_dir)), waiting)
        rest = [p for p in todo if p.cell.engine_run > 0 and p.cell.config_hash in waiting - done]
        line = futility.describe(waiting, done, len(rest))
        log.info("%s", line)
        print(line, flush=True)
        return returns + (self._launch(sweep_dir, rest, launched, in_process) if rest else [])

    def _confirm(self, sweep_dir: Path, compose: Callable[[Sequence[str]], Any], first_job: int,
                 in_process: bool) -> list[Any]:
        """``confirm=true``: measure what the verdicts chose again, on fresh engines (:mod:`specbench.confirm`).

        The grid is merged as the finish merges it; the confirmation's jobs are launched like the grid's,
        numbered after them, and those already measured (a rerun) are skipped.
        """
        assert self.launcher is not None
        planned = confirm.plan_confirmations(sweep_dir, merged_grid(sweep_dir), compose)
        cells_dir = sweep_dir / "cells"
        todo = [p for p in planned if completed_row(CellFiles(cells_dir, p.cell.cell_id), p.cell) is None]
        line = confirm.describe(planned, todo)
        log.info("%s", line)
        print(line, flush=True)
        return self._launch(sweep_dir, todo, first_job, in_process) if todo else []

    def _launch(self, sweep_dir: Path, todo: Sequence[PlannedCell], first_job: int, in_process: bool) -> list[Any]:
        """Launch ``todo``'s jobs, numbered from ``first_job``, in batches of ``max_batch_size``; in process,
        with a progress bar and the engine fork server started first (none for nothing to run)."""
        assert self.launcher is not None
        if in_process:
            job.PROGRESS = job.SweepProgress(len(todo))
            if todo:
                job.start_engine_server(engine_log(sweep_dir, bool(self.config.get("verbose"))),
                                        engine_start_environment(self.config.engine))
        returns = []
        try:
            batch_size = self.max_batch_size or len(todo) or 1
            for start in range(0, len(todo), batch_size):
                batch = [list(p.overrides) for p in todo[start : start + batch_size]]
                results = self.launcher.launch(batch, initial_job_idx=first_job + start)
                for point, result in zip(batch, results):
                    if result.status == JobStatus.FAILED:
                        # The job itself records cell failures; this is a failure around it.
                        log.error("job %s failed outside the cell: %s", " ".join(point), result._return_value)
                returns.append(results)
        finally:
            if in_process and job.PROGRESS is not None:
                job.PROGRESS.close()
                job.PROGRESS = None
        return returns


class FinishSweep(Callback):
    """Hydra callback: merge the cells into results.parquet, write the report, set the exit status."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """After all jobs of a multirun, on the launching machine."""
        finish(Path(config.hydra.sweep.dir))

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        """After a single run (one cell plus its baseline), unless it stopped before planning."""
        run_dir = Path(config.hydra.run.dir)
        if (run_dir / PLAN_FILE).is_file():  # otherwise the job failed; Hydra reports why
            finish(run_dir)


def merged_grid(sweep_dir: Path) -> list[dict[str, Any]]:
    """The planned cells of ``sweep_dir`` merged into results rows, serving cells compared at their load."""
    planned = read_plan(sweep_dir)
    return serving.with_serving_comparison(merge(sweep_dir / "cells", planned), sweep_dir / "cells", planned)


def finish(sweep_dir: Path) -> list[dict[str, Any]]:
    """Merge, price with the analytic model (specbench.analytic.prediction), report, summarise; exit non-zero naming failed cells."""
    merged, confirmed = confirm.with_confirmations(merged_grid(sweep_dir), sweep_dir)
    rows, calibrate_hint = predict_sweep(merged)
    rows = memory.with_predicted_memory(with_serving_predictions(rows))
    if calibrate_hint:
        print(calibrate_hint)
    results = results_path(sweep_dir)
    write_results(rows, results)
    print(f"results: {results} ({len(rows)} cells)")
    if (sweep_dir / LOG_FILE).is_file():
        print(f"log: {sweep_dir / LOG_FILE}")
    try:
        # Imported here: seaborn and matplotlib are needed once per sweep, not in every job.
        from specbench.report import verdict_lines, write_report

        print(f"report: {write_report(results)}")
        for line in verdict_lines(results):
            print(line)
    except Exception:  # the report is a view of the results: it must not lose them or hide failed cells
        log.exception("could not write the report for %s", results)
    for row in rows:
        # Only a mismatch warns: a numerical tie in a 16-bit dtype is a caveat (results.exactness).
        if row.get("method") != "baseline" and row.get("mismatched_requests"):
            print(
                f"WARNING {row['cell_id']}: {row['mismatched_requests']} request(s) differ from the baseline "
                "where the target had a clear winner; greedy speculative decoding should be exact",
                file=sys.stderr,
            )
        if row.get("method") != "baseline" and row.get("distribution_p_value") is not None \
                and row.get("exactness") == "mismatch":
            print(
                f"WARNING {row['cell_id']}: its samples differ in distribution from the baseline's "
                f"(p = {row['distribution_p_value']:.2g}, Holm-adjusted {row['distribution_p_adjusted']:.2g}); "
                "speculative sampling should be exact in distribution",
                file=sys.stderr,
            )
    # A serving cell's speedups are its own (serving_speedup_*; it has no offline speedup).
    failed = [r for r in rows if r.get("status") != "ok" or (r.get("method") != "baseline" and r.get(
        "serving_speedup_e2e_p50" if serving.is_serving_row(r) else "speedup") is None)]
    # A confirmation cell that could not measure fails the sweep as a grid cell would (a flagged one is worded by its
    # verdict: "not confirmed").
    failed += [r for r in confirmed
               if r.get("status") != "ok" or (r.get("method") != "baseline" and r.get("speedup") is None)]
    for row in failed:
        print(f"FAILED {row['cell_id']}: {row.get('error')}", file=sys.stderr)
    if failed:
        raise SystemExit(f"{len(failed)} of {len(rows) + len(confirmed)} cells failed: "
                         + ", ".join(r["cell_id"] for r in failed))
    return rows
