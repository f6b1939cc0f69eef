"""``confirm=true``: the configuration each verdict chose, measured again on fresh engines and judged on those runs alone.

A verdict's configuration is the fastest of several at the smallest planned batch size, so its grid speedup
leans high (the winner's curse). After the grid's jobs the sweeper merges the grid as the finish does, asks the
verdicts which cell each names (:func:`specbench.analytic.verdicts.confirmation_targets`) and measures that cell
and its baseline again (:func:`plan_confirmations`): the grid's own overrides of both, with ``confirmation=true``,
in every engine run the grid measured them in, each run on fresh engines (a confirmation cell's engine instance is
numbered apart from the grid's, :data:`specbench.config.CONFIRMATION_INSTANCES`, so no grid engine is reused).

``confirmation=true`` joins the cells' identity: they are stored beside the grid's cells under ids of their own,
and a rerun skips those already measured, as it skips the grid's (resume). ``confirm.json`` records which they
are. The finish merges them apart from the grid (:func:`with_confirmations`): their speedup and interval come from
the confirmation's runs alone, the grid's rows and intervals are as they were, and the chosen grid row gets the
confirmation's figures (the ``confirmation_*`` columns), which :func:`specbench.analytic.verdicts.confirmation`
judges and the verdict line words.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from specbench import methods
from specbench.analytic.verdicts import Grid, cell_name, confirmation_targets, why_not_judged
from specbench.config import Cell
from specbench.grid import PlannedCell, engine_run_order, with_values
from specbench.results.files import PLAN_FILE, write_atomic
from specbench.results.merge import merge

CONFIRM_FILE = "confirm.json"


def plan_confirmations(
    sweep_dir: Path, rows: Sequence[Mapping[str, Any]], compose: Callable[[Sequence[str]], Cell]
) -> list[PlannedCell]:
    """The confirmation run's cells in the order they run, and ``confirm.json`` written to name them.

    ``rows``: the grid merged as the finish merges it; ``compose``: the cell of a list of overrides (as the
    sweeper's jobs compose it). Per chosen cell, its baseline and itself in each engine run of the plan, with
    the grid's overrides and ``confirmation=true``; within an engine run the order is the grid's
    (:func:`specbench.grid.engine_run_order`: odd runs measure the speculative cells first).
    """
    plan = json.loads((sweep_dir / PLAN_FILE).read_text())
    grid = Grid.of(rows, [entry["cell_id"] for entry in plan])
    entries_of: dict[str, list[Mapping[str, Any]]] = {}
    for entry in plan:
        if (name := cell_name(entry["cell_id"])) is not None:
            entries_of.setdefault(name.config_hash, []).append(entry)
    by_run: dict[int, tuple[list[PlannedCell], list[PlannedCell]]] = {}
    confirms: dict[str, str] = {}
    for top in confirmation_targets(rows, grid):
        base = cell_name(str(top.get("baseline_cell_id") or ""))
        if base is None:
            continue
        for side, config_hash in ((0, base.config_hash), (1, str(top.get("config_hash")))):
            for entry in entries_of.get(config_hash, []):
                overrides = with_values(entry["overrides"], confirmation="true")
                cell = compose(overrides)
                by_run.setdefault(cell.engine_run, ([], []))[side].append(PlannedCell(overrides, cell))
                if side:
                    confirms[cell.cell_id] = str(top["cell_id"])
    planned: list[PlannedCell] = []
    seen: set[str] = set()
    for run in sorted(by_run):
        baselines, speculative = by_run[run]
        for p in engine_run_order(baselines, speculative, run):
            if p.cell.cell_id not in seen:  # two chosen cells may share a baseline
                seen.add(p.cell.cell_id)
                planned.append(p)
    listing = [{"cell_id": p.cell.cell_id, "overrides": list(p.overrides), "confirms": confirms.get(p.cell.cell_id)}
               for p in planned]
    text = (json.dumps(listing, indent=1) + "\n").encode()
    write_atomic(sweep_dir / CONFIRM_FILE, lambda f: f.write(text))
    return planned


def describe(planned: Sequence[PlannedCell], todo: Sequence[PlannedCell]) -> str:
    """The confirmation run as the terminal shows it before its first engine."""
    chosen = list(dict.fromkeys(
        f"{methods.label(p.cell.config['method'], p.cell.k)} at batch {p.cell.batch_size} on "
        f"{p.cell.workload['name']}" + (f" T={p.cell.sampling.temperature:g}" if not p.cell.sampling.greedy else "")
        for p in planned if not p.cell.is_baseline))
    if not chosen:
        return "confirm=true: no verdict named a configuration to measure again"
    skipped = len(planned) - len(todo)
    return (f"confirming on fresh engines what the verdicts chose: {'; '.join(chosen)}, with their baselines: "
            f"{len(planned)} cells, {len(todo)} to run" + (f", {skipped} already measured" if skipped else ""))


def set_aside(sweep_dir: Path) -> str | None:
    """A sweep run without ``confirm=true``: an earlier run's ``confirm.json`` is removed, and a line says so.

    It named what that run's verdicts chose then; the finish would attach its figures to this run's rows as if
    this run had asked for them (:func:`with_confirmations`), over a grid that may have changed since. Its cells
    stay in ``cells/``: a run with ``confirm=true`` plans the confirmation again and keeps those it still needs.
    None where there was none.
    """
    path = sweep_dir / CONFIRM_FILE
    if not path.is_file():
        return None
    path.unlink()
    return (f"confirm=false: the confirmation an earlier run measured ({path.name}) is left out of these results; "
            "its cells stay, and a run with confirm=true measures again only what it still needs")


def with_confirmations(
    rows: Sequence[dict[str, Any]], sweep_dir: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The grid's rows with each chosen row's ``confirmation_*`` columns, and the confirmation's own merged rows.

    The confirmation cells (``confirm.json``) are merged on their own: their speedups, intervals and flags come
    from the confirmation's runs alone, and the grid's rows are not merged with them. A chosen cell whose
    confirmation was never measured says so. Without ``confirm.json`` (confirm=false), the rows as they were.
    """
    path = sweep_dir / CONFIRM_FILE
    if not path.is_file():
        return list(rows), []
    entries = json.loads(path.read_text())
    confirmed = merge(sweep_dir / "cells", [entry["cell_id"] for entry in entries])
    by_hash = {r.get("config_hash"): r for r in confirmed}
    columns: dict[str, dict[str, Any]] = {}
    for entry in entries:
        name = cell_name(entry["cell_id"])
        if not entry.get("confirms") or name is None or entry["confirms"] in columns:
            continue
        found = by_hash.get(name.config_hash)
        if found is None:
            columns[entry["confirms"]] = {"confirmation_cell_id": entry["cell_id"],
                                          "confirmation_not_judged": "never measured"}
            continue
        columns[entry["confirms"]] = {
            "confirmation_cell_id": found["cell_id"],
            "confirmation_speedup": found.get("speedup"),
            "confirmation_ci_low": found.get("speedup_ci_low"),
            "confirmation_ci_high": found.get("speedup_ci_high"),
            "confirmation_not_judged": why_not_judged(found),
        }
    return [row | columns.get(row.get("cell_id"), {}) for row in rows], confirmed
