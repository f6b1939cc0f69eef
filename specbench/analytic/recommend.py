"""``python -m specbench.analytic.recommend <sweep dir or results.parquet>...``: the best K per batch-size range.

From a sweep's measured speedups, for each method and workload (and every
other setting held fixed: :func:`specbench.results.curve_key`), the K with
the highest speedup at each measured batch size among those that beat plain
decoding, or 0 where none does (:func:`best_row`, the one rule the report's
best configuration, verdicts, schedule and memory table use too). Only rows
fit to be judged count (:func:`specbench.results.recommendable`: outputs that
do not mismatch the baseline's, numerical ties allowed; not flagged). A K
pays (:func:`pays`) when the lower end of its 95% speedup interval exceeds
1 + margin; rows without an interval (one engine run of one repetition) are
judged by their point estimate, which is then only as good as the run's
noise (``--margin`` asks for a clear lead). Consecutive batch sizes
with the same K merge into vLLM's ``num_speculative_tokens_per_batch_size``
schedule of inclusive (start, end, K) ranges
(:func:`specbench.analytic.speedup.num_speculative_tokens_per_batch_size`): grid point
b's K holds up to the next grid point, the smallest point's K reaches down to
batch size 1.

The output is ready to paste into a ``speculative_config``, and comes with
the specbench command that measures the schedule itself. Rows measured with
a schedule are not used to choose K; when present, they are set beside the
best fixed K at each batch size, which is the check.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench import methods
from specbench.analytic import speedup
from specbench.results.schema import SCHEDULE_KEY, curve_key, method_variant, recommendable, results_path, row_config


@dataclass(frozen=True)
class Recommendation:
    """The best K per batch size of one method/workload curve family, as a schedule."""

    label: str
    method: str
    variant: str  # the method and its own keys (specbench.methods.variant): "controlled alpha=0.6"
    workload: str
    model: str
    best: dict[int, tuple[int, float | None]]  # batch size -> (K, its speedup; None for K=0)
    measured: dict[int, dict[int, float]]  # batch size -> K -> speedup
    lower: dict[int, dict[int, float]]  # batch size -> K -> lower end of the speedup interval
    schedule: list[tuple[int, int, int]]
    overrides: list[str]  # Hydra overrides that reproduce the family's settings
    checked: dict[int, float]  # batch size -> speedup measured with a schedule (if any)
    checked_schedule: list[list[int]] | None

    @property
    def max_k(self) -> int:
        """num_speculative_tokens the schedule needs: vLLM caps every entry at it."""
        return max(k for _, _, k in self.schedule)

    def speculative_config_yaml(self) -> str:
        """The two speculative_config keys to paste."""
        ranges = ", ".join(f"[{a}, {b}, {k}]" for a, b, k in self.schedule)
        return f"num_speculative_tokens: {self.max_k}\n{SCHEDULE_KEY}: [{ranges}]"

    def speculative_config_json(self) -> str:
        """The ``speculative_config`` fragment as JSON: method, K and the schedule, one range per line."""
        # One range per line reads better than json.dumps(indent=...), which puts every number on its own line.
        body = ",\n    ".join(json.dumps(list(r)) for r in self.schedule)
        return (
            "{\n"
            f'  "method": {json.dumps(self.method)},\n'
            f'  "num_speculative_tokens": {self.max_k},\n'
            f'  "{SCHEDULE_KEY}": [\n    {body}\n  ]\n'
            "}"
        )

    def check_command(self) -> str:
        """The specbench sweep that measures this schedule at the same batch sizes."""
        ranges = ",".join(f"[{a},{b},{k}]" for a, b, k in self.schedule)
        sizes = ",".join(str(b) for b in sorted(self.best))
        return (
            "python -m specbench -m " + " ".join(self.overrides)
            + f" num_speculative_tokens={self.max_k} batch_size={sizes}"
            + f" '+method.speculative_config.{SCHEDULE_KEY}=[{ranges}]'"
        )


def _overrides(row: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    method = {**(cfg.get("method") or {}), "name": row["method"]}
    workload = cfg.get("workload") or {}
    registered = methods.get(row["method"])
    out = [f"model={row['model']}"]
    out += registered.overrides(method) if registered else [f"method={row['method']}"]
    out.append(f"workload={row['workload']}")
    out += [f"workload.{key}={workload[key]}" for key in ("num_prompts", "max_tokens") if key in workload]
    out.append(f"repetitions={cfg.get('repetitions', row.get('repetitions'))}")
    if cfg.get("engine_runs") is not None:
        out.append(f"engine_runs={cfg['engine_runs']}")
    return out


def has_interval(row: Mapping[str, Any]) -> bool:
    """Whether a row's speedup has an interval (never a zero-width one: that is no interval)."""
    low, high = row.get("speedup_ci_low"), row.get("speedup_ci_high")
    return low is not None and high is not None and low < high


def lower_bound(row: Mapping[str, Any]) -> float:
    """The lower end of a row's speedup interval; its point estimate when it has no interval."""
    return row["speedup_ci_low"] if has_interval(row) else row["speedup"]


def pays(row: Mapping[str, Any], margin: float = 0.0) -> bool:
    """Whether a row pays: its 95% interval's lower end exceeds 1 + margin.

    The one rule of every "pays" (verdicts, best configuration, K schedule,
    memory table). A row without an interval is judged on its point estimate.
    """
    return lower_bound(row) > 1.0 + margin


def best_row(rows: Sequence[Mapping[str, Any]], margin: float = 0.0) -> tuple[Mapping[str, Any], bool] | None:
    """The configuration to name among rows, and whether it pays: the one chooser of every decision.

    The fastest row (equal speedups: the smaller K) among those that pay
    (:func:`pays`); when none does, the fastest row overall, with False. Rows
    not fit to be judged (:func:`specbench.results.recommendable`) never count.
    None when no row is left. The schedule asks it per batch size; the report
    also per workload (verdicts), over a drafter's cells (memory table) and
    over the sweep (best speedup).
    """
    candidates = [r for r in rows if recommendable(r)]
    if not candidates:
        return None
    paying = [r for r in candidates if pays(r, margin)]
    chosen = max(paying or candidates, key=lambda r: (r["speedup"], -(r.get("num_speculative_tokens") or 0)))
    return chosen, bool(paying)


def recommend(rows: Sequence[Mapping[str, Any]], margin: float = 0.0) -> list[Recommendation]:
    """One :class:`Recommendation` per method/workload family with recommendable speedups."""
    families: dict[str, list[tuple[Mapping[str, Any], dict[str, Any]]]] = {}
    for row in rows:
        if recommendable(row):
            families.setdefault(curve_key(row, across_k=True), []).append((row, row_config(row)))

    out = []
    for members in families.values():
        by_batch: dict[int, list[Mapping[str, Any]]] = {}
        checked: dict[int, float] = {}
        checked_schedule = None
        for row, cfg in members:
            schedule = ((cfg.get("method") or {}).get("speculative_config") or {}).get(SCHEDULE_KEY)
            if schedule:
                checked[row["batch_size"]] = row["speedup"]
                checked_schedule = schedule
            else:
                by_batch.setdefault(row["batch_size"], []).append(row)
        if not by_batch:
            continue
        best = {}
        for batch, at_batch in by_batch.items():
            chosen = best_row(at_batch, margin)
            assert chosen is not None  # every member is recommendable
            top, paying = chosen
            best[batch] = (top["num_speculative_tokens"], top["speedup"]) if paying else (0, None)
        row, cfg = members[0]
        variant = str(method_variant(row))
        out.append(Recommendation(
            label=f"{variant} on {row['workload']} ({row['model']})",
            method=str(row["method"]),
            variant=variant,
            workload=str(row["workload"]),
            model=str(row["model"]),
            best=dict(sorted(best.items())),
            measured={b: dict(sorted((r["num_speculative_tokens"], r["speedup"]) for r in v))
                      for b, v in sorted(by_batch.items())},
            lower={b: {r["num_speculative_tokens"]: lower_bound(r) for r in v} for b, v in by_batch.items()},
            schedule=speedup.num_speculative_tokens_per_batch_size({b: k for b, (k, _) in best.items()}),
            overrides=_overrides(row, cfg),
            checked=dict(sorted(checked.items())),
            checked_schedule=checked_schedule,
        ))
    return sorted(out, key=lambda r: r.label)


def format_recommendation(rec: Recommendation) -> str:
    """The recommendation as text: the evidence per batch size, the schedule, the check."""
    lines = [rec.label]
    for batch, (k, speedup) in rec.best.items():
        others = ", ".join(f"K={kk} {s:.2f}x" for kk, s in rec.measured[batch].items())
        choice = f"K={k} ({speedup:.2f}x)" if k else "K=0 (no K clearly beats plain decoding)"
        line = f"  batch {batch:>4}: {choice:<40} measured: {others}"
        if batch in rec.checked:
            line += f"; with schedule {rec.checked[batch]:.2f}x"
        lines.append(line)
    if rec.max_k == 0:
        lines.append("  recommendation: no speculation at any measured batch size")
        return "\n".join(lines)
    lines.append(f"  schedule (start, end, K): {rec.schedule}")
    lines.append("  speculative_config:")
    lines += ["    " + line for line in rec.speculative_config_yaml().splitlines()]
    lines.append("  check it:")
    lines.append("    " + rec.check_command())
    if rec.checked_schedule is not None:
        lines.append(f"  (rows measured with schedule {rec.checked_schedule} are shown as 'with schedule')")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the recommendations of a sweep; exit 2 when there is nothing to recommend from."""
    parser = argparse.ArgumentParser(
        prog="python -m specbench.analytic.recommend",
        description="Best K per batch-size range (vLLM num_speculative_tokens_per_batch_size) from a sweep.",
    )
    parser.add_argument("results", type=Path, nargs="+",
                        help="sweep directories or results.parquet files (e.g. a sweep and its schedule check)")
    parser.add_argument("--margin", type=float, default=0.0,
                        help="a K must beat plain decoding by more than this (e.g. 0.05)")
    args = parser.parse_args(argv)
    from specbench.results.schema import ResultsError, read_rows

    paths = [results_path(p) for p in args.results]
    rows = []
    try:
        for path in paths:
            rows += read_rows(path)
    except (ResultsError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    recommendations = recommend(rows, args.margin)
    left_out = [r for r in rows if r.get("method") != "baseline" and r.get("speedup") is not None
                and not recommendable(r)]
    if left_out:
        print(f"note: {len(left_out)} cell(s) left out because their outputs mismatch the baseline's or "
              "they are flagged: " + ", ".join(str(r.get("cell_id")) for r in left_out), file=sys.stderr)
    if not recommendations:
        print(f"error: {', '.join(map(str, paths))}: no speculative cell with a measured speedup at a fixed K "
              "(whose outputs match the baseline's, numerical ties allowed, and that is not flagged)",
              file=sys.stderr)
        return 2
    print("\n\n".join(format_recommendation(r) for r in recommendations))
    if all(all(low == rec.measured[b][k] for k, low in by_k.items())
           for rec in recommendations for b, by_k in rec.lower.items()):
        print(f"\nnote: no speedup intervals in this sweep (one engine run of one repetition): K was chosen "
              f"on point estimates with margin {args.margin}; rerun with engine_runs>=2 or raise --margin")
    return 0


if __name__ == "__main__":
    sys.exit(main())
