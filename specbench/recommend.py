"""``python -m specbench.recommend <sweep dir or results.parquet>...``: the best K per batch-size range.

From a sweep's measured speedups, for each method and workload (and every
other setting held fixed), the K with the highest speedup at each measured
batch size among those that beat plain decoding, or 0 where none does. A K
beats plain decoding when the lower end of its speedup interval exceeds
1 + margin; rows without an interval (one pass of one repetition) are judged
by their point estimate, which is then only as good as the run's noise
(``--margin`` asks for a clear lead). Consecutive batch sizes
with the same K merge into vLLM's ``num_speculative_tokens_per_batch_size``
schedule of inclusive (start, end, K) ranges
(:func:`specbench.theory.num_speculative_tokens_per_batch_size`): grid point
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

from specbench import theory

SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


@dataclass(frozen=True)
class Recommendation:
    """The best K per batch size of one method/workload curve family, as a schedule."""

    label: str
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

    def check_command(self) -> str:
        """The specbench sweep that measures this schedule at the same batch sizes."""
        ranges = ",".join(f"[{a},{b},{k}]" for a, b, k in self.schedule)
        sizes = ",".join(str(b) for b in sorted(self.best))
        return (
            "python -m specbench -m " + " ".join(self.overrides)
            + f" num_speculative_tokens={self.max_k} batch_size={sizes}"
            + f" '+method.speculative_config.{SCHEDULE_KEY}=[{ranges}]'"
        )


def _config(row: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(row.get("config_json") or "{}")


def _family(row: Mapping[str, Any], cfg: Mapping[str, Any]) -> str:
    method = dict(cfg.get("method") or {})
    speculative = {k: v for k, v in (method.get("speculative_config") or {}).items()
                   if k not in ("num_speculative_tokens", SCHEDULE_KEY)}
    method["speculative_config"] = speculative
    return json.dumps({"model": cfg.get("model"), "method": method, "workload": cfg.get("workload"),
                       "engine": cfg.get("engine"), "repetitions": cfg.get("repetitions")},
                      sort_keys=True, default=str)


def _overrides(row: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    method = cfg.get("method") or {}
    workload = cfg.get("workload") or {}
    out = [f"model={row['model']}", f"method={row['method']}"]
    if row["method"] == "controlled":
        out.append(f"method.alpha={method.get('alpha')}")
    if row["method"] == "draft_model" and method.get("draft"):
        out.append(f"method.draft={method['draft']}")
    out.append(f"workload={row['workload']}")
    out += [f"workload.{key}={workload[key]}" for key in ("num_prompts", "max_tokens") if key in workload]
    out.append(f"repetitions={cfg.get('repetitions', row.get('repetitions'))}")
    if cfg.get("passes") is not None:
        out.append(f"passes={cfg['passes']}")
    return out


def _lower(row: Mapping[str, Any]) -> float:
    low, high = row.get("speedup_ci_low"), row.get("speedup_ci_high")
    return low if low is not None and high is not None and low < high else row["speedup"]


def recommend(rows: Sequence[Mapping[str, Any]], margin: float = 0.0) -> list[Recommendation]:
    """One :class:`Recommendation` per method/workload family with measured speedups."""
    families: dict[str, list[tuple[Mapping[str, Any], dict[str, Any]]]] = {}
    for row in rows:
        if row.get("status") != "ok" or row.get("method") == "baseline" or row.get("speedup") is None:
            continue
        cfg = _config(row)
        families.setdefault(_family(row, cfg), []).append((row, cfg))

    out = []
    for members in families.values():
        measured: dict[int, dict[int, float]] = {}
        lower: dict[int, dict[int, float]] = {}
        checked: dict[int, float] = {}
        checked_schedule = None
        for row, cfg in members:
            schedule = ((cfg.get("method") or {}).get("speculative_config") or {}).get(SCHEDULE_KEY)
            if schedule:
                checked[row["batch_size"]] = row["speedup"]
                checked_schedule = schedule
            else:
                measured.setdefault(row["batch_size"], {})[row["num_speculative_tokens"]] = row["speedup"]
                lower.setdefault(row["batch_size"], {})[row["num_speculative_tokens"]] = _lower(row)
        if not measured:
            continue
        best = {}
        for batch, by_k in measured.items():
            paying = {k: s for k, s in by_k.items() if lower[batch][k] > 1.0 + margin}
            if paying:
                best[batch] = max(paying.items(), key=lambda kv: (kv[1], -kv[0]))
            else:
                best[batch] = (0, None)
        row, cfg = members[0]
        label = f"{row['method']}"
        if row["method"] == "controlled":
            label += f" alpha={(cfg.get('method') or {}).get('alpha')}"
        label += f" on {row['workload']} ({row['model']})"
        out.append(Recommendation(
            label=label,
            best=dict(sorted(best.items())),
            measured={b: dict(sorted(v.items())) for b, v in sorted(measured.items())},
            lower=lower,
            schedule=theory.num_speculative_tokens_per_batch_size({b: k for b, (k, _) in best.items()}),
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


def _results_path(path: Path) -> Path:
    return path / "results.parquet" if path.is_dir() else path


def main(argv: list[str] | None = None) -> int:
    """Print the recommendations of a sweep; exit 2 when there is nothing to recommend from."""
    parser = argparse.ArgumentParser(
        prog="python -m specbench.recommend",
        description="Best K per batch-size range (vLLM num_speculative_tokens_per_batch_size) from a sweep.",
    )
    parser.add_argument("results", type=Path, nargs="+",
                        help="sweep directories or results.parquet files (e.g. a sweep and its schedule check)")
    parser.add_argument("--margin", type=float, default=0.0,
                        help="a K must beat plain decoding by more than this (e.g. 0.05)")
    args = parser.parse_args(argv)
    from specbench.results import ResultsError, read_rows

    paths = [_results_path(p) for p in args.results]
    rows = []
    try:
        for path in paths:
            rows += read_rows(path)
    except (ResultsError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    recommendations = recommend(rows, args.margin)
    if not recommendations:
        print(f"error: {', '.join(map(str, paths))}: no speculative cell with a measured speedup at a fixed K",
              file=sys.stderr)
        return 2
    print("\n\n".join(format_recommendation(r) for r in recommendations))
    if all(all(low == rec.measured[b][k] for k, low in by_k.items())
           for rec in recommendations for b, by_k in rec.lower.items()):
        print(f"\nnote: no speedup intervals in this sweep (one pass of one repetition): K was chosen "
              f"on point estimates with margin {args.margin}; rerun with passes>=2 or raise --margin")
    return 0


if __name__ == "__main__":
    sys.exit(main())
