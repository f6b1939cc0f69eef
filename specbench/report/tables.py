"""The report's numbers: the results frame, and every table and sentence the page shows.

:func:`load_frame` reads ``results.parquet`` into a DataFrame and adds the
labels that plots and tables share (:data:`PANEL`, :data:`CONFIG`), so a cell
is grouped and named the same way everywhere on the page. Everything else
here turns that frame into plain data (dataclasses, strings, numbers) for the
template; nothing here draws or renders HTML.

Reads Parquet only: no vLLM, no Hydra, so a report can be rebuilt on a laptop.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specbench.analytic import prediction, recommend
from specbench.results.schema import COLUMNS, recommendable, row_config

PANEL = "panel"
"""Derived column: the workload, prefixed by the model when a file holds several models."""
CONFIG = "config_label"
"""Derived column: ``"<method> K=<K>"``."""
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
    Missing schema columns are added as nulls so an older file still renders.
    """
    table = pq.read_table(path)
    nullable = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
    df = table.to_pandas(types_mapper=nullable.get)
    missing = [c for c in COLUMNS if c not in df.columns]
    for column in missing:
        df[column] = pd.Series([None] * len(df), dtype=object)
    several_models = df["model"].dropna().nunique() > 1
    df[PANEL] = [
        _panel(model, workload, several_models) for model, workload in zip(df["model"], df["workload"])
    ]
    df[CONFIG] = [config_label(m, k) for m, k in zip(df["method"], df["num_speculative_tokens"])]
    return df, missing


def _panel(model: Any, workload: Any, several_models: bool) -> str:
    workload = "?" if pd.isna(workload) else str(workload)
    return f"{model} · {workload}" if several_models and not pd.isna(model) else workload


def config_label(method: Any, k: Any) -> str:
    """``"ngram K=4"``; ``"baseline"`` for plain decoding; ``"?"`` when the method is unknown."""
    if pd.isna(method):
        return "?"
    if method == "baseline":
        return str(method)
    return f"{method} K={'?' if pd.isna(k) else int(k)}"


# --- row selections -------------------------------------------------------------------------------


def failed_mask(df: pd.DataFrame) -> pd.Series:
    """Cells that failed, as ``sweep.finish`` counts them: not ok, or speculative without a speedup."""
    speculative = df["method"].fillna("") != "baseline"
    return (df["status"].fillna("") != "ok") | (speculative & df["speedup"].isna())


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


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The frame's rows as plain dicts, nulls as None: what the shared rules of
    :mod:`specbench.analytic.recommend` and :mod:`specbench.analytic.prediction` read."""
    plain = df.astype(object).where(df.notna(), None)
    return plain.to_dict("records")


def eligible(df: pd.DataFrame) -> pd.DataFrame:
    """Compared cells fit to be named best (:func:`specbench.results.recommendable`: exact, not flagged)."""
    comp = compared(df)
    return comp[pd.Series([recommendable(r) for r in records(comp)], index=comp.index, dtype=bool)]


def _best(df: pd.DataFrame) -> pd.Series | None:
    """The row :func:`specbench.analytic.recommend.best_row` names among ``df``'s rows, or None."""
    chosen = recommend.best_row([r | {"_index": i} for i, r in zip(df.index, records(df))])
    return None if chosen is None else df.loc[chosen[0]["_index"]]


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values([PANEL, "method", "num_speculative_tokens", "batch_size"], na_position="last")


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


def summary(df: pd.DataFrame, missing_columns: Sequence[str]) -> Summary:
    """Counts, the best speedup overall, a verdict per workload and the missing pieces.

    The best speedup and the verdicts name only cells fit to be recommended
    (exact outputs, not flagged), chosen by the rule the K schedule uses
    (:func:`specbench.analytic.recommend.best_row`).
    """
    good = eligible(df)
    top = _best(good)
    best = None
    if top is not None:
        best = (
            f"{fmt_speedup(top['speedup'])} ({_ci_phrase(top)}) "
            f"with {top[CONFIG]} at batch {_batch(top['batch_size'])} on {top[PANEL]}"
        )
    panels = sorted(p for p in df.loc[df["workload"].notna(), PANEL].unique())
    return Summary(
        cells=len(df),
        failed=int(failed_mask(df).sum()),
        best=best,
        verdicts=[verdict(good[good[PANEL] == p], p, excluded=_excluded(df, p)) for p in panels],
        missing=missing_pieces(df, missing_columns),
    )


def _ci_phrase(row: pd.Series) -> str:
    """``"CI [1.50, 2.10]"``, or ``"no interval"`` for a cell without one (never a zero-width interval)."""
    if pd.isna(row["speedup_ci_low"]) or pd.isna(row["speedup_ci_high"]):
        return "no interval"
    return f"CI {fmt_ci(row['speedup_ci_low'], row['speedup_ci_high'])}"


def _excluded(df: pd.DataFrame, panel: str) -> int:
    """Compared cells of a panel left out of best and verdict (inexact or flagged)."""
    comp = compared(df)
    comp = comp[comp[PANEL] == panel]
    return len(comp) - len(eligible(comp))


def verdict(panel_rows: pd.DataFrame, panel: str, excluded: int = 0) -> str:
    """One line on whether speculation pays on one workload, and up to which batch size.

    ``panel_rows`` are the workload's cells fit to be recommended. Follows the
    configuration :func:`specbench.analytic.recommend.best_row` names at the smallest
    batch size measured, since that is where speculation has its best
    chance, and reports the contiguous run of batch sizes from there on
    which it beats 1×. ``excluded`` cells (inexact or flagged) are counted
    in the line, never chosen.
    """
    left_out = f" ({excluded} inexact or flagged cell(s) left out)" if excluded else ""
    if panel_rows.empty:
        if excluded:
            return f"{panel}: no verdict: every compared cell is inexact or flagged{left_out}"
        return f"{panel}: no speedup measured (no speculative cell was compared with a baseline)"
    smallest = panel_rows["batch_size"].min()
    top = _best(panel_rows[panel_rows["batch_size"] == smallest])
    assert top is not None  # panel_rows holds recommendable rows only
    label, speed = top[CONFIG], fmt_speedup(top["speedup"])
    if top["speedup"] <= 1.0:
        return f"{panel}: nothing beats plain decoding (best at batch {smallest}: {label}, {speed}){left_out}"
    curve = panel_rows[panel_rows[CONFIG] == label].sort_values("batch_size")
    paying = []
    for batch, value in zip(curve["batch_size"], curve["speedup"]):
        if value <= 1.0:
            break
        paying.append(int(batch))
    caveat = ""
    if pd.isna(top["speedup_ci_low"]) or pd.isna(top["speedup_ci_high"]):
        caveat = "; no interval (one engine run of one repetition), so noise is not ruled out"
    elif _ci_side(top["speedup_ci_low"], top["speedup_ci_high"]) != "above":
        caveat = f"; its CI {fmt_ci(top['speedup_ci_low'], top['speedup_ci_high'])} does not exclude 1×"
    if len(curve) == 1:
        return (f"{panel}: {label} pays at batch {smallest}, the only batch size measured "
                f"({speed}{caveat}){left_out}")
    reach = (
        f"pays at every measured batch size, up to {paying[-1]}"
        if len(paying) == len(curve)
        else f"pays up to batch {paying[-1]}"
    )
    return f"{panel}: {label} {reach} ({speed} at batch {smallest}{caveat}){left_out}"


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
    """The fastest speculative configuration for one workload at one batch size."""

    panel: str
    batch_size: int
    config: str
    speedup: str
    ci: str
    decode_speedup: str
    ci_side: str  # "above" or "below" when the whole CI lies on one side of 1×, else ""


def best_configs(df: pd.DataFrame) -> list[BestConfig]:
    """Per workload and batch size, the configuration :func:`specbench.analytic.recommend.best_row` names.

    Among cells fit to be recommended (exact, not flagged): the fastest that
    clearly beats plain decoding, which is the K the schedule picks there,
    else the fastest.
    """
    out = []
    for (panel, batch), group in eligible(df).groupby([PANEL, "batch_size"], sort=True):
        top = _best(group)
        assert top is not None  # eligible rows only
        out.append(
            BestConfig(
                panel=str(panel),
                batch_size=int(batch),
                config=str(top[CONFIG]),
                speedup=fmt_speedup(top["speedup"]),
                ci=fmt_ci(top["speedup_ci_low"], top["speedup_ci_high"]),
                decode_speedup=fmt_speedup(top["decode_speedup"]),
                ci_side=_ci_side(top["speedup_ci_low"], top["speedup_ci_high"]),
            )
        )
    return out


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


def _crossing(value: float | str | None, batches: Sequence[int], speedups: Sequence[float | None]) -> str:
    """A break-even batch size from :func:`specbench.analytic.prediction.break_even`, in words."""
    if isinstance(value, str):
        return "n/a: a batch size has no value"
    if value is None:
        return f"not reached: ≥1× through batch {batches[-1]}"
    first = speedups[0]
    if first is not None and first < 1.0:
        return f"below 1× from batch {batches[0]}, the smallest measured"
    return f"{value:.1f}"


def break_even(df: pd.DataFrame) -> list[BreakEven]:
    """Measured (and, with model columns, predicted) break-even batch size per curve.

    The curves and crossings are :func:`specbench.analytic.prediction.break_even`'s,
    the ones ``python -m specbench.analytic.prediction`` prints, over the compared cells.
    """
    panel_of = dict(zip(df["cell_id"], df[PANEL]))
    label_of = dict(zip(df["cell_id"], df[CONFIG]))
    out = []
    for curve in prediction.break_even(records(compared(df))):
        first = curve["rows"][0]
        batches = curve["batch_sizes"]
        predicted = NO_MODEL
        if any(v is not None for v in curve["series"]["predicted_speedup"]):
            predicted = _crossing(curve["predicted"], batches, curve["series"]["predicted_speedup"])
        out.append(
            BreakEven(
                panel=str(panel_of[first["cell_id"]]),
                config=str(label_of[first["cell_id"]]),
                batch_sizes=", ".join(str(b) for b in batches),
                measured=_crossing(curve["measured"], batches, curve["series"]["speedup"]),
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


def schedules(df: pd.DataFrame) -> list[Schedule]:
    """The K schedules of :func:`specbench.analytic.recommend.recommend`, the ones ``python -m specbench.analytic.recommend`` prints.

    Per method and workload, from the cells fit to be recommended: the K with
    the highest speedup among those whose interval clears 1× at each batch
    size, K = 0 where none does.
    """
    several_models = df["model"].dropna().nunique() > 1
    out = [
        Schedule(
            panel=_panel(rec.model, rec.workload, several_models),
            method=rec.method,
            best_k={batch: k for batch, (k, _) in rec.best.items()},
            json=rec.speculative_config_json() if rec.max_k else None,
        )
        for rec in recommend.recommend(records(compared(df)))
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
class Exactness:
    """Greedy speculative outputs against their baselines, token for token."""

    compared: int  # cells whose exactness is known
    mismatches: list[CellLine]
    unknown: list[CellLine]


def exactness(df: pd.DataFrame) -> Exactness:
    """Cells whose outputs differ from their baseline's, and cells where that is unknown."""
    spec = _sorted(speculative(df))
    known = spec[spec["exact_match"].notna()]
    bad = known[known["exact_match"] == False]  # noqa: E712 (nullable boolean column)
    unknown = spec[spec["exact_match"].isna()]
    return Exactness(
        compared=len(known),
        mismatches=_cell_lines(
            bad,
            [
                f"{fmt_number(m, 0)} of {fmt_number(n, 0)} requests differ"
                for m, n in zip(bad["mismatched_requests"], bad["num_requests"])
            ],
        ),
        unknown=_cell_lines(
            unknown,
            [
                str(e) if not pd.isna(e) else "output tokens of the cell or its baseline were not found"
                for e in unknown["error"]
            ],
        ),
    )


def flagged(df: pd.DataFrame, missing_columns: Sequence[str]) -> list[CellLine] | None:
    """Flagged cells with their reasons; None when the results file has no ``flagged`` column."""
    if FLAGGED in missing_columns:
        return None
    rows = _sorted(df[df[FLAGGED].fillna(False).astype(bool)])
    details = []
    for _, r in rows.iterrows():
        reasons = r["flag_reasons"]
        has_reasons = reasons is not None and len(reasons) > 0
        why = "; ".join(str(x) for x in reasons) if has_reasons else "no reason recorded"
        ci = fmt_ci(r["speedup_ci_low"], r["speedup_ci_high"])
        details.append(f"{why} (speedup {fmt_speedup(r['speedup'])}, CI {ci})")
    return _cell_lines(rows, details)


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
    acceptance_length_p50: str
    tokens_per_pass: str
    draft_coverage: str
    repetitive: str
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
            acceptance_length_p50=fmt_number(r["acceptance_length_p50"]),
            tokens_per_pass=fmt_number(r["tokens_per_pass"]),
            draft_coverage=fmt_number(r["draft_coverage"]),
            repetitive=(
                "–" if pd.isna(r["repetitive_requests"]) or pd.isna(r["num_requests"])
                else f"{int(r['repetitive_requests'])}/{int(r['num_requests'])}"
            ),
            tpot_ms=fmt_number(None if pd.isna(r["tpot_s_p50"]) else 1000 * r["tpot_s_p50"], 1),
        )
        for _, r in _sorted(df).iterrows()
    ]


# --- provenance -----------------------------------------------------------------------------------


_VERSIONS = (
    ("specbench", "specbench_version"),
    ("vLLM", "vllm_version"),
    ("torch", "torch_version"),
    ("transformers", "transformers_version"),
    ("Python", "python_version"),
    ("hardware", "hardware"),
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
    """(label, value) pairs: versions, hardware, host, dates, commit, schema; differing values all listed."""

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

