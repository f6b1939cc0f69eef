"""``python -m specbench.analytic.recommend <sweep dir or results.parquet>...``: the best K per batch-size range.

From a sweep's measured speedups, for each method and workload (and every
other setting held fixed: :func:`specbench.results.curve_key`), the K with
the highest speedup at each measured batch size among those that beat plain
decoding, or 0 where none does (:func:`specbench.analytic.verdicts.best_row`,
the one rule the report's best configuration, verdicts, schedule and memory
table use too), walked up the sweep's planned batch sizes
(:func:`specbench.analytic.verdicts.schedule_evidence`): the first batch
size with no judged cell (flagged, failed, mismatched, never measured, or,
past the first, measured in other engine modes than its baseline's unless
the modes were pinned) gets K = 0 and ends the schedule, so it never spans a
batch size without evidence. Only rows
fit to be judged count (:func:`specbench.results.recommendable`: outputs that
do not mismatch the baseline's, numerical ties allowed; not flagged). A K
pays (:func:`specbench.analytic.verdicts.pays`) when the lower end of its 95% speedup interval exceeds
1 + margin; rows without an interval (one engine run of one repetition) are
judged by their point estimate, which is then only as good as the run's
noise (``--margin`` asks for a clear lead). Consecutive batch sizes
with the same K merge into vLLM's ``num_speculative_tokens_per_batch_size``
schedule of inclusive (start, end, K) ranges
(:func:`specbench.analytic.speedup.num_speculative_tokens_per_batch_size`): grid point
b's K holds up to the next grid point, the smallest point's K reaches down to
batch size 1.

The output is ready to paste into a ``speculative_config``, and comes with
the verification sweep that measures the schedule as vLLM runs it
(``method.k_schedule``, :meth:`Recommendation.check_command`; ``--verify``
prints only those). ``--write DIR/method/NAME.yaml`` writes one schedule as a
method config, its source recorded in comments. Rows measured with a
schedule, and the fixed-K rows of the sweep that measured it, never choose
K: they are the check, and the schedule's speedup is set beside each fixed
K's and the best one's at each batch size (:func:`comparisons`).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specbench import methods, sampling
from specbench.analytic import speedup
from specbench.analytic.verdicts import (
    AgainstFixed,
    Grid,
    Stop,
    has_interval,
    lower_bound,
    passed_over,
    schedule_against_fixed,
    schedule_caveats,
    schedule_evidence,
    schedule_loses_to,
)
from specbench.results.files import planned_cell_ids
from specbench.results.schema import SCHEDULE_KEY, curve_key, method_variant, recommendable, results_path, row_config


@dataclass(frozen=True)
class Point:
    """One measured speedup and its 95% interval (None, None without one)."""

    speedup: float
    low: float | None = None
    high: float | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Point:
        """A row's speedup and interval (a zero-width interval is none)."""
        if has_interval(row):
            return cls(float(row["speedup"]), float(row["speedup_ci_low"]), float(row["speedup_ci_high"]))
        return cls(float(row["speedup"]))

    def text(self) -> str:
        """``1.32x [1.20, 1.45]``, or ``1.32x`` without an interval."""
        return f"{self.speedup:.2f}x" + (f" [{self.low:.2f}, {self.high:.2f}]" if self.low is not None else "")


@dataclass(frozen=True)
class Comparison:
    """The schedule against the fixed Ks at one batch size of a check."""

    batch: int
    schedule_k: int  # the K the schedule runs at this batch size
    threshold: bool  # the schedule switches K at this batch size (a range starts here, past the first)
    schedule: Point
    fixed: dict[int, Point]  # K -> its speedup, from the check's own engine runs where measured there
    best_k: int  # the fastest fixed K here
    loses: bool  # the schedule is shown slower than some fixed K (verdicts.schedule_loses_to)
    # K -> the schedule over that fixed K, its interval simultaneous over the fixed Ks (schedule_against_fixed)
    against: dict[int, AgainstFixed] = field(default_factory=dict)
    loses_to: tuple[int, ...] = ()  # the fixed Ks it is shown slower than

    def text(self) -> str:
        """One line: the schedule's speedup beside each fixed K's, and a warning where it loses."""
        fixed = ", ".join(f"K={k} {p.text()}" for k, p in sorted(self.fixed.items()))
        mark = " <- threshold: the schedule switches K here" if self.threshold else ""
        line = (f"  batch {self.batch:>4}: schedule (K={self.schedule_k}) {self.schedule.text()}; "
                f"best fixed K={self.best_k} {self.fixed[self.best_k].text()}; fixed: {fixed}{mark}")
        for k in self.loses_to:
            line += f"\n    WARNING: at batch {self.batch} the schedule loses to fixed K={k}: {self.ratio_text(k)}"
        return line

    def ratio_text(self, k: int) -> str:
        """``schedule / fixed K=4 0.87x [0.82, 0.92], paired over 3 engine runs``: one comparison, in words."""
        a = self.against[k]
        interval = f" [{a.low:.2f}, {a.high:.2f}]" if a.low is not None and a.high is not None else " (no interval)"
        how = (f"paired over {a.paired_runs} engine runs" if a.paired_runs
               else "both cells' intervals combined (not paired)")
        return (f"schedule / fixed K={k} {a.ratio:.2f}x{interval}, {how}, simultaneous over "
                f"{len(self.against)} fixed K{'s' if len(self.against) > 1 else ''}")


def caveats_text(gathered: Sequence[tuple[str, Sequence[int]]]) -> str:
    """``caveats: X (batch 16); Y (batch 4, 16)``: gathered caveats
    (:func:`specbench.analytic.verdicts.gathered_caveats`), each with its batch sizes; "" without any."""
    if not gathered:
        return ""
    texts = [caveat + (f" (batch {', '.join(str(b) for b in batches)})" if batches else "")
             for caveat, batches in gathered]
    return f"caveat{'s' if len(texts) > 1 else ''}: " + "; ".join(texts)


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
    method_config: dict[str, Any] = field(default_factory=dict)  # the family's resolved method config
    intervals: dict[int, dict[int, Point]] = field(default_factory=dict)  # batch -> K -> fixed K's measurement
    checked_points: dict[int, Point] = field(default_factory=dict)  # batch -> the schedule's measurement
    beside: dict[int, dict[int, Point]] = field(default_factory=dict)  # batch -> K -> fixed K in the check's runs
    sources: tuple[str, ...] = ()  # sweep names the fixed-K evidence comes from
    batch_overrides: list[str] = field(default_factory=list)  # workload/engine settings to repeat in a check
    stop: Stop | None = None  # the first planned batch size without a judged cell: K = 0 from there, nothing past it
    temperature: float = 0.0  # the family's sampling temperature (0: greedy): a sampled family is another curve
    # batch -> the fixed Ks measured there but not judged (label, why): K was chosen without them (verdicts.passed_over)
    passed_over: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    checked_cells: dict[int, Mapping[str, Any]] = field(default_factory=dict)  # batch -> the schedule's row
    fixed_cells: dict[int, dict[int, Mapping[str, Any]]] = field(default_factory=dict)  # batch -> K -> the row compared
    # The caveats of the cells the schedule's Ks stand on, each with its batch sizes (verdicts.schedule_caveats)
    caveats: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    def caveats_text(self) -> str:
        """What qualifies the speedups the schedule stands on (:func:`caveats_text`); "" without any."""
        return caveats_text(self.caveats)

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

    @property
    def runnable(self) -> bool:
        """Whether vLLM runs a K schedule for this method (:attr:`specbench.methods.Method.schedules`)."""
        registered = methods.get(self.method)
        return registered is not None and registered.schedules

    def k_schedule(self) -> str:
        """The schedule as a Hydra override writes it: ``[[1,4,4],[5,64,2]]``."""
        return "[" + ",".join(f"[{a},{b},{k}]" for a, b, k in self.schedule) + "]"

    def check_command(self) -> str:
        """The verification sweep: the schedule and the fixed Ks it chose, at every batch size of the source.

        One Hydra multirun (so any launcher runs it, SLURM included), at
        :meth:`check_batch_sizes`: K is
        swept over the fixed Ks the schedule uses, ``method.k_schedule`` over
        null (fixed K) and the schedule (its cells take the schedule's largest
        K, so they are measured once), with the source's engine runs,
        repetitions, workload and engine settings, and fresh engines in each
        engine run, into its own sweep directory (:meth:`verify_sweep_name`).
        """
        ks = ",".join(str(k) for k in sorted({k for _, _, k in self.schedule if k}))
        sizes = ",".join(str(b) for b in self.check_batch_sizes())
        return (
            "python -m specbench -m " + " ".join(self.overrides + self.batch_overrides)
            + f" batch_size={sizes} num_speculative_tokens={ks} 'method.{methods.SCHEDULE}=null,{self.k_schedule()}'"
            + f" sweep_name={self.verify_sweep_name()}"
        )

    def check_batch_sizes(self) -> list[int]:
        """Every batch size of the source, and the last one before each threshold (where the schedule
        switches K): the check sees both sides of each switch, one request apart."""
        before = {start - 1 for start, _, _ in self.schedule[1:]}
        return sorted(set(self.best) | before)

    def verify_sweep_name(self) -> str:
        """Where the check goes: ``<source sweep>_verify_<method>_<workload>``, one directory per family
        (a sweep directory's results are its own plan's cells, so families cannot share one)."""
        family = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{self.variant}_{self.workload}")
        source = self.sources[0] if len(self.sources) == 1 else "schedule"
        return f"{source}_verify_{family}"

    def method_yaml(self, header: Sequence[str]) -> str:
        """A ``conf/method/<name>.yaml`` of this method with the schedule, ``header`` as its first comments.

        The method's own keys and ``speculative_config`` as the source sweep
        resolved them; ``num_speculative_tokens`` stays the ``${num_speculative_tokens}``
        of every method config (a scheduled cell sets it to the schedule's largest K).
        """
        config = {k: v for k, v in self.method_config.items() if k not in ("name", methods.SCHEDULE)}
        speculative = {k: v for k, v in (config.pop("speculative_config", None) or {}).items() if k != SCHEDULE_KEY}
        speculative["num_speculative_tokens"] = "${num_speculative_tokens}"
        body = yaml.safe_dump({key: value for key, value in config.items() if value is not None},
                              sort_keys=False) if any(v is not None for v in config.values()) else ""
        return (
            "".join(f"# {line}\n" if line else "#\n" for line in header)
            + f"name: {self.method}\n"
            + f"{methods.SCHEDULE}: {json.dumps([list(r) for r in self.schedule])}\n"
            + body
            + yaml.safe_dump({"speculative_config": speculative}, sort_keys=False)
        )

    def evidence_lines(self) -> list[str]:
        """Per batch size: each fixed K's speedup (with interval) and the K chosen."""
        return [f"batch {b}: " + ", ".join(f"K={k} {p.text()}" for k, p in sorted(self.intervals[b].items()))
                + f" -> K={self.best[b][0]}" for b in self.best]


def _overrides(row: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    method = {**(cfg.get("method") or {}), "name": row["method"]}
    workload = cfg.get("workload") or {}
    registered = methods.get(row["method"])
    out = [f"model={row['model']}"]
    out += registered.overrides(method) if registered else [f"method={row['method']}"]
    out.append(f"workload={row['workload']}")
    out += [f"workload.{key}={workload[key]}" for key in ("num_prompts", "max_tokens") if key in workload]
    # Which prompts (selection, its seed, the source): a check on other prompts measures another
    # acceptance. The prompt cap travels with the check's own settings (_check_overrides).
    out += [f"workload.{key}={_value(value)}" for key, value in workload.items()
            if key not in ("name", "num_prompts", "max_tokens", "max_prompt_tokens") and value is not None]
    out.append(f"repetitions={cfg.get('repetitions', row.get('repetitions'))}")
    # A sampled family is another curve (acceptance falls with temperature): its schedule is checked there.
    out += [f"{key}={value}" for key, value in sampling.identity_keys(cfg).items()]
    if cfg.get("engine_runs") is not None:
        out.append(f"engine_runs={cfg['engine_runs']}")
    return out


def _sweep(cfg: Mapping[str, Any]) -> str:
    return str(cfg.get("sweep_name") or "")


def recommend(rows: Sequence[Mapping[str, Any]], margin: float = 0.0, grid: Grid | None = None) -> list[Recommendation]:
    """One :class:`Recommendation` per method/workload family with recommendable speedups.

    ``rows``: the sweep's cells, any status (a failed or flagged one is where
    the schedule stops); ``grid``: the planned grid
    (:meth:`specbench.analytic.verdicts.Grid.of`; by default the one the rows imply).

    Rows measured with a K schedule are its check, never evidence for K; so are
    the fixed-K rows of the sweeps that measured one (a verification sweep):
    choosing K again from them would be choosing on the check's own noise. They
    are the schedule's comparison instead, measured in the same engine runs.
    Where only a check's rows are given, its fixed-K rows choose K.
    """
    grid = grid or Grid.of(rows)
    families: dict[str, list[tuple[Mapping[str, Any], dict[str, Any]]]] = {}
    every: dict[str, list[tuple[Mapping[str, Any], dict[str, Any]]]] = {}
    for row in rows:
        if row.get("method") in ("baseline", None) or row.get("load_request_rate") is not None:
            continue
        key = curve_key(row, across_k=True)
        every.setdefault(key, []).append((row, row_config(row)))
        if recommendable(row):
            families.setdefault(key, []).append((row, row_config(row)))

    out = []
    for key, members in families.items():
        checks = {_sweep(cfg) for _, cfg in members if _schedule_of(cfg)}
        by_batch: dict[int, list[Mapping[str, Any]]] = {}
        beside_rows: dict[int, list[Mapping[str, Any]]] = {}
        checked: dict[int, Point] = {}
        checked_cells: dict[int, Mapping[str, Any]] = {}
        checked_schedule = None
        for row, cfg in members:
            schedule = _schedule_of(cfg)
            if schedule:
                checked[row["batch_size"]] = Point.of(row)
                checked_cells[row["batch_size"]] = row
                checked_schedule = schedule
            elif _sweep(cfg) in checks:
                beside_rows.setdefault(row["batch_size"], []).append(row)
            else:
                by_batch.setdefault(row["batch_size"], []).append(row)
        evidence = by_batch or beside_rows
        if not evidence:
            continue
        # The evidence's sweeps, any status: where a cell failed or was flagged, the schedule stops.
        sources = {_sweep(c) for r, c in members if not _schedule_of(c) and (
            (_sweep(c) in checks) == (not by_batch))}
        best, stop = schedule_evidence(evidence, [r for r, c in every[key] if not _schedule_of(c)
                                                  and _sweep(c) in sources], grid, margin)
        row, cfg = next((r, c) for r, c in members if not _schedule_of(c))
        variant = str(method_variant(row))
        method_config = dict(cfg.get("method") or {})
        method_config.pop(methods.SCHEDULE, None)
        temperature = float(row.get("temperature") or 0.0)
        out.append(Recommendation(
            label=f"{variant} on {row['workload']}{f' at temperature {temperature:g}' if temperature else ''} "
                  f"({row['model']})",
            method=str(row["method"]),
            variant=variant,
            workload=str(row["workload"]),
            model=str(row["model"]),
            best=dict(sorted(best.items())),
            measured={b: dict(sorted((r["num_speculative_tokens"], r["speedup"]) for r in v))
                      for b, v in sorted(evidence.items())},
            lower={b: {r["num_speculative_tokens"]: lower_bound(r) for r in v} for b, v in evidence.items()},
            schedule=speedup.num_speculative_tokens_per_batch_size(
                {b: k for b, (k, _) in best.items()} | ({int(stop.at): 0} if stop else {})),
            overrides=_overrides(row, cfg),
            checked={b: p.speedup for b, p in sorted(checked.items())},
            checked_schedule=checked_schedule,
            method_config=method_config,
            intervals={b: {r["num_speculative_tokens"]: Point.of(r) for r in v} for b, v in evidence.items()},
            checked_points=dict(sorted(checked.items())),
            beside={b: {r["num_speculative_tokens"]: Point.of(r) for r in v} for b, v in beside_rows.items()},
            sources=tuple(sorted({_sweep(c) for r, c in members if _sweep(c) and r["batch_size"] in evidence
                                  and not _schedule_of(c) and (_sweep(c) not in checks or not by_batch)})),
            batch_overrides=_check_overrides(cfg),
            stop=stop,
            temperature=temperature,
            # best walks the planned batch sizes from the smallest: min(best) is the walk's first.
            passed_over={b: found for b in best if (found := passed_over(
                [r for r, c in every[key] if not _schedule_of(c) and _sweep(c) in sources and r["batch_size"] == b],
                first=b == min(best)))},
            checked_cells=checked_cells,
            # What the schedule is compared with: the check's own fixed Ks where it measured them, else the source's.
            fixed_cells={b: {r["num_speculative_tokens"]: r for r in beside_rows.get(b) or evidence.get(b) or ()}
                         for b in checked_cells},
            caveats=schedule_caveats(evidence, best),
        ))
    return sorted(out, key=lambda r: r.label)


def _schedule_of(cfg: Mapping[str, Any]) -> list[list[int]] | None:
    """The K schedule a row ran with (its speculative_config's, as vLLM read it), or None."""
    return ((cfg.get("method") or {}).get("speculative_config") or {}).get(SCHEDULE_KEY) or None


def _check_overrides(cfg: Mapping[str, Any]) -> list[str]:
    """Settings of the source sweep a check must repeat beyond :func:`_overrides`: the prompt cap, the engine."""
    workload = cfg.get("workload") or {}
    out = [f"workload.max_prompt_tokens={workload['max_prompt_tokens']}"] if "max_prompt_tokens" in workload else []
    engine = cfg.get("engine") or {}
    out += [f"engine.{key}={_value(engine[key])}" for key in (
        "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "cpu_kvcache_space_gib")
        if key in engine]
    out += [f"{key}={_value(cfg[key])}" for key in ("warmup", "seed") if key in cfg]
    return out


def _value(value: Any) -> str:
    """A setting as a Hydra override writes it (null, true, 4096)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def comparisons(rec: Recommendation) -> list[Comparison]:
    """The measured schedule against the fixed Ks at each batch size it was measured at.

    The fixed Ks are those measured in the check's own engine runs where it
    measured them (same engines, same engine runs), else the source sweep's.
    Whether the schedule loses is decided in :mod:`specbench.analytic.verdicts`
    (:func:`~specbench.analytic.verdicts.schedule_against_fixed`): on the ratio
    of the schedule's speedup to each fixed K's, paired run by run where the
    two share their baseline engines, simultaneous over the fixed Ks.
    """
    if not rec.checked_schedule:
        return []
    starts = {int(start) for start, _, _ in rec.checked_schedule[1:]}
    max_k = max(int(k) for _, _, k in rec.checked_schedule)
    out = []
    for batch, point in rec.checked_points.items():
        fixed = rec.beside.get(batch) or rec.intervals.get(batch) or {}
        if not fixed:
            continue
        best_k = max(fixed, key=lambda k: (fixed[k].speedup, -k))
        cells = rec.fixed_cells.get(batch) or {}
        against = schedule_against_fixed(rec.checked_cells[batch], cells) if batch in rec.checked_cells else {}
        loses_to = schedule_loses_to(against)
        out.append(Comparison(
            batch=batch,
            schedule_k=_scheduled_k(rec.checked_schedule, batch, max_k),
            threshold=_crosses(rec.checked_schedule, batch, sorted(rec.checked_points), starts),
            schedule=point, fixed=dict(fixed), best_k=best_k,
            loses=bool(loses_to), against=against, loses_to=tuple(loses_to),
        ))
    return out


def _scheduled_k(schedule: Sequence[Sequence[int]], batch: int, max_k: int) -> int:
    """The K vLLM runs at ``batch`` under ``schedule`` (a valid one: ordered, no gaps; the last K holds on)."""
    k = max_k
    for start, _, entry_k in schedule:
        if start <= batch:
            k = int(entry_k)
    return min(k, max_k)


def _crosses(schedule: Sequence[Sequence[int]], batch: int, measured: Sequence[int], starts: set[int]) -> bool:
    """Whether a range of the schedule starts between the measured batch size before ``batch`` and ``batch``."""
    before = max((b for b in measured if b < batch), default=None)
    return before is not None and any(before < start <= batch for start in starts)


def format_recommendation(rec: Recommendation) -> str:
    """The recommendation as text: the evidence per batch size, the schedule, its check and how it went."""
    lines = [rec.label]
    for batch, (k, speedup) in rec.best.items():
        others = ", ".join(f"K={kk} {s:.2f}x" for kk, s in rec.measured[batch].items())
        choice = f"K={k} ({speedup:.2f}x)" if k else "K=0 (no K clearly beats plain decoding)"
        without = "".join(f"; {label} not judged here ({why}): chosen without it"
                          for label, why in rec.passed_over.get(batch, ()))
        lines.append(f"  batch {batch:>4}: {choice:<40} measured: {others}{without}")
    if rec.stop is not None:
        lines.append(f"  {rec.stop.text()}: K=0 from batch {rec.stop.at:g} on (no evidence there)")
    if rec.caveats:
        lines.append(f"  {rec.caveats_text()}")
    if rec.max_k == 0:
        lines.append("  recommendation: no speculation at any measured batch size")
    else:
        lines.append(f"  schedule (start, end, K): {rec.schedule}")
        lines.append("  speculative_config:")
        lines += ["    " + line for line in rec.speculative_config_yaml().splitlines()]
        if rec.runnable:
            lines.append("  verify it (the schedule beside its fixed Ks, fresh engines, the source's engine runs):")
            lines.append("    " + rec.check_command())
        else:
            lines.append(f"  note: vLLM 0.32 does not schedule K for method={rec.method}; this schedule cannot run")
    found = comparisons(rec)
    if found:
        ranges = methods.schedule_text(rec.checked_schedule or [])
        lines.append(f"  measured with schedule K=[{ranges}] (speedup [95% interval]):")
        lines += [c.text() for c in found]
    return "\n".join(lines)


def _select(recommendations: Sequence[Recommendation], method: str | None, workload: str | None
            ) -> list[Recommendation]:
    return [r for r in recommendations if (method is None or method in (r.method, r.variant))
            and (workload is None or r.workload == workload)]


def _digest(path: Path) -> str:
    """The first 12 hex digits of a results file's sha256: which results a written schedule came from."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def write_method(rec: Recommendation, target: Path, paths: Sequence[Path], rows: Sequence[Mapping[str, Any]]
                 ) -> str:
    """Write ``rec`` as a method config at ``target`` (``<dir>/method/<name>.yaml``); the command that runs it.

    Hydra finds it as ``method=<name>`` once ``<dir>`` is on its search path
    (``hydra.searchpath=[file://<dir>]``), beside the shipped method configs.
    """
    folder = target.resolve().parent.parent
    sweeps = sorted({str(row_config(r).get("sweep_name")) for r in rows if row_config(r).get("sweep_name")})
    settings = [o for o in rec.overrides + rec.batch_overrides if not o.startswith("method")]
    run = (f"python -m specbench -m hydra.searchpath=[file://{folder}] method={target.stem} "
           + " ".join(settings) + f" batch_size={','.join(str(b) for b in rec.best)}")
    header = [
        f"K schedule for {rec.label}, from `python -m specbench.analytic.recommend`",
        *(f"source: {p} (results sha256 {_digest(p)})" for p in paths),
        f"sweep(s): {', '.join(sweeps) or '?'}; written {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "evidence (speedup [95% interval] per fixed K; the K chosen):",
        *(f"  {line}" for line in rec.evidence_lines()),
        f"run it:    {run}",
        f"verify it: {rec.check_command()}",
    ]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(rec.method_yaml(header))
    return run


def main(argv: list[str] | None = None) -> int:
    """Print the recommendations of a sweep (or write one as a method config); exit 2 when there is nothing."""
    parser = argparse.ArgumentParser(
        prog="python -m specbench.analytic.recommend",
        description="Best K per batch-size range (vLLM num_speculative_tokens_per_batch_size) from a sweep.",
    )
    parser.add_argument("results", type=Path, nargs="+",
                        help="sweep directories or results.parquet files (e.g. a sweep and its verification sweep)")
    parser.add_argument("--margin", type=float, default=0.0,
                        help="a K must beat plain decoding by more than this (e.g. 0.05)")
    parser.add_argument("--method", help="only this method (or variant, e.g. 'draft_model/small')")
    parser.add_argument("--workload", help="only this workload")
    parser.add_argument("--write", type=Path, metavar="DIR/method/NAME.yaml",
                        help="write the one selected recommendation as a method config Hydra loads as method=NAME "
                             "with hydra.searchpath=[file://DIR]")
    parser.add_argument("--verify", action="store_true",
                        help="print only the verification sweep of each selected recommendation, one command a line")
    args = parser.parse_args(argv)
    from specbench.results.schema import ResultsError, read_rows

    if args.write is not None and (args.write.suffix != ".yaml" or args.write.resolve().parent.name != "method"):
        print(f"error: --write {args.write}: must be DIR/method/NAME.yaml (Hydra's method group under DIR, "
              "found with hydra.searchpath=[file://DIR] as method=NAME)", file=sys.stderr)
        return 2
    paths = [results_path(p) for p in args.results]
    rows = []
    grid = Grid()
    try:
        for path in paths:
            found = read_rows(path)
            rows += found
            grid = grid.union(Grid.of(found, planned_cell_ids(path.parent)))
    except (ResultsError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    recommendations = _select(recommend(rows, args.margin, grid), args.method, args.workload)
    left_out = [r for r in rows if r.get("method") != "baseline" and r.get("speedup") is not None
                and not recommendable(r)]
    if left_out:
        print(f"note: {len(left_out)} cell(s) left out because their outputs mismatch the baseline's or "
              "they are flagged: " + ", ".join(str(r.get("cell_id")) for r in left_out), file=sys.stderr)
    if not recommendations:
        selected = "".join(f" --{k} {v}" for k, v in (("method", args.method), ("workload", args.workload)) if v)
        print(f"error: {', '.join(map(str, paths))}: no speculative cell{selected} with a measured speedup at a "
              "fixed K (whose outputs match the baseline's, numerical ties allowed, and that is not flagged)",
              file=sys.stderr)
        return 2
    if args.write is not None:
        if len(recommendations) > 1:
            print("error: --write writes one method config, and these results hold "
                  f"{len(recommendations)} recommendations: " + "; ".join(r.label for r in recommendations)
                  + "; choose one with --method and --workload", file=sys.stderr)
            return 2
        rec = recommendations[0]
        problem = ("no K beats plain decoding at any batch size" if rec.max_k == 0 else
                   f"vLLM 0.32 does not schedule K for method={rec.method}" if not rec.runnable else None)
        if problem:
            print(f"error: --write {args.write}: {rec.label}: {problem}; nothing to write", file=sys.stderr)
            return 2
        print(f"wrote {args.write}; run it with:\n  {write_method(rec, args.write, paths, rows)}")
        print(f"verify it with:\n  {rec.check_command()}")
        return 0
    if args.verify:
        runnable = [r for r in recommendations if r.runnable and r.max_k]
        for rec in recommendations:
            if rec not in runnable:
                print(f"note: {rec.label}: nothing to verify (" + ("no K pays" if not rec.max_k else
                      f"vLLM 0.32 does not schedule K for method={rec.method}") + ")", file=sys.stderr)
        print("\n".join(r.check_command() for r in runnable))
        return 0 if runnable else 2
    print("\n\n".join(format_recommendation(r) for r in recommendations))
    if all(all(low == rec.measured[b][k] for k, low in by_k.items())
           for rec in recommendations for b, by_k in rec.lower.items()):
        print(f"\nnote: no speedup intervals in this sweep (one engine run of one repetition): K was chosen "
              f"on point estimates with margin {args.margin}; rerun with engine_runs>=2 or raise --margin")
    return 0


if __name__ == "__main__":
    sys.exit(main())
