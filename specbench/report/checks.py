"""The statistical checks behind the page's flags, as the page states them.

- the sweep's one error budget over the four flag families (:func:`error_budget`);
- every sampled cell's distribution check: its p-value, Holm-adjusted, with the check's power beside it
  (:func:`distribution_checks`);
- where the shifted-baseline test could not judge a cell's baseline (:func:`unchecked_baselines`);
- cells whose outputs differ in length from their baseline's (:func:`unequal_lengths`): their speedup
  compares time per output token, not wall time.

Reads the results frame only (:mod:`specbench.report.tables` loads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from specbench.report.tables import CONFIG, PANEL, fmt_number, fmt_speedup, records, speculative
from specbench.results.distribution import DEVIATIONS, MAX_DETECTABLE_TV
from specbench.results.judging import FAMILY_ALPHA, FLAG_FAMILIES, SWEEP_ALPHA

# An output-token ratio this close to 1 is equal work (the page lists the others).
EQUAL_LENGTH = 0.005


def error_budget() -> str:
    """The sentence that states the sweep's error budget over the flag families."""
    return (f"A sound cell can be flagged by chance in {len(FLAG_FAMILIES)} ways ({', '.join(FLAG_FAMILIES)}); "
            f"they share one error budget: each family is tested at {FAMILY_ALPHA:g} over its cells "
            f"(Bonferroni or Holm), so a sweep whose every cell is sound loses any cell to a flag with "
            f"probability at most {SWEEP_ALPHA:g}.")


@dataclass(frozen=True)
class DistributionCheck:
    """One sampled cell's check in distribution, as the page lists it."""

    panel: str
    config: str
    batch_size: str
    temperature: str
    p_value: str
    p_adjusted: str
    power: str  # the smallest total-variation distance detected with 80% power, or why none
    exactness: str
    cell_id: str


def distribution_checks(df: pd.DataFrame) -> list[DistributionCheck]:
    """Every sampled speculative cell's check: p-value, Holm-adjusted p-value and power side by side."""
    if "distribution_p_value" not in df.columns:
        return []
    spec = speculative(df)
    spec = spec[spec["temperature"].fillna(0.0) > 0]
    found = []
    for r in records(spec.sort_values([PANEL, CONFIG, "batch_size", "temperature"])):
        power = r.get("distribution_power_tv")
        if r.get("distribution_p_value") is None:
            reach = "–"
        elif power is None:
            reach = f"none up to {DEVIATIONS[-1]:g}"
        else:
            reach = f"{power:g}" + (" (too weak)" if power > MAX_DETECTABLE_TV else "")
        found.append(DistributionCheck(
            panel=str(r[PANEL]), config=str(r[CONFIG]), batch_size=_batch(r.get("batch_size")),
            temperature=fmt_number(r.get("temperature")), p_value=_p(r.get("distribution_p_value")),
            p_adjusted=_p(r.get("distribution_p_adjusted")), power=reach,
            exactness=str(r.get("exactness") or "unknown"), cell_id=str(r["cell_id"]),
        ))
    return found


def distribution_note() -> str:
    """How to read the distribution checks' table."""
    return (f"Power: the smallest total-variation distance, at the positions a verify pass with a draft "
            f"decided, that the check detects with 80% power at {FAMILY_ALPHA:g} / m (Holm's level for a "
            f"lone deviating cell among the m checked). A cell whose check passes but detects nothing up to "
            f"{MAX_DETECTABLE_TV:g} is untested, not in distribution: its pass says little.")


def unchecked_baselines(df: pd.DataFrame) -> list[str]:
    """Where the shifted-baseline test could not judge a speculative cell's baseline, one line per workload
    (its batch sizes and configurations); empty where it judged every cell of two engine runs or more."""
    if "baseline_shift_checked" not in df.columns:
        return []
    spec = speculative(df)
    unchecked = spec[spec["baseline_shift_checked"].astype(object).eq(False)]
    lines = []
    for panel, rows in unchecked.groupby(PANEL, sort=True):
        batches = ", ".join(str(int(b)) for b in sorted(rows["batch_size"].dropna().unique()))
        configs = ", ".join(sorted(str(c) for c in rows[CONFIG].unique()))
        lines.append(f"{panel}: batch {batches} ({configs})")
    return lines


@dataclass(frozen=True)
class UnequalLength:
    """A cell whose outputs differ in length from its baseline's."""

    panel: str
    config: str
    batch_size: str
    temperature: str
    ratio: str  # the cell's output tokens over its baseline's
    speedup: str  # time per output token, baseline over cell
    wall_ratio: str  # plain wall time, baseline over cell: speedup / ratio
    cell_id: str


def unequal_lengths(df: pd.DataFrame) -> list[UnequalLength]:
    """Speculative cells whose ``output_token_ratio`` is not 1 (beyond :data:`EQUAL_LENGTH`)."""
    if "output_token_ratio" not in df.columns:
        return []
    spec = speculative(df)
    ratio = spec["output_token_ratio"]
    spec = spec[ratio.notna() & ((ratio - 1.0).abs() > EQUAL_LENGTH)]
    return [
        UnequalLength(
            panel=str(r[PANEL]), config=str(r[CONFIG]), batch_size=_batch(r.get("batch_size")),
            temperature=fmt_number(r.get("temperature")), ratio=fmt_number(r["output_token_ratio"], 3),
            speedup=fmt_speedup(r.get("speedup")),
            wall_ratio=fmt_speedup(None if r.get("speedup") is None else r["speedup"] / r["output_token_ratio"]),
            cell_id=str(r["cell_id"]),
        )
        for r in records(spec.sort_values([PANEL, CONFIG, "batch_size"]))
    ]


def _p(value: Any) -> str:
    return "–" if value is None or pd.isna(value) else f"{float(value):.2g}"


def _batch(value: Any) -> str:
    return "?" if value is None or pd.isna(value) else str(int(value))
