"""The sweep report's page: one self-contained HTML page built from ``results.parquet``.

:func:`write_report` reads the results (Parquet only: no vLLM, so a report can
be rebuilt on a laptop), draws the figures (:mod:`specbench.report.plots`),
computes the tables (:mod:`specbench.report.tables`) and renders
``templates/report.html.j2``. Images are embedded as base64 PNG and styles
are inline, so the page makes no network request and can be mailed as is.
Every text taken from data, configs or error messages goes through jinja2's
autoescaping; nothing from the data is marked safe.

``python -m specbench.report <sweep dir or results.parquet>`` does the same
from the command line. The package re-exports this module's names (:mod:`specbench.report`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
import yaml

from specbench.analytic.verdicts import Grid
from specbench.logs import LOG_FILE
from specbench.report import checks, memory, plots, serving, tables
from specbench.results.files import planned_cell_ids, write_atomic
from specbench.results.schema import checked_results_path, results_path

__all__ = ["REPORT_FILE", "render_report", "verdict_lines", "write_report"]

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"


def write_report(results: Path | str, out: Path | None = None) -> Path:
    """Write the HTML report for a sweep and return its path.

    ``results`` is a sweep directory (holding ``results.parquet``) or the
    Parquet file itself; ``out`` defaults to ``report.html`` beside it. The
    file is written to a temporary name and renamed, so a reader never sees
    half a page. Raises FileNotFoundError when there is no results file and
    :class:`specbench.results.ResultsError` when it is not a readable specbench results file.
    """
    path = checked_results_path(results)  # a damaged or foreign file is refused by name, before any figure
    target = Path(out) if out is not None else path.parent / REPORT_FILE
    html = render_report(path)
    write_atomic(target, lambda f: f.write(html.encode("utf-8")))
    return target


def verdict_lines(results: Path | str) -> list[str]:
    """The report's conclusions as terminal lines: each workload's verdict (offline, then serving), and
    the flagged cells with the command that measures them again. The page's own decisions
    (:mod:`specbench.analytic.verdicts`, over the sweep's planned grid) are the ones shown."""
    path = results_path(results)
    sweep = _read_sweep(path)
    df, served, missing_columns = sweep.offline, sweep.served, sweep.missing_columns
    lines = [f"verdict: {line}" for line in tables.summary(df, missing_columns, sweep.grid).verdicts] if not df.empty else []
    lines += [f"verdict under load: {line}" for line in serving.verdicts(served, sweep.grid)] if not served.empty else []
    flagged = tables.flagged(sweep.full, missing_columns, sweep.command, path.parent)
    if flagged is not None and flagged.remeasure:
        lines.append(f"{len(flagged.cells)} cell(s) flagged and left out of the verdicts (the report says why); "
                     f"to measure them again: {flagged.remeasure}")
    return lines


def render_report(results_path: Path) -> str:
    """The report page for one results file, as an HTML string.

    Hydra's ``multirun.yaml`` (or a single run's ``.hydra/overrides.yaml``)
    beside the results supplies the command that reproduces the sweep.
    """
    sweep = _read_sweep(results_path)
    full, df, served = sweep.full, sweep.offline, sweep.served
    missing_columns, command, grid = sweep.missing_columns, sweep.command, sweep.grid
    encoding = plots.Encoding.for_frame(full)
    figures = (*plots.FIGURES, memory.memory_cost) if not df.empty or served.empty else ()
    summary = tables.summary(df, missing_columns, grid)
    if not served.empty:
        # The counts are the whole sweep's; an offline part that is absent is not missing.
        summary = dataclasses.replace(summary, cells=len(full), failed=int(tables.failed_mask(full).sum()),
                                      missing=summary.missing if not df.empty else [])
    offline_beside, offline_answer = serving.offline_beside(df, served) if not served.empty else ([], None)
    template = _environment().get_template("report.html.j2")
    return template.render(
        title=f"specbench report: {results_path.parent.name}",
        results_path=str(results_path),
        generated_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        summary=summary,
        plots=[_draw(figure, df, encoding) for figure in figures]
        + [_draw(figure, served, encoding) for figure in (serving.FIGURES if not served.empty else ())],
        serving_rows=serving.table(served, grid) if not served.empty else [],
        serving_verdicts=serving.verdicts(served, grid) if not served.empty else [],
        offline_beside=offline_beside,
        offline_beside_answer=offline_answer,
        saturated_share=serving.SATURATED_SHARE,
        serving_ignore_eos=bool(not served.empty and "load_ignore_eos" in served
                                and served["load_ignore_eos"].fillna(False).astype(bool).any()),
        best_configs=tables.best_configs(df, grid),
        has_confirmation=tables.has_confirmation(df),
        spread_note=tables.spread_note(df),
        engine_identity_note=tables.engine_identity_note(full),
        memory_rows=memory.memory_table(df),
        break_even=tables.break_even(df, grid),
        has_model=tables.has_predictions(df),
        schedules=tables.schedules(df, grid),
        # Every cell, serving or offline: exactness, flags, failures, the cell list, provenance.
        exactness=tables.exactness(full),
        flagged=tables.flagged(full, missing_columns, command, results_path.parent),
        error_budget=checks.error_budget(),
        unchecked_baselines=checks.unchecked_baselines(full),
        distribution_checks=checks.distribution_checks(full),
        distribution_note=checks.distribution_note(),
        unequal_lengths=checks.unequal_lengths(full),
        failed=tables.failed(full),
        all_cells=tables.all_cells(full),
        provenance=tables.provenance(full) + _log_file(results_path.parent),
        command=command,
        config_note=sweep.config_note,
    )


@dataclasses.dataclass(frozen=True)
class _Sweep:
    """A results file as the page and the terminal read it."""

    full: pd.DataFrame
    offline: pd.DataFrame
    served: pd.DataFrame
    missing_columns: list[str]
    command: tables.Command
    config_note: str | None
    grid: Grid  # the grid as planned (plan.json), which every verdict walks


def _read_sweep(results_path: Path) -> _Sweep:
    """The results, split into offline and serving cells (serving has its own section: the offline figures and
    tables read batch size as the axis), the command that reproduces the sweep (from Hydra's config) and the
    grid as planned (the sweep's plan.json; without one, the grid its rows imply)."""
    full, missing_columns = tables.load_frame(results_path)
    offline, served = serving.split(full)
    multirun, run_overrides, config_note = _saved_config(results_path.parent)
    command = tables.reproduce_command(multirun, run_overrides, full)
    grid = tables.grid_of(full, planned_cell_ids(results_path.parent))
    return _Sweep(full, offline, served, missing_columns, command, config_note, grid)


def _log_file(sweep_dir: Path) -> list[tuple[str, str]]:
    """The sweep's log (specbench, vLLM and the engine workers), named when it is there."""
    path = sweep_dir / LOG_FILE
    return [("log (specbench, vLLM, engine workers)", str(path))] if path.is_file() else []


def _draw(
    figure: Callable[[pd.DataFrame, plots.Encoding], plots.Plot], df: pd.DataFrame, encoding: plots.Encoding
) -> plots.Plot:
    """One figure; an unexpected drawing error costs that figure, not the page."""
    try:
        return figure(df, encoding)
    except Exception as exc:  # a partial sweep must still get a page; the error is shown and logged
        log.exception("report figure %s failed", figure.__name__)
        doc = (figure.__doc__ or figure.__name__).splitlines()[0].rstrip(".")
        missing = f"This figure could not be drawn: {type(exc).__name__}: {exc}"
        declared = getattr(figure, "plot", None)  # a serving figure's section, declared (serving._figure)
        if isinstance(declared, plots.Plot):
            return dataclasses.replace(declared, missing=missing)
        return plots.Plot(anchor=figure.__name__.replace("_", "-"), title=doc, caption="", missing=missing)


def _saved_config(sweep_dir: Path) -> tuple[Mapping[str, Any] | None, Sequence[str] | None, str | None]:
    """Hydra's saved multirun config, or a single run's overrides, from beside the results.

    Returns (multirun config, single-run overrides, note); the note says why a
    file that exists could not be used.
    """
    candidates = (("multirun", sweep_dir / "multirun.yaml"), ("run", sweep_dir / ".hydra" / "overrides.yaml"))
    for kind, path in candidates:
        if not path.is_file():
            continue
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            return None, None, f"{path.name} could not be read ({exc}); the command below is reconstructed."
        if kind == "multirun" and isinstance(loaded, Mapping):
            return loaded, None, None
        if kind == "run" and isinstance(loaded, list):
            return None, [str(o) for o in loaded], None
        return None, None, f"{path.name} is not a Hydra config; the command below is reconstructed."
    return None, None, None


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("specbench.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
