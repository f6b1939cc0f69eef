"""The report's memory section: what each method's drafter costs beside the speedup it buys.

Per drafter (baseline, ngram, each EAGLE kind, each draft model; a method
variant, :data:`specbench.report.tables.VARIANT`, so each of its own keys apart): the
drafter's weight bytes, the KV cache the engine had left (tokens, and the
share of the baseline's capacity the drafter took), how many requests of the
cell's length fit, the peak memory, the memory model's prediction, and the
best speedup, chosen as everywhere on the page (:func:`specbench.report.tables.best_of`
among eligible cells: none flagged, none whose outputs mismatch the baseline's).
A figure draws the first two beside the third, so that "EAGLE is fast and
cheap, a draft model is expensive" is a picture.

Reads the results frame only (:func:`specbench.report.tables.load_frame`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from specbench.report import plots
from specbench.report.tables import VARIANT, best_of, eligible, fmt_speedup, measured

_MB = 1e6


@dataclass(frozen=True)
class MemoryRow:
    """One drafter's memory cost and best speedup, formatted for the page."""

    drafter: str
    drafter_mb: str
    kv_tokens: str
    kv_share: str
    requests_fit: str
    peak_gb: str  # per batch size ("b1 3.82 · b4 4.07")
    predicted: str  # the memory model's KV tokens and its peak per batch size
    best_speedup: str  # by the page's one rule and chooser; "" when no eligible cell


def _frame(df: pd.DataFrame) -> pd.DataFrame:
    rows = measured(df)
    rows = rows[rows["kv_cache_tokens"].notna()] if "kv_cache_tokens" in rows.columns else rows.iloc[0:0]
    return rows.assign(drafter=rows[VARIANT])


def _median(series: pd.Series) -> float | None:
    values = series.dropna().astype(float)
    return float(values.median()) if len(values) else None


def _peak(rows: pd.DataFrame) -> float | None:
    for column in ("gpu_used_bytes", "peak_rss_bytes"):
        value = _median(rows[column])
        if value is not None:
            return value
    return None


def _by_batch(rows: pd.DataFrame, figure: Any) -> str:
    """``"b1 3.82 · b4 4.07"``: ``figure`` (rows -> GB or None) per batch size; a peak grows with the batch.

    Each cell's peaks are its own (the worker resets them as a cell starts),
    so a batch-1 cell no longer reports the peak of a batch-64 cell before it.
    """
    parts = []
    for batch, group in rows.groupby("batch_size", sort=True):
        value = figure(group)
        if value is not None:
            parts.append(f"b{int(batch)} {value / 1e9:.2f}")
    return " · ".join(parts)


def memory_table(df: pd.DataFrame) -> list[MemoryRow]:
    """One row per drafter, baseline first, cheapest drafter first after it.

    The best speedup is :func:`specbench.report.tables.best_of`'s among the
    drafter's eligible cells: the fastest that pays, else the fastest.
    """
    frame = _frame(df)
    judged = eligible(df)
    judged = judged.assign(drafter=judged[VARIANT])
    out = []
    order = frame.groupby("drafter")["drafter_weight_bytes"].median().sort_values(kind="stable")
    for drafter in sorted(order.index, key=lambda d: (d != "baseline", order[d], d)):
        rows = frame[frame["drafter"] == drafter]
        share = _median(rows["drafter_kv_share"])
        predicted_tokens = _median(rows["predicted_kv_cache_tokens"])
        predicted_peak = _by_batch(rows, lambda group: _median(group["predicted_peak_bytes"]))
        best = best_of(judged[judged["drafter"] == drafter])
        out.append(MemoryRow(
            drafter=drafter,
            drafter_mb=f"{_median(rows['drafter_weight_bytes']) / _MB:,.0f}",
            kv_tokens=f"{_median(rows['kv_cache_tokens']):,.0f}",
            kv_share="" if share is None else f"{share:.0%}",
            requests_fit=f"{_median(rows['kv_requests_fit']):,.0f}",
            peak_gb=_by_batch(rows, _peak),
            predicted=(f"{predicted_tokens:,.0f} tokens; peak {predicted_peak}"
                       if predicted_tokens is not None and predicted_peak else "n/a"),
            best_speedup="" if best is None else fmt_speedup(best["speedup"]),
        ))
    return out


def memory_cost(df: pd.DataFrame, enc: plots.Encoding) -> plots.Plot:
    """What each drafter costs in memory, beside the best speedup it bought."""
    plot = plots.Plot(
        anchor="memory",
        title="What a draft costs in memory",
        caption=(
            "Left: the drafter's weights; right: the KV cache left for requests (tokens), labelled "
            "with the best speedup of the table below (flagged cells and mismatched outputs left out). "
            "A cheap, fast method has a short left bar, a long right bar and a high label; ngram costs "
            "nothing."
        ),
    )
    frame = _frame(df)
    if frame.empty:
        return replace(plot, missing="No memory columns in these results (measured before schema 3).")
    table = memory_table(df)
    labels = [r.drafter for r in table]
    medians = frame.groupby("drafter").agg(
        drafter=("drafter_weight_bytes", "median"), kv=("kv_cache_tokens", "median"),
    ).loc[labels]
    colours = [enc.colour(d) if d != "baseline" else plots._BASELINE_COLOUR for d in labels]
    with plots._style():
        fig = Figure(figsize=(9.0, 0.5 * len(labels) + 1.6), layout="constrained")
        left, right = fig.subplots(1, 2, sharey=True)
        y = range(len(labels))
        left.barh(y, medians["drafter"] / _MB, color=colours)
        left.set_yticks(list(y), [plots._text(label) for label in labels])
        left.invert_yaxis()
        left.set_xlabel("drafter weights (MB)")
        right.barh(y, medians["kv"], color=colours)
        right.set_xlabel("KV cache capacity (tokens)")
        for i, row in enumerate(table):
            if row.best_speedup:
                right.annotate(f" best {row.best_speedup}", (medians["kv"].iloc[i], i), va="center", fontsize=8)
        right.set_xlim(0, medians["kv"].max() * 1.3)
        return replace(plot, image=plots._png(fig))


__all__ = ["MemoryRow", "memory_cost", "memory_table"]
