"""The report's numbers: the results frame, and every table and sentence the page shows.

:func:`load_frame` reads ``results.parquet`` into a DataFrame and adds the
labels that plots and tables share (:data:`PANEL`, :data:`CONFIG`), so a cell
is grouped and named the same way everywhere on the page. Everything else
here turns that frame into plain data (dataclasses, strings, numbers) for the
template; nothing here draws or renders HTML. What pays, up to where, the best
configuration, break-even and the K schedule are decided in
:mod:`specbench.analytic.verdicts`, over the grid as planned (:class:`Grid`);
this module words those decisions and decides nothing itself.

Reads Parquet only: no vLLM, no Hydra, so a report can be rebuilt on a laptop.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specbench import methods
from specbench.analytic import recommend, verdicts
from specbench.analytic.verdicts import Grid
from specbench.results.schema import (
    COLUMNS,
    exactness_kind,
    method_label,
    method_variant,
    recommendable,
    row_config,
)
from specbench.stats.distributions import student_t_quantile_real
from specbench.stats.intervals import is_interval

PANEL = "panel"
"""Derived column: the workload, prefixed by the model when a file holds several models."""
CONFIG = "method_label"
"""The cell's method, its own keys and K (``"controlled alpha=0.6 K=4"``): every series, row and
chooser of the page groups on it, so variants of one method stay apart."""
VARIANT = "method_variant"
"""Derived column: :data:`CONFIG` without K (``"controlled alpha=0.6"``): a colour, a memory row,
a family of curves over K."""
PREDICTED = "predicted_speedup"
"""The analytic model's wall-time speedup column: null on every row of a sweep without a hardware profile."""
PREDICTED_DECODE = "predicted_decode_speedup"
"""The analytic model's decode speedup column (first to last token), beside the measured ``decode_speedup``."""


FLAGGED = "flagged"
"""Boolean column marking cells whose speedup needs care; absent from files of older schemas."""
NO_MODEL = "n/a: no model columns"


def has_predictions(df: pd.DataFrame) -> bool:
    """Whether any row carries the analytic model's predicted speedup (none without a hardware profile)."""
    return PREDICTED in df.columns and bool(df[PREDICTED].notna().any())


def load_frame(path: Path) -> tuple[pd.DataFrame, list[str]]:
    """Read a results file; return the frame with derived columns and the schema columns it lacked.

    Integer and boolean columns keep their nulls (pandas ``Int64`` and
    ``boolean``), because a failed cell can lack even its method and batch size.
    Missing schema columns are added as nulls so an older file still renders;
    its ``method_label`` is made from each row's config
    (:func:`specbench.results.schema.method_label`).
    """
    table = pq.read_table(path)
    nullable = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
    df = table.to_pandas(types_mapper=nullable.get)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:  # at once: a column at a time fragments the frame, and pandas warns on the terminal per column
        df = pd.concat([df, pd.DataFrame({c: pd.Series([None] * len(df), dtype=object, index=df.index)
                                          for c in missing})], axis=1)
    several_models = df["model"].dropna().nunique() > 1
    # A sampled cell's temperature is part of its panel: curves at another temperature are
    # other curves (results.schema.curve_key), and no figure or verdict may pool them.
    temperatures = df["temperature"] if "temperature" in df else pd.Series([None] * len(df))
    df[PANEL] = [
        _panel(model, workload, several_models) + (f" · T={t:g}" if not pd.isna(t) and t > 0 else "")
        for model, workload, t in zip(df["model"], df["workload"], temperatures)
    ]
    rows = records(df)
    df[CONFIG] = [method_label(r) or "?" for r in rows]
    df[VARIANT] = [method_variant(r) or "?" for r in rows]
    return df, missing


def _panel(model: Any, workload: Any, several_models: bool) -> str:
    workload = "?" if pd.isna(workload) else str(workload)
    return f"{model} · {workload}" if several_models and not pd.isna(model) else workload


# --- row selections -------------------------------------------------------------------------------


def failed_mask(df: pd.DataFrame) -> pd.Series:
    """Cells that failed, as ``sweep.finish`` counts them: not ok, or speculative without a speedup."""
    speculative = df["method"].fillna("") != "baseline"
    # A serving cell's speedups are its own (serving_speedup_*; it has no offline speedup).
    compared = df["serving_speedup_e2e_p50"].where(df["load_request_rate"].notna(), df["speedup"]) \
        if "load_request_rate" in df and "serving_speedup_e2e_p50" in df else df["speedup"]
    return (df["status"].fillna("") != "ok") | (speculative & compared.isna())


def measured(df: pd.DataFrame) -> pd.DataFrame:
    """Cells that ran to the end (status ok), baselines included."""
    return df[df["status"].fillna("") == "ok"]


def speculative(df: pd.DataFrame) -> pd.DataFrame:
    """Speculative cells that ran to the end, compared with a baseline or not."""
    ok = measured(df)
    return ok[ok["method"] != "baseline"]


def compared(df: pd.DataFrame) -> pd.DataFrame:
    """Speculative cells with a measured speedup over their baseline."""
    spec = speculative(df)
    return spec[spec["speedup"].notna()]


_NUMPY_NUMBERS = (np.integer, np.floating, np.bool_)


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The frame's rows as plain dicts, nulls as None: what the shared rules of
    :mod:`specbench.analytic.recommend` and :mod:`specbench.analytic.prediction` read."""
    # One conversion of the whole frame to objects, nulls as None, rather than ``astype(object)`` and ``where``
    # column by column: those cost about a tenth of a second on a results frame of some 240 columns, and the page
    # asks for records of its panels' frames a few hundred times. Numpy scalars left in object columns become
    # Python numbers, as ``to_dict`` makes them.
    values = df.to_numpy(dtype=object, na_value=None)
    names = list(df.columns)
    return [dict(zip(names, [v.item() if isinstance(v, _NUMPY_NUMBERS) else v for v in row])) for row in values]


def eligible(df: pd.DataFrame) -> pd.DataFrame:
    """Compared cells fit to be judged, by the one eligibility rule of every decision on the page.

    :func:`specbench.results.recommendable`: outputs that do not mismatch the
    baseline's (numerical ties allowed), not flagged; caveats exclude nothing.
    """
    comp = compared(df)
    return comp[pd.Series([recommendable(r) for r in records(comp)], index=comp.index, dtype=bool)]


def grid_of(df: pd.DataFrame, plan: Sequence[str] | None = None) -> Grid:
    """The planned grid of a results frame (:meth:`specbench.analytic.verdicts.Grid.of`), with its sweep's plan."""
    return Grid.of(records(df), plan)


def best_of(df: pd.DataFrame) -> dict[str, Any] | None:
    """The cell :func:`specbench.analytic.verdicts.best_row` names among ``df``'s rows, as a record; None if none.

    The one chooser of the page (verdicts, best configuration, memory table),
    the one the K schedule uses: the fastest eligible cell that pays, else the
    fastest eligible cell.
    """
    chosen = verdicts.best_row(records(df))
    return None if chosen is None else dict(chosen[0])


def cell_caveats(row: Mapping[str, Any]) -> list[str]:
    """What qualifies a cell's speedup without excluding it (the merge's ``caveats``: looping
    outputs, numerical ties, a batch run in waves)."""
    return [str(c) for c in _items(row.get("caveats"))]


def simultaneous_ci(row: Mapping[str, Any], cells: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """A speedup interval that holds for all ``cells`` compared cells at once (Bonferroni); None without its inputs.

    ``exp(log speedup ± t · speedup_log_sd / sqrt(engine_runs))`` with t the
    Student quantile at ``1 - (1 - confidence) / (2 · cells)`` on
    ``speedup_df`` degrees of freedom: the per-cell interval's construction
    (:func:`specbench.stats.intervals.speedup_interval`) at the confidence that leaves
    every one of the cells covered together with the stated probability.
    """
    speedup, sd, dof, runs = (row.get(c) for c in ("speedup", "speedup_log_sd", "speedup_df", "engine_runs"))
    if speedup is None or sd is None or dof is None or runs is None or cells < 1:
        return None
    if speedup <= 0 or float(dof) < 1 or int(runs) < 1:
        return None
    half = student_t_quantile_real(1.0 - (1.0 - confidence) / (2 * cells), float(dof)) * sd / math.sqrt(int(runs))
    return speedup * math.exp(-half), speedup * math.exp(half)


def _items(value: Any) -> list[Any]:
    """A list column's items; [] for a null (pyarrow gives lists as numpy arrays, nulls as None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    return list(value)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values([PANEL, "method", VARIANT, "num_speculative_tokens", "batch_size"], na_position="last")


# --- formatting -----------------------------------------------------------------------------------


def fmt_speedup(value: Any) -> str:
    """``"1.80×"``, or ``"–"`` when unknown."""
    return "–" if value is None or pd.isna(value) else f"{value:.2f}×"


def fmt_ci(low: Any, high: Any) -> str:
    """``"[1.50, 2.10]"``, or ``"–"`` when either end is unknown."""
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return "–"
    return f"[{low:.2f}, {high:.2f}]"


def fmt_number(value: Any, digits: int = 2) -> str:
    """A number to ``digits`` decimal places, ``"–"`` when unknown."""
    return "–" if value is None or pd.isna(value) else f"{float(value):.{digits}f}"


def _batch(value: Any) -> str:
    return "?" if pd.isna(value) else str(int(value))


# --- summary --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """The page's opening lines."""

    cells: int
    failed: int
    best: str | None  # best speedup overall, with its config
    verdicts: list[str]  # one line per panel
    missing: list[str]  # every missing piece, stated once


def summary(df: pd.DataFrame, missing_columns: Sequence[str], grid: Grid | None = None) -> Summary:
    """Counts, the best speedup overall, a verdict per workload and the missing pieces.

    The best speedup and the verdicts judge only eligible cells
    (:func:`eligible`), choose with :func:`best_of` (the K schedule's
    chooser) and call a cell paying by :func:`specbench.analytic.verdicts.pays`;
    the verdicts walk the planned grid (``grid``, by default the one the rows
    imply: :func:`specbench.analytic.verdicts.verdict`).
    The best speedup is chosen from every eligible cell of the sweep
    (:func:`specbench.analytic.verdicts.best_overall`), so beside its own
    interval stands the one over all of them at once, named as such: a
    verdict chooses among the configurations of one workload at one batch
    size, and its simultaneous bound is over those.
    """
    grid = grid or grid_of(df)
    overall = verdicts.best_overall(records(eligible(df)))
    best = None
    if overall is not None:
        top = overall.top
        best = (
            f"{fmt_speedup(top['speedup'])} ({_ci_phrase(top)}{_overall_clause(overall)}) with {top[CONFIG]} "
            f"at batch {_batch(top['batch_size'])} on {top[PANEL]}{_caveat_clause(top)}"
        )
    panels = sorted(p for p in df.loc[df["workload"].notna(), PANEL].unique())
    return Summary(
        cells=len(df),
        failed=int(failed_mask(df).sum()),
        best=best,
        verdicts=[verdict(df[df[PANEL] == p], p, grid) for p in panels],
        missing=missing_pieces(df, missing_columns),
    )


def _ci_phrase(row: Mapping[str, Any]) -> str:
    """``"CI [1.50, 2.10]"``, or ``"no interval"`` for a cell without one (never a zero-width interval); an
    interval of one engine run's repetitions says that it leaves out the engine-to-engine spread."""
    if not verdicts.has_interval(row):
        return "no interval"
    if verdicts.within_engine_only(row):
        return (f"within-engine CI {fmt_ci(row['speedup_ci_low'], row['speedup_ci_high'])}, one engine run: "
                "it leaves out the engine-to-engine spread")
    return f"CI {fmt_ci(row['speedup_ci_low'], row['speedup_ci_high'])}"


def _overall_clause(overall: verdicts.Overall) -> str:
    """``"; the largest of 16 judged cells: over all 16 at once [1.32, 2.85], above 1× even so"``, or nothing
    for a cell chosen from one or without the interval's ingredients."""
    if overall.candidates <= 1 or overall.interval is None:
        return ""
    n = overall.candidates
    outcome = ("above 1× even as the best of them" if overall.pays else
               "not shown above 1× as the best of them all (each workload's verdict chooses among the "
               "configurations at one batch size, and judges over those)")
    return f"; the largest of {n} judged cells: over all {n} at once {fmt_ci(*overall.interval)}, {outcome}"


def _caveat_clause(row: Mapping[str, Any]) -> str:
    """``"; caveat: ..."`` with the cell's caveats (:func:`cell_caveats`), or nothing."""
    caveats = cell_caveats(row)
    if not caveats:
        return ""
    return f"; caveat{'s' if len(caveats) > 1 else ''}: " + "; ".join(caveats)


def _left_out(out: Sequence[Mapping[str, Any]]) -> str:
    """``" (2 cell(s) left out: 1 with mismatched outputs, 1 flagged)"``, or nothing."""
    if not out:
        return ""
    mismatched = sum(exactness_kind(r) == "mismatch" for r in out)
    why = [f"{mismatched} with mismatched outputs"] if mismatched else []
    # A real mismatch is flagged too: counted once, as a mismatch.
    if len(out) > mismatched:
        why.append(f"{len(out) - mismatched} flagged")
    return f" ({len(out)} cell(s) left out: {', '.join(why)})"


def verdict(panel_rows: pd.DataFrame, panel: str, grid: Grid | None = None) -> str:
    """One line on whether speculation pays on one workload, and up to which batch size.

    ``panel_rows`` are the workload's cells, any status; the decision is
    :func:`specbench.analytic.verdicts.verdict`'s, over the planned grid: the
    cell :func:`best_of` names at the smallest planned batch size, up to which
    batch size its configuration pays (:func:`specbench.analytic.verdicts.pays`:
    the rule of the K schedule), with its interval and its caveats, and the
    first planned batch size not judged, named with why; nothing past it is
    claimed. Compared cells left out are counted by why. A cell without an
    interval, or whose interval includes 1×, is said to be so.
    """
    decided = verdicts.verdict(records(panel_rows), grid or grid_of(panel_rows))
    left_out = _left_out(decided.left_out)
    if decided.start_stop is not None:
        return f"{panel}: no verdict: {decided.start_stop.text()}{left_out}"
    top = decided.top
    if top is None:
        if left_out:
            return f"{panel}: no verdict: every compared cell is left out{left_out}"
        return f"{panel}: no speedup measured (no speculative cell was compared with a baseline)"
    smallest = decided.start
    label, speed, ci = top[CONFIG], fmt_speedup(top["speedup"]), _ci_phrase(top)
    no_interval = "" if verdicts.has_interval(top) else (
        "; no interval (one engine run of one repetition): judged on its point estimate, so noise is not ruled out"
    )
    if not decided.pays:
        rivals = _rivals(decided)
        bound = verdicts.simultaneous_lower_bound(top, rivals)
        again = _confirmation_clause(decided)
        if verdicts.pays(top) and bound <= 1.0:
            return (f"{panel}: nothing is shown to pay at batch {smallest}: the fastest of {rivals} configurations, "
                    f"{label} ({speed}, {ci}), has a lower bound of {bound:.2f} over the {rivals} at once "
                    f"(the best of several is judged as one of them){again}{left_out}")
        if verdicts.has_interval(top) and top["speedup_ci_high"] > 1.0:
            return (f"{panel}: nothing is shown to pay at batch {smallest}: the fastest, {label} ({speed}), "
                    f"has {ci}, which includes 1×{again}{left_out}")
        return (f"{panel}: nothing beats plain decoding at batch {smallest} "
                f"(fastest: {label}, {speed}, {ci}){again}{left_out}")
    assert decided.reach is not None  # a paying verdict has walked its reach
    return (f"{panel}: {label} {_reach(decided)}{no_interval}{_walk_caveats(decided)}{_confirmation_clause(decided)}"
            f"{left_out}")


def _confirmation_clause(decided: verdicts.Verdict) -> str:
    """``"; confirmed on fresh engines: 1.90× [1.70, 2.10]"``: the verdict's chosen cell measured again with
    its baseline on fresh engines (confirm=true), judged on those runs alone
    (:func:`specbench.analytic.verdicts.confirmation`); nothing where it was not measured again. A verdict that
    pays is confirmed or not; one that does not pay is told whether the fresh runs pay."""
    found = None if decided.top is None else verdicts.confirmation(decided.top)
    if found is None:
        return ""
    if found.why_not is not None:
        return f"; not confirmed: its confirmation on fresh engines cannot judge ({found.why_not})"
    interval = fmt_ci(found.ci_low, found.ci_high) if is_interval(found.ci_low, found.ci_high) else "(no interval)"
    measured = f"{fmt_speedup(found.speedup)} {interval}"
    if decided.pays:
        return f"; {'confirmed' if found.pays else 'not confirmed'} on fresh engines: {measured}"
    return f"; measured again on fresh engines it {'pays' if found.pays else 'does not pay either'}: {measured}"


def _walk_caveats(decided: verdicts.Verdict) -> str:
    """``"; caveats: X (batch 1, 4); Y (batch 16)"``: the caveats of every cell the verdict's walk reached
    (:attr:`specbench.analytic.verdicts.Verdict.caveats`), each with its batch sizes where the walk reached
    more than one; nothing without any."""
    gathered = decided.caveats
    if not gathered:
        return ""
    several = len({b for _, batches in gathered for b in batches}) > 1 or (
        decided.reach is not None and len(decided.reach.reached) > 1) or decided.per_batch is not None
    texts = [caveat + (f" (batch {', '.join(str(b) for b in batches)})" if several and batches else "")
             for caveat, batches in gathered]
    return f"; caveat{'s' if len(texts) > 1 else ''}: " + "; ".join(texts)


def _reach(decided: verdicts.Verdict) -> str:
    """How far the verdict's paying configuration pays, in words, and where choosing per batch size takes it."""
    walked = decided.reach
    assert walked is not None
    top, reached = walked.top, walked.reached
    stop = ""
    if walked.stop is not None:
        stop = f"; {walked.stop.text()}"
    elif walked.loss is not None:
        row = walked.loss
        stop = f", not at batch {int(row['batch_size'])} ({fmt_speedup(row['speedup'])}, {_ci_phrase(row)})"
    evidence = f"{fmt_speedup(top['speedup'])}, {_ci_phrase(top)}"
    rivals = _rivals(decided)
    bound = verdicts.simultaneous_lower_bound(top, rivals)
    if bound != verdicts.lower_bound(top):  # chosen from several, with the ingredients to widen its interval
        evidence += f"; simultaneous lower bound {bound:.2f} over {rivals} configurations"
    if len(walked.planned) == 1:
        text = f"pays at batch {reached[0]}, the only batch size measured ({evidence})"
    elif len(reached) == 1:
        text = f"pays at batch {reached[0]} ({evidence}){stop}"
    elif len(reached) == len(walked.planned):
        text = f"pays at every measured batch size, up to {reached[-1]} ({evidence} at batch {reached[0]})"
    else:
        text = f"pays up to batch {reached[-1]} ({evidence} at batch {reached[0]}){stop}"
    if decided.per_batch is not None:
        text += f"; choosing the configuration per batch size, speculation pays up to batch {decided.per_batch}"
        if decided.per_batch_stop is not None:
            text += f" ({decided.per_batch_stop.text()})"
    return text


def _rivals(decided: verdicts.Verdict) -> int:
    """How many judged configurations the verdict's cell was chosen from, at its batch size."""
    top = decided.top
    assert top is not None
    return sum(int(r["batch_size"]) == int(top["batch_size"]) for r in decided.judged)


def missing_pieces(df: pd.DataFrame, missing_columns: Sequence[str]) -> list[str]:
    """Sentences naming what this results file cannot show, and why."""
    if df.empty:
        return ["The results file holds no cells: nothing was measured."]
    notes = []
    ok = measured(df)
    has_baseline = bool((ok["method"] == "baseline").any())
    if ok.empty:
        notes.append("Every cell failed: nothing was measured (see Failed cells).")
    elif not has_baseline:
        notes.append("No baseline measured: speedups unavailable.")
    if not ok.empty and speculative(df).empty:
        notes.append("No speculative cell ran to the end: there is nothing to compare with plain decoding.")
    uncompared = int(speculative(df)["speedup"].isna().sum())
    if uncompared and has_baseline:
        notes.append(
            f"{uncompared} speculative cell(s) have no baseline comparison: their speedups are unavailable."
        )
    if not has_predictions(df):
        notes.append(
            "No model columns (predicted_speedup) with values in this results file: the model's predicted "
            "speedup curves and predicted break-even batch sizes are not shown."
        )
    if missing_columns:
        notes.append(
            "Columns missing from this results file (an older schema?), shown as unknown: "
            + ", ".join(missing_columns)
            + "."
        )
    batches = compared(df)["batch_size"].dropna().unique()
    if len(batches) == 1:
        notes.append(
            f"Only batch size {int(batches[0])} was compared: break-even batch sizes cannot be interpolated."
        )
    return notes


# --- best configuration, break-even, schedule -----------------------------------------------------


@dataclass(frozen=True)
class BestConfig:
    """The configuration :func:`best_of` names for one workload at one batch size."""

    panel: str
    batch_size: int
    config: str
    speedup: str
    ci: str
    simultaneous: str  # the interval over every compared cell of the workload at once (winner's curse)
    confirmation: str  # the speedup re-measured on fresh engines, where the results carry it
    decode_speedup: str
    ci_side: str  # "above" or "below" when the whole CI lies on one side of 1×, else ""
    caveats: str


CONFIRMATION = "confirmation_speedup"
"""The best configurations' speedup re-measured at the end of a sweep, where the results carry it."""


def spread_note(df: pd.DataFrame) -> str | None:
    """How the speedup intervals' degrees of freedom were counted, and the engine-to-engine spread behind them;
    None for results written before it was measured (schema 11 and older) or without a pooled spread."""
    if "baseline_engine_log_sd" not in df.columns or "speedup_df" not in df.columns:
        return None
    pooled = df[df.get("speedup_ci_method", pd.Series(dtype=str)).astype(str).str.startswith("pooled")]
    if pooled.empty:
        return None
    first = pooled.iloc[0]
    note = (f"Speedup intervals: {first['speedup_df']:.1f} degrees of freedom, counted in independent engines (one "
            "engine serves every workload, batch size and temperature of its configuration in an engine run, so "
            "its cells share its deviations). The baseline engine's own spread is estimated, not assumed equal "
            "to a speculative engine's (Satterthwaite's degrees of freedom)")
    base, spec = first.get("baseline_engine_log_sd"), first.get("speculative_engine_log_sd")
    if base is None or spec is None or pd.isna(base) or pd.isna(spec):
        return note + ": with one speculative configuration per baseline the two cannot be told apart here."
    return note + f": sd of log speed {base:.3f} for the baseline engine, {spec:.3f} for a speculative one."


def engine_identity_note(df: pd.DataFrame) -> str | None:
    """The caveat on cells stored before schema 14, which record no engine instance (``engine_id``); None
    when every measured cell names its engines.

    Their engines are inferred from their configs and engine runs
    (:func:`specbench.results.schema.engine_instance`), which cannot tell apart grids merged into one
    directory or cells measured again on fresh engines: the spread, its degrees of freedom and the
    shifted-baseline flags may lump engines that were not one.
    """
    measured = df[df["status"] == "ok"] if "status" in df.columns else df
    inferred = int(measured["engine_id"].isna().sum()) if "engine_id" in measured.columns else len(measured)
    if not inferred:
        return None
    return (f"Engine identity inferred for {inferred} cell(s) stored before schema 14: they record no engine "
            "instance, so the engines they shared are inferred from their configs and engine runs, which cannot "
            "tell apart two grids merged into one directory or cells measured again; their intervals and "
            "shifted-baseline flags may treat separate engines as one.")


def has_confirmation(df: pd.DataFrame) -> bool:
    """Whether the results carry confirmation speedups (:data:`CONFIRMATION`) to show beside the selected ones."""
    return CONFIRMATION in df.columns and bool(df[CONFIRMATION].notna().any())


def best_configs(df: pd.DataFrame, grid: Grid | None = None) -> list[BestConfig]:
    """Per workload and planned batch size, the configuration :func:`best_of` names among the eligible cells.

    The fastest that pays, which is the K the schedule picks there, else the
    fastest (:func:`specbench.analytic.verdicts.best_configs`); a planned
    batch size without a judged cell gets a row saying why. Each comes with
    its simultaneous interval over the m cells compared on its workload
    (:func:`simultaneous_ci`): the best of m noisy cells is biased upward,
    and its own interval does not allow for having been picked.
    """
    grid = grid or grid_of(df)
    out = []
    for panel in sorted(df.loc[df["workload"].notna(), PANEL].unique()):
        for at in verdicts.best_configs(records(df[df[PANEL] == panel]), grid):
            if at.top is None:
                out.append(BestConfig(panel=str(panel), batch_size=at.batch, config="–", speedup="–", ci="–",
                                      simultaneous="–", confirmation="–", decode_speedup="–", ci_side="",
                                      caveats=f"not judged ({at.why})"))
                continue
            best = _best_config(str(panel), at.batch, dict(at.top), at.cells)
            if at.passed_over:
                # The choice was made without them: K=2 "best" at a batch size where K=4 failed is no win over K=4.
                without = "chosen without " + "; ".join(f"{label} (not judged: {why})" for label, why in at.passed_over)
                best = replace(best, caveats="; ".join(c for c in (best.caveats, without) if c))
            out.append(best)
    return out


def _best_config(panel: str, batch: int, top: Mapping[str, Any], cells: int) -> BestConfig:
    """One row of the best-configuration table: the chosen cell, its intervals (own and over ``cells``), caveats."""
    simultaneous = simultaneous_ci(top, cells)
    return BestConfig(
        panel=panel,
        batch_size=batch,
        config=str(top[CONFIG]),
        speedup=fmt_speedup(top["speedup"]),
        ci=fmt_ci(top["speedup_ci_low"], top["speedup_ci_high"]),
        simultaneous="–" if simultaneous is None else f"{fmt_ci(*simultaneous)} over {cells} cells",
        confirmation=fmt_speedup(top.get(CONFIRMATION)),
        decode_speedup=fmt_speedup(top["decode_speedup"]),
        ci_side=_ci_side(top["speedup_ci_low"], top["speedup_ci_high"]),
        caveats="; ".join((["within-engine CI, one engine run: it leaves out the engine-to-engine spread"]
                           if verdicts.within_engine_only(top) else []) + cell_caveats(top)),
    )


def _ci_side(low: Any, high: Any) -> str:
    if not pd.isna(low) and low > 1.0:
        return "above"
    if not pd.isna(high) and high < 1.0:
        return "below"
    return ""


@dataclass(frozen=True)
class BreakEven:
    """Where one configuration's speedup falls below 1×, measured and predicted."""

    panel: str
    config: str
    batch_sizes: str
    measured: str
    predicted: str


def _crossing(value: float | str | None, batches: Sequence[int], speedups: Sequence[float | None],
              stop: verdicts.Stop | None = None, bracket: tuple[int | None, int | None] | None = None) -> str:
    """A break-even batch size from :func:`specbench.analytic.prediction.break_even`, in words; ``stop``: the
    first planned batch size not judged, past which no crossing is sought; ``bracket``: where the intervals put
    it (:func:`specbench.analytic.verdicts.break_even_bracket`), for a measured crossing."""
    past = "" if stop is None else f"; {stop.text()}"
    if not batches and stop is not None:
        return f"not sought: {stop.text()}"
    if isinstance(value, str) or not batches:
        return f"n/a: a batch size has no value{past}"
    # A predicted crossing has no intervals: it comes without a bracket, as the model's point.
    pays_through, below_from = bracket if bracket is not None else (batches[-1], batches[0])
    if value is None:
        shown = "" if pays_through == batches[-1] else (
            f" (by the intervals: shown to pay only through batch {pays_through})" if pays_through is not None
            else f" (by the intervals: not shown to pay at batch {batches[0]})")
        return f"not reached: ≥1× through batch {batches[-1]}{shown}{past}"
    first = speedups[0]
    if first is not None and first < 1.0:
        shown = "" if below_from == batches[0] else f" (by the intervals: not shown below 1× at batch {batches[0]})"
        return f"below 1× from batch {batches[0]}, the smallest measured{shown}"
    return f"{value:.1f}" + ("" if bracket is None else _bracket(pays_through, below_from, batches))


def _bracket(pays_through: int | None, below_from: int | None, batches: Sequence[int]) -> str:
    """`` (by the intervals: between batch 4, shown to pay, and 16, shown below 1×)``: where the cells' intervals
    put an interpolated crossing (:func:`specbench.analytic.verdicts.break_even_bracket`)."""
    low = f"batch {pays_through}, shown to pay" if pays_through is not None else \
        f"batch {batches[0]}, not shown to pay"
    high = f"{below_from}, shown below 1×" if below_from is not None else f"past {batches[-1]}, none shown below 1×"
    return f" (by the intervals: between {low}, and {high})"


def break_even(df: pd.DataFrame, grid: Grid | None = None) -> list[BreakEven]:
    """Measured (and, with model columns, predicted) break-even batch size per curve.

    The crossings are :func:`specbench.analytic.verdicts.break_evens`': the
    measured one along the curve's planned batch sizes up to the first not
    judged, by :func:`specbench.analytic.prediction.break_even`'s rule (the one
    ``python -m specbench.analytic.prediction`` prints).
    """
    panel_of = dict(zip(df["cell_id"], df[PANEL]))
    label_of = dict(zip(df["cell_id"], df[CONFIG]))
    out = []
    for curve in verdicts.break_evens(records(df), grid or grid_of(df)):
        first = curve.rows[0]
        predicted = NO_MODEL
        if any(v is not None for v in curve.predicted_speedups):
            predicted = _crossing(curve.predicted, curve.predicted_sizes, curve.predicted_speedups)
        out.append(
            BreakEven(
                panel=str(panel_of[first["cell_id"]]),
                config=str(label_of[first["cell_id"]]),
                batch_sizes=", ".join(str(b) for b in curve.predicted_sizes),
                measured=_crossing(curve.measured, curve.batch_sizes, curve.speedups, curve.stop,
                                   (curve.pays_through, curve.below_from))
                + (f"; {recommend.caveats_text(curve.caveats)}" if curve.caveats else ""),
                predicted=predicted,
            )
        )
    return sorted(out, key=lambda b: (b.panel, b.config))


@dataclass(frozen=True)
class Schedule:
    """A recommended K-by-batch-size schedule for one method on one workload."""

    panel: str
    method: str
    best_k: dict[int, int]  # batch size -> best K (0: nothing clearly beats 1×)
    json: str | None  # speculative_config fragment; None when speculation never pays
    checked: str | None = None  # the schedule measured in this sweep (its label), if one was
    comparisons: tuple[recommend.Comparison, ...] = ()  # it against the fixed Ks, per batch size
    fixed_ks: tuple[int, ...] = ()  # the fixed Ks of the comparison's columns
    stop: str | None = None  # the first planned batch size without a judged cell, where the schedule ends
    caveats: str = ""  # what qualifies the cells the schedule stands on (recommend.Recommendation.caveats_text)


def schedules(df: pd.DataFrame, grid: Grid | None = None) -> list[Schedule]:
    """The K schedules of :func:`specbench.analytic.recommend.recommend`, the ones ``python -m specbench.analytic.recommend`` prints.

    Per method and workload, from the cells fit to be recommended: the K with
    the highest speedup among those whose interval clears 1× at each planned
    batch size, K = 0 where none does, up to the first planned batch size
    without a judged cell (K = 0 there, nothing claimed past it).
    """
    several_models = df["model"].dropna().nunique() > 1
    out = [
        Schedule(
            # The panel as the page's other sections name it: a sampled family's temperature is in it.
            panel=_panel(rec.model, rec.workload, several_models) + (
                f" · T={rec.temperature:g}" if rec.temperature else ""),
            method=rec.variant,
            best_k={batch: k for batch, (k, _) in rec.best.items()},
            json=rec.speculative_config_json() if rec.max_k else None,
            checked=f"K=[{methods.schedule_text(rec.checked_schedule)}]" if rec.checked_schedule else None,
            comparisons=tuple(recommend.comparisons(rec)),
            fixed_ks=tuple(sorted({k for c in recommend.comparisons(rec) for k in c.fixed})),
            stop=None if rec.stop is None else f"{rec.stop.text()}: K=0 from batch {rec.stop.at:g} on (no evidence)",
            caveats=rec.caveats_text(),
        )
        for rec in recommend.recommend(records(df), grid=grid or grid_of(df))
    ]
    return sorted(out, key=lambda s: (s.panel, s.method))


# --- exactness, flagged, failed -------------------------------------------------------------------


@dataclass(frozen=True)
class CellLine:
    """One cell in a listing table (exactness, flagged, failed)."""

    cell_id: str
    panel: str
    config: str
    batch_size: str
    detail: str


def _cell_lines(rows: pd.DataFrame, detail: Sequence[str]) -> list[CellLine]:
    return [
        CellLine(
            cell_id="?" if pd.isna(r["cell_id"]) else str(r["cell_id"]),
            panel=str(r[PANEL]),
            config=str(r[CONFIG]),
            batch_size=_batch(r["batch_size"]),
            detail=d,
        )
        for (_, r), d in zip(rows.iterrows(), detail)
    ]


@dataclass(frozen=True)
class Divergent:
    """A cell whose outputs differ from its reference: its requests by kind, and where each first diverged."""

    panel: str
    config: str
    batch_size: str
    kind: str  # "ties" or "mismatch"
    requests: str  # exact / tie / mismatch
    first_divergences: str
    cell_id: str


@dataclass(frozen=True)
class Exactness:
    """Greedy speculative outputs against their baselines, with numerical ties told from mismatches."""

    compared: int  # speculative cells whose exactness is known
    exact: int  # ... token for token
    ties: int  # ... that differ only at numerical ties
    mismatches: int  # ... that differ where the reference had a clear winner
    differing: list[Divergent]  # the ties and mismatch cells
    unknown: list[CellLine]
    tolerances: str  # the tie tolerances the merge used, by dtype
    control: list[str]  # plain decoding at batch B against batch 1, one sentence per baseline
    explain_ties: bool  # some request, speculative or control, diverged at a numerical tie


_DIVERGENCES_SHOWN = 6  # first divergences listed per cell; the rest are counted


def request_counts(row: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """A compared row's requests (exact, tie, mismatch); None when its exactness is unknown.

    Rows of schema 6 and older counted every differing request in
    ``mismatched_requests`` and knew no ties: all of them are mismatches.
    """
    kind, requests = exactness_kind(row), row.get("num_requests")
    if kind is None or requests is None:
        return None
    differing = row.get("differing_requests")
    if differing is None:  # an older row
        differing = row.get("mismatched_requests") or (0 if kind == "exact" else requests)
        return int(requests) - int(differing), 0, int(differing)
    return int(requests) - int(differing), int(row.get("tie_requests") or 0), int(row.get("mismatched_requests") or 0)


def _fmt_counts(counts: tuple[int, int, int] | None) -> str:
    return "–" if counts is None else " / ".join(str(c) for c in counts)


def _fmt_divergences(row: Mapping[str, Any]) -> str:
    """``"request 3 at token 51 (tie, margin 0.008 nats); ..."``: where each differing request first diverged."""
    found = _items(row.get("divergences"))
    shown = []
    for d in found[:_DIVERGENCES_SHOWN]:
        margin = d.get("margin")
        margin_text = "margin unknown" if margin is None or math.isnan(margin) else f"margin {margin:.3g} nats"
        shown.append(f"request {d.get('request')} at token {d.get('position')} ({d.get('kind')}, {margin_text})")
    if len(found) > _DIVERGENCES_SHOWN:
        shown.append(f"and {len(found) - _DIVERGENCES_SHOWN} more")
    return "; ".join(shown) if shown else "positions not recorded"


def exactness(df: pd.DataFrame) -> Exactness:
    """Every speculative cell's requests exact / tie / mismatch, the control, and cells of unknown exactness."""
    spec = _sorted(speculative(df))
    spec_rows = records(spec)
    kinds = [exactness_kind(r) for r in spec_rows]
    differing = [(r, k) for r, k in zip(spec_rows, kinds) if k in ("ties", "mismatch")]
    unknown = spec[pd.Series([k is None for k in kinds], index=spec.index, dtype=bool)]
    ok = measured(df)
    controls = records(_sorted(ok[(ok["method"] == "baseline") & ok["exactness"].notna()]))
    tolerances = sorted({(str(d), float(t)) for d, t in zip(df["dtype"], df["tie_tolerance"]) if not pd.isna(t)})
    return Exactness(
        compared=len(kinds) - len(unknown),
        exact=kinds.count("exact"),
        ties=kinds.count("ties"),
        mismatches=kinds.count("mismatch"),
        differing=[
            Divergent(
                panel=str(r[PANEL]), config=str(r[CONFIG]), batch_size=_batch(r["batch_size"]), kind=k,
                requests=_fmt_counts(request_counts(r)), first_divergences=_fmt_divergences(r),
                cell_id=str(r["cell_id"]),
            )
            for r, k in differing
        ],
        unknown=_cell_lines(
            unknown,
            [
                str(e) if not pd.isna(e) else "output tokens of the cell or its baseline were not found"
                for e in unknown["error"]
            ],
        ),
        tolerances=", ".join(f"{t:g} nats ({d})" for d, t in tolerances),
        control=[_control(r) for r in controls],
        explain_ties=any((r.get("tie_requests") or 0) > 0 for r in spec_rows + controls),
    )


def _control(row: Mapping[str, Any]) -> str:
    """How often plain decoding at a baseline's batch size disagreed with plain decoding at batch 1."""
    counts = request_counts(row)
    head = f"{row[PANEL]}: plain decoding at batch {_batch(row['batch_size'])}"
    if counts is None:
        return f"{head}: not compared with batch 1"
    exact, ties, mismatches = counts
    line = (f"{head} disagreed with batch 1 on {ties + mismatches} of {exact + ties + mismatches} requests "
            f"(ties: {ties}, mismatches: {mismatches})")
    return line + (f"; first divergences: {_fmt_divergences(row)}" if ties + mismatches else "")


@dataclass(frozen=True)
class Flagged:
    """Cells a flag leaves out of verdicts, the command that measures them again, and re-measured cells."""

    cells: list[CellLine]
    remeasure: str | None  # None when no cell is flagged
    remeasured: list[CellLine]  # every cell measured more than once because other processes disturbed it
    # Compared cells whose engine ran in another mode than their baseline's (the merge's mode_mismatch).
    mode_mismatched: list[CellLine] = field(default_factory=list)


def flagged(df: pd.DataFrame, missing_columns: Sequence[str], command: Command, run_dir: Path) -> Flagged | None:
    """Flagged cells with their reasons, the re-measuring command, and cells that took several attempts.

    None when the results file has no ``flagged`` column. The command is the
    sweep's own (:func:`reproduce_command`) into its own directory
    (``run_dir``), with ``remeasure=flagged``: it measures just the flagged
    cells again.
    """
    if FLAGGED in missing_columns:
        return None
    rows = _sorted(df[df[FLAGGED].fillna(False).astype(bool)])
    details = []
    for r in records(rows):
        reasons = [str(x) for x in _items(r["flag_reasons"])]
        why = "; ".join(reasons) if reasons else "no reason recorded"
        ci = fmt_ci(r["speedup_ci_low"], r["speedup_ci_high"])
        attempts = f"; {_attempts(r)}" if (r["attempts"] or 1) > 1 else ""
        details.append(f"{why} (speedup {fmt_speedup(r['speedup'])}, CI {ci}){attempts}")
    ok = measured(df)
    several = _sorted(ok[ok["attempts"].fillna(1).astype(int) > 1])
    remeasure = None
    if len(rows):
        remeasure = f"{command.text} {command.dir_key}={shlex.quote(str(run_dir.absolute()))} remeasure=flagged"
    modes = _sorted(ok[ok["mode_mismatch"].notna()]) if "mode_mismatch" in ok.columns else ok.iloc[:0]
    return Flagged(
        cells=_cell_lines(rows, details),
        remeasure=remeasure,
        remeasured=_cell_lines(
            several, [_attempts(r) + ("; still flagged" if r[FLAGGED] else "") for r in records(several)]
        ),
        mode_mismatched=_cell_lines(
            modes, [f"{r['mode_mismatch']} (speedup {fmt_speedup(r['speedup'])})" for r in records(modes)]
        ),
    )


def _attempts(row: Mapping[str, Any]) -> str:
    """``"3 attempts (other processes kept 39%, 41%, 35% of the cores busy; the least disturbed kept)"``."""
    shares = ", ".join(f"{s:.0%}" for s in _items(row.get("other_cpu_share_per_attempt")))
    busy = f"other processes kept {shares} of the cores busy; " if shares else ""
    return f"{int(row['attempts'])} attempts ({busy}the least disturbed kept)"


def failed(df: pd.DataFrame) -> list[CellLine]:
    """Failed cells (as ``sweep.finish`` counts them) with their errors."""
    rows = _sorted(df[failed_mask(df)])
    return _cell_lines(rows, ["no error recorded" if pd.isna(e) else str(e) for e in rows["error"]])


# --- all cells ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellSummary:
    """One row of the all-cells table."""

    panel: str
    config: str
    batch_size: str
    status: str
    speedup: str
    ci: str
    decode_speedup: str
    predicted: str
    predicted_decode: str
    acceptance_length: str
    raw_acceptance_length: str  # vLLM's own count, drafts accepted past the output's end included
    acceptance_length_p50: str
    tokens_per_pass: str
    draft_coverage: str
    repetitive: str
    requests_exact: str  # requests exact / tie / mismatch against the reference
    attempts: str
    tpot_ms: str


def all_cells(df: pd.DataFrame) -> list[CellSummary]:
    """Every cell's headline figures, sorted by workload, method, K and batch size."""
    return [
        CellSummary(
            panel=str(r[PANEL]),
            config=str(r[CONFIG]),
            batch_size=_batch(r["batch_size"]),
            status="?" if pd.isna(r["status"]) else str(r["status"]),
            speedup=fmt_speedup(r["speedup"]),
            ci=fmt_ci(r["speedup_ci_low"], r["speedup_ci_high"]),
            decode_speedup=fmt_speedup(r["decode_speedup"]),
            predicted=fmt_speedup(r[PREDICTED]),
            predicted_decode=fmt_speedup(r["predicted_decode_speedup"]),
            acceptance_length=fmt_number(r["acceptance_length"]),
            raw_acceptance_length=fmt_number(r["raw_acceptance_length"]),
            acceptance_length_p50=fmt_number(r["acceptance_length_p50"]),
            tokens_per_pass=fmt_number(r["tokens_per_pass"]),
            draft_coverage=fmt_number(r["draft_coverage"]),
            repetitive=(
                "–" if pd.isna(r["repetitive_requests"]) or pd.isna(r["num_requests"])
                else f"{int(r['repetitive_requests'])}/{int(r['num_requests'])}"
            ),
            # A baseline is compared only by the control (exactness set); older files mark every baseline exact.
            requests_exact=(
                _fmt_counts(request_counts(r)) if r["method"] != "baseline" or r["exactness"] else "–"
            ),
            attempts="–" if r["attempts"] is None else str(int(r["attempts"])),
            tpot_ms=fmt_number(None if r["tpot_s_p50"] is None else 1000 * r["tpot_s_p50"], 1),
        )
        for r in records(_sorted(df))
    ]


RAW_ACCEPTANCE_GAP = 0.02
"""Relative gap between vLLM's acceptance length and the emitted one past which a cell is noted."""


def acceptance_gaps(df: pd.DataFrame) -> list[str]:
    """Cells whose acceptance length by vLLM's counters is off the emitted one by over :data:`RAW_ACCEPTANCE_GAP`.

    vLLM counts drafts its scheduler accepted past ``max_tokens`` or a stop
    token, which never reach the output: requests that end inside a draft
    (looping ones most) inflate its count.
    """
    spec = speculative(df)
    notes = []
    for r in records(_sorted(spec)):
        emitted, raw = r["acceptance_length"], r["raw_acceptance_length"]
        if emitted is None or raw is None or emitted <= 0 or abs(raw / emitted - 1.0) <= RAW_ACCEPTANCE_GAP:
            continue
        notes.append(
            f"{r[PANEL]}, {r[CONFIG]}, batch {_batch(r['batch_size'])}: acceptance length {emitted:.2f} on emitted "
            f"tokens, {raw:.2f} by vLLM's counters ({raw / emitted - 1.0:+.0%})"
        )
    return notes


# --- provenance -----------------------------------------------------------------------------------


_VERSIONS = (
    ("specbench", "specbench_version"),
    ("vLLM", "vllm_version"),
    ("vLLM repairs", "vllm_fixes"),
    ("torch", "torch_version"),
    ("transformers", "transformers_version"),
    ("Python", "python_version"),
    ("machine", "machine"),
    ("host", "host"),
)
_SETTINGS = (
    ("git commit", "git_commit"),
    ("schema version", "schema_version"),
    ("model", "model"),
    ("dtype", "dtype"),
    ("prefix caching", "enable_prefix_caching"),
    ("enforce_eager", "enforce_eager"),
    ("max_model_len", "max_model_len"),
    ("workload source", "workload_source"),
)


def provenance(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(label, value) pairs: versions, machine, host, dates, commit, schema; differing values all listed."""

    def values(column: str) -> str:
        found = sorted({str(v) for v in df[column] if not pd.isna(v)})
        return ", ".join(found) if found else "not recorded"

    started = sorted(str(v) for v in df["started_at"] if not pd.isna(v))
    if not started:
        dates = "not recorded"
    else:
        dates = started[0] if started[0] == started[-1] else f"{started[0]} to {started[-1]}"
    return (
        [(label, values(column)) for label, column in _VERSIONS]
        + [("cells started", dates)]
        + [(label, values(column)) for label, column in _SETTINGS]
    )


@dataclass(frozen=True)
class Command:
    """The command that reproduces the sweep, and where it was read from."""

    text: str
    source: str
    grid: list[str]  # the preset grid (hydra.sweeper.params), one "key: values" per line
    dir_key: str = "hydra.sweep.dir"  # the override that writes into a given directory (a resume)


def reproduce_command(
    multirun: Mapping[str, Any] | None, run_overrides: Sequence[str] | None, df: pd.DataFrame
) -> Command:
    """The command line that reruns this sweep.

    From Hydra's saved ``multirun.yaml`` when there is one (its
    ``hydra.overrides.task`` are the command-line overrides), else from a
    single run's ``.hydra/overrides.yaml``, else reconstructed from the cells'
    ``config_json`` (the grid's dimensions and run settings only).
    """
    if multirun is not None:
        hydra_cfg = multirun.get("hydra") or {}
        overrides = [str(o) for o in ((hydra_cfg.get("overrides") or {}).get("task") or [])]
        params = (hydra_cfg.get("sweeper") or {}).get("params") or {}
        return Command(
            text=" ".join(["python -m specbench -m", *(shlex.quote(o) for o in overrides)]),
            source="Read from multirun.yaml (hydra.overrides.task).",
            grid=[f"{k}: {v}" for k, v in params.items()],
        )
    if run_overrides is not None:
        return Command(
            text=" ".join(["python -m specbench", *(shlex.quote(str(o)) for o in run_overrides)]),
            source="Read from .hydra/overrides.yaml: a single run, one cell and its baseline.",
            grid=[],
            dir_key="hydra.run.dir",
        )
    return Command(
        text=" ".join(["python -m specbench -m", *(shlex.quote(o) for o in _overrides_from_configs(df))]),
        source=(
            "Reconstructed from the cells' config_json, as no multirun.yaml lies beside the results: "
            "the grid's dimensions and run settings only; check other settings against the configs."
        ),
        grid=[],
    )


# (override key, path in config_json); grid dimensions first, then run settings.
_CONFIG_KEYS = (
    ("model", ("model", "name")),
    ("method", ("method", "name")),
    ("num_speculative_tokens", ("num_speculative_tokens",)),
    ("batch_size", ("batch_size",)),
    ("workload", ("workload", "name")),
    ("workload.num_prompts", ("workload", "num_prompts")),
    ("workload.max_tokens", ("workload", "max_tokens")),
    ("repetitions", ("repetitions",)),
    ("engine_runs", ("engine_runs",)),
    ("seed", ("seed",)),
    ("sweep_name", ("sweep_name",)),
)


def _overrides_from_configs(df: pd.DataFrame) -> list[str]:
    configs = [cfg for cfg in map(row_config, records(df)) if cfg]
    overrides = []
    for key, path in _CONFIG_KEYS:
        values: list[str] = []
        for cfg in configs:
            value: Any = cfg
            for part in path:
                value = value.get(part) if isinstance(value, Mapping) else None
            if value is not None and str(value) not in values:
                values.append(str(value))
        # The sweeper adds each speculative cell's baseline itself, so method=baseline
        # and K=0 belong in the command only for a baseline-only sweep.
        if key == "method" and len(values) > 1:
            values = [v for v in values if v != "baseline"]
        if key == "num_speculative_tokens" and len(values) > 1:
            values = [v for v in values if v != "0"]
        if values:
            overrides.append(f"{key}={','.join(sorted(values, key=_numeric_first))}")
    return overrides


def _numeric_first(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)

