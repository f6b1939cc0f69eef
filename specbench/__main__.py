"""``python -m specbench``: the Hydra entry point.

One composed config is one cell. ``-m`` sweeps a grid through
:class:`specbench.sweep.CellSweeper`, which plans baselines, engine runs and
resume, and launches one job per cell; without ``-m`` the cell runs here
with its baseline. Either way :class:`specbench.sweep.FinishSweep` merges
the results when the jobs are done.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import hydra
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from specbench import calibrate, grid, hub, job, logs
from specbench.config import REFUSED_EXIT, ConfigError, cell_from_config, engine_start_environment, refuse
from specbench.plan import run_time, within_budget
from specbench.results.files import CellFiles
from specbench.job import completed_row, run_cell
from specbench.sweep import describe_plan, write_plan
from specbench.workloads import WorkloadError, check_source


def main() -> None:
    """``python -m specbench``: Hydra's entry point, whose own refusals exit 2 as specbench's do.

    Hydra prints a refused override or config group in its compact form and
    exits 1, the status a failed sweep also exits with; its exit is raised
    while it handles the refusal, which is that exit's context. A traceback
    Hydra prints (a bug) keeps its 1.
    """
    try:
        run()
    except SystemExit as exc:
        if exc.code == 1 and isinstance(exc.__context__, CompactHydraException):
            raise SystemExit(REFUSED_EXIT) from None
        raise


@hydra.main(version_base="1.3", config_path="pkg://specbench.conf", config_name="config")
def run(cfg: DictConfig) -> None:
    """Measure the configured cell (and, in a single run, its baseline first)."""
    hydra_cfg = HydraConfig.get()
    try:
        if hydra_cfg.mode != RunMode.MULTIRUN and cfg.get("budget") is not None:
            # A multirun's sweeper sized every cell to the budget before launching them.
            cfg = sized_to_budget(cfg, hydra_cfg.overrides.task)
        cell = cell_from_config(cfg)
        if hydra_cfg.mode != RunMode.MULTIRUN and cfg.get("confirm"):
            # A single run measures one configuration: there is no choice among several to confirm.
            raise ConfigError("confirm=true measures again the configuration a sweep's verdict chose among several; "
                              "a single run chooses none: run it as a sweep (python -m specbench -m ...), "
                              "or raise engine_runs to measure this cell on more fresh engines")
        # A multirun's sweeper has fetched the hub checkpoints and checked the prompts already, once per
        # workload and model; a single run does both here (its baseline loads a subset of its checkpoints).
        if hydra_cfg.mode != RunMode.MULTIRUN:
            hub.fetch_all(cell.checkpoints(), cell.tokenizer_checkpoints(), cell.revisions())
            if problems := check_source(cell.workload, cell.identity["model"]["path"]):
                raise WorkloadError("\n".join(problems))
            calibrate.time_missing([cell], cfg.get("hardware"), bool(cfg.verbose))  # the sweeper's too
    except (ConfigError, WorkloadError, hub.HubError) as exc:
        refuse(exc)  # the sweeper refuses a multirun's bad cells before any job starts
    timeout = cfg.engine.cell_timeout_s
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    run_dir = Path(hydra_cfg.sweep.dir if multirun else hydra_cfg.run.dir)
    # Engine output goes to the sweep's log file; verbose=true leaves it on the terminal.
    engine_log = logs.engine_log(run_dir, cfg.verbose)
    if multirun:
        run_cell(cell, run_dir / "cells", engine_runs=cfg.engine_runs, timeout_s=timeout, engine_log=engine_log)
        return
    planned = grid.single_run_cells(cell, cfg.engine_runs)
    earlier = write_plan(run_dir, planned)
    todo = [p for p in planned if completed_row(CellFiles(run_dir / "cells", p.cell.cell_id), p.cell) is None]
    print("\n".join([describe_plan(run_dir, planned, todo, 1, cfg.verbose, run_time(todo)), *earlier]), flush=True)
    job.PROGRESS = job.SweepProgress(len(planned))
    if todo:
        job.start_engine_server(engine_log, engine_start_environment(cfg.engine))
    try:
        for p in planned:
            run_cell(p.cell, run_dir / "cells", engine_runs=cfg.engine_runs, timeout_s=timeout, engine_log=engine_log)
    finally:
        job.PROGRESS.close()
        job.PROGRESS = None


def sized_to_budget(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """A single run's config sized to its ``budget`` as a sweep's cells are (:func:`specbench.plan.within_budget`:
    the cell and its baseline, in every engine run), saying so in one line; called where Hydra's config
    search is initialised (inside the app).

    Raises:
        ConfigError: one line naming the budget that would fit, when even the smallest sizing does not.
    """
    from hydra import compose

    extra, note = within_budget([tuple(overrides)], lambda point: compose(config_name="config", overrides=list(point)))
    for override in extra:
        key, value = override.split("=", 1)
        OmegaConf.update(cfg, key, yaml.safe_load(value))
    if note:
        print(note, flush=True)
    return cfg


if __name__ == "__main__":
    main()
