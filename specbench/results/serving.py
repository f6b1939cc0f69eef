"""Serving cells' figures: per request, per cell, and against the baseline at the same offered load.

Definitions follow ``vllm bench serve``: TTFT is send to first token, TPOT
``(e2e - ttft) / (output tokens - 1)`` (requests of one token have none), ITL
the gaps between streamed chunks pooled over requests, E2E send to last
token. The warm-up requests are left out of every figure. A cell's window
runs from its first measured request's send to its last measured request's
last token; throughputs and goodput are over it, and the running batch is
its time average over the engine steps in it (Little's law's "requests in
service").

Across engine runs, each speedup is the geometric mean of the per-run
ratios, with the interval of :func:`specbench.stats.speedup_interval` over
the engine-to-engine spread pooled across the sweep's serving cells of that
figure. One rule says whether a configuration pays at a rate, the offline
verdicts' (:func:`specbench.stats.clears` on the E2E p50 speedup: its 95%
interval's lower end above 1, or its point estimate where there is no
interval), recorded per cell as ``serving_pays``; the verdict, the highest
rate at which it still pays, is :func:`specbench.analytic.verdicts.serving_verdict`'s.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specbench import stats
from specbench.load import ServedRequest, ServingMeasurement, ServingPlan
from specbench.measure import GeneratedRequest, Measurement, SpecCounters
from specbench.results.schema import ResultsError, engine_groups, engine_instance, read_rows

# Per cell: the load it met and what it achieved (cells/<id>.parquet and results.parquet; also the
# running batch at every step of the window, running_batch_t_s and running_batch).
CELL_COLUMNS = (
    "load_request_rate", "load_burstiness", "load_max_concurrency", "load_warmup_requests",
    "served_requests", "serving_window_s", "achieved_request_rate", "achieved_output_tokens_per_s", "goodput",
    "itl_s_p50", "itl_s_p90", "itl_s_p99", "queue_s_p50", "queue_s_p90", "queue_s_p99", "queue_s_mean",
    "running_batch_mean", "running_batch_p90", "running_batch_max",
)
# The speedups against the baseline at the same offered load (results.parquet only), each with its interval.
SPEEDUPS = {
    "tpot_p50": ("tpot_s_p50", False),
    "e2e_p50": ("e2e_s_p50", False),
    "e2e_p90": ("e2e_s_p90", False),
    "goodput": ("goodput", True),  # higher is better: the cell's over the baseline's
}
# The figure whose speedup decides whether a configuration pays at a rate: what a user waits for.
PAYS_ON = "e2e_p50"


def _measured(m: ServingMeasurement) -> list[ServedRequest]:
    return list(m.requests[m.warmup_requests:])


def request_latencies(request: ServedRequest) -> tuple[float | None, float | None, float | None, list[float]]:
    """One request's TTFT, TPOT, E2E latency and inter-chunk gaps (None where it streamed no token)."""
    if not request.chunk_s:
        return None, None, None, []
    ttft = request.chunk_s[0] - request.sent_s
    e2e = request.chunk_s[-1] - request.sent_s
    tokens = len(request.token_ids)
    tpot = (e2e - ttft) / (tokens - 1) if tokens > 1 else None
    return ttft, tpot, e2e, list(np.diff(request.chunk_s))


def window(m: ServingMeasurement) -> tuple[float, float]:
    """The measured window: first measured send to last measured token (seconds from the schedule's start)."""
    measured = _measured(m)
    start = min(r.sent_s for r in measured)
    end = max((r.chunk_s[-1] for r in measured if r.chunk_s), default=start)
    return start, end


def meets_slo(request: ServedRequest, slo: Mapping[str, float | None]) -> bool:
    """Whether a request meets every target set in ``slo`` (``ttft_ms``, ``tpot_ms``, ``e2e_ms``)."""
    ttft, tpot, e2e, _ = request_latencies(request)
    checks = {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e}
    for key, target in slo.items():
        if target is None:
            continue
        value = checks[key]
        if key == "tpot_ms" and value is None:
            continue  # one token: no TPOT, as vllm bench serve leaves it out
        if value is None or value * 1000.0 > target:
            return False
    return True


def running_batch(m: ServingMeasurement) -> tuple[list[float], list[int]]:
    """The engine steps inside the window: when each was reported and how many requests it ran."""
    start, end = window(m)
    inside = [s for s in m.steps if start <= s.at_s <= end]
    return [s.at_s for s in inside], [s.running for s in inside]


def time_weighted(times: Sequence[float], values: Sequence[int], start: float) -> tuple[float | None, float | None]:
    """Mean and 90th percentile over time of what each engine step ran: the running batch as Little's law
    counts it, not per step (steps are not equally long; a long prefill step weighs its seconds).

    vLLM reports a step's scheduler state when the step ends, so ``values[i]`` held from the report
    before it (``start`` for the first) to ``times[i]``.
    """
    if not values:
        return None, None
    durations = np.diff(np.concatenate([[min(start, times[0])], np.asarray(times, dtype=float)]))
    if durations.sum() <= 0:
        return float(np.mean(values)), float(np.percentile(values, 90))
    order = np.argsort(values, kind="stable")
    sorted_values = np.asarray(values, dtype=float)[order]
    cumulative = np.cumsum(durations[order]) / durations.sum()
    p90 = float(sorted_values[np.searchsorted(cumulative, 0.9)])
    return float(np.average(values, weights=durations)), p90


def cell_columns(m: ServingMeasurement, load: Mapping[str, Any]) -> dict[str, Any]:
    """A serving cell's own columns (:data:`CELL_COLUMNS` and the running-batch series) for one engine run."""
    measured = _measured(m)
    start, end = window(m)
    span = end - start
    itl = [gap for r in measured for gap in request_latencies(r)[3]]
    queues = [r.queue_s for r in measured if r.queue_s is not None]
    slo = {k: v for k, v in (load.get("slo") or {}).items() if v is not None}
    times, running = running_batch(m)
    mean, p90 = time_weighted(times, running, start)
    return {
        "load_request_rate": float(load["request_rate"]),
        "load_burstiness": float(load["burstiness"]),
        "load_max_concurrency": load.get("max_concurrency"),
        "load_warmup_requests": m.warmup_requests,
        "served_requests": len(measured),
        "serving_window_s": span,
        "achieved_request_rate": len(measured) / span if span > 0 else None,
        "achieved_output_tokens_per_s": sum(len(r.token_ids) for r in measured) / span if span > 0 else None,
        "goodput": sum(meets_slo(r, slo) for r in measured) / span if slo and span > 0 else None,
        **stats.latency_percentiles(itl, "itl_s"),
        **stats.latency_percentiles(queues, "queue_s"),
        "queue_s_mean": statistics.fmean(queues) if queues else None,
        "running_batch_mean": mean,
        "running_batch_p90": p90,
        "running_batch_max": max(running) if running else None,
        "running_batch_t_s": [t - start for t in times],
        "running_batch": running,
    }


def as_measurement(m: ServingMeasurement, plan: ServingPlan) -> Measurement:
    """The serving cell as the offline columns read it: one "repetition" that is the measured window.

    Latencies are the client's (:func:`request_latencies`); acceptance comes from
    the measured requests' own counts (what reached their outputs), drafted tokens
    per position from the engine steps in the window. Token ids cover every request
    sent, warm-up included, so the exactness check covers them all.
    """
    measured = _measured(m)
    start, end = window(m)
    generated = [GeneratedRequest(r.token_ids, *_ttft_e2e_tpot(r), drafts=r.drafts, accepted_tokens=r.accepted_tokens,
                                  last_accepted=r.last_accepted) for r in measured]
    width = max((len(r.accepted_histogram) - 1 for r in measured), default=0)
    accepted_per_pos = tuple(sum(sum(r.accepted_histogram[j] for j in range(p + 1, len(r.accepted_histogram)))
                                 for r in measured) for p in range(width))
    truncated_per_pos: tuple[int, ...] = ()
    for g in generated:
        cut = g.truncated_per_position()
        truncated_per_pos = tuple(
            (truncated_per_pos[i] if i < len(truncated_per_pos) else 0) + (cut[i] if i < len(cut) else 0)
            for i in range(max(len(truncated_per_pos), len(cut))))
    steps = [s for s in m.steps if start <= s.at_s <= end]
    drafted = [0] * max((len(s.drafted_per_pos) for s in steps), default=0)
    for s in steps:
        for i, n in enumerate(s.drafted_per_pos):
            drafted[i] += n
    counters = SpecCounters(
        drafts=sum(g.drafts or 0 for g in generated),
        draft_tokens=sum(s.draft_tokens for s in steps),
        accepted_tokens=sum(g.accepted_tokens or 0 for g in generated),
        accepted_per_pos=accepted_per_pos,
        drafted_per_pos=tuple(drafted),
    )
    with_tpot = [g for g in generated if g.tpot_s is not None]
    return Measurement(
        rep_wall_s=[end - start],
        rep_output_tokens=[sum(len(r.token_ids) for r in measured)],
        prompt_tokens=sum(len(p) for p in plan.prompts[m.warmup_requests:]),
        token_ids=[r.token_ids for r in m.requests],
        outputs_stable=True,
        counters=counters,
        ttft_s=[g.ttft_s for g in generated if g.ttft_s is not None],
        tpot_s=[g.tpot_s for g in with_tpot],
        e2e_s=[g.e2e_s for g in generated if g.e2e_s is not None],
        request_acceptance=[g.acceptance_length for g in generated],
        request_decode_passes=[g.decode_passes for g in generated],
        decode_s=sum(g.tpot_s * (len(g.token_ids) - 1) for g in with_tpot),
        decode_tokens=sum(len(g.token_ids) - 1 for g in with_tpot),
        truncated_accepted=sum(g.truncated_accepted for g in generated),
        truncated_per_pos=truncated_per_pos,
        reached_concurrency=max((s.running for s in steps), default=None),
    )


def _ttft_e2e_tpot(request: ServedRequest) -> tuple[float | None, float | None, float | None]:
    ttft, tpot, e2e, _ = request_latencies(request)
    return ttft, e2e, tpot


def is_serving_row(row: Mapping[str, Any]) -> bool:
    """Whether a results row is a serving cell's."""
    return row.get("load_request_rate") is not None


def with_serving_comparison(rows: list[dict[str, Any]], cells_dir: Path) -> list[dict[str, Any]]:
    """Merged rows with every serving cell's figures over its engine runs and its speedups against its baseline.

    Per-cell figures are medians over the engine runs (the running-batch series
    is engine run 0's). Speedups compare each engine run with its own baseline
    engine run, then combine as in :mod:`specbench.stats`; a cell pays at its
    rate by :func:`pays`. Offline rows are returned unchanged.
    """
    serving = [r for r in rows if is_serving_row(r)]
    if not serving:
        return rows
    runs = _cell_runs(cells_dir)
    for row in serving:
        mine = runs.get(row["config_hash"], [])
        for column in CELL_COLUMNS:
            known = [r[column] for r in mine if r.get(column) is not None]
            if known and isinstance(known[0], (int, float)) and not isinstance(known[0], bool):
                row[column] = statistics.median(known)
        if mine:
            row["running_batch_t_s"], row["running_batch"] = mine[0].get("running_batch_t_s"), mine[0].get("running_batch")
    by_id = {r["cell_id"]: r for group in runs.values() for r in group}
    # Per speedup, per cell: engine run (its baseline's engine instance) -> ratio, and the cell's engine instances.
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    engines: dict[str, list[str]] = {}
    for row in serving:
        if row.get("method") == "baseline":
            continue
        for name in SPEEDUPS:
            per_run: dict[int, float] = {}
            for run in runs.get(row["config_hash"], []):
                base = by_id.get(run.get("baseline_cell_id") or "")
                ratio = run_speedup(base, run, name)
                if ratio is not None and base is not None:
                    per_run[engine_instance(base)] = ratio
                    engines.setdefault(row["cell_id"], []).append(engine_instance(run))
            if per_run:
                ratios.setdefault(name, {})[row["cell_id"]] = per_run
    for name, cells in ratios.items():
        # One engine serves every rate of its configuration in an engine run: its cells repeat its deviations.
        spread = stats.engine_run_spread(list(cells.values()),
                                         engines=[tuple(dict.fromkeys(engines[c])) for c in cells],
                                         baselines=engine_groups([list(runs) for runs in cells.values()]))
        for row in serving:
            if row["cell_id"] in cells:
                interval = stats.speedup_interval(list(cells[row["cell_id"]].values()), spread, None)
                row[f"serving_speedup_{name}"] = interval.point
                row[f"serving_speedup_{name}_ci_low"] = interval.ci_low
                row[f"serving_speedup_{name}_ci_high"] = interval.ci_high
    for row in serving:
        if row.get(f"serving_speedup_{PAYS_ON}") is not None:
            row["serving_pays"] = pays(row)
    return rows


def run_speedup(base: Mapping[str, Any] | None, cell: Mapping[str, Any], name: str) -> float | None:
    """One engine run's speedup ``name`` (a key of :data:`SPEEDUPS`) against its baseline at the same
    load; None where either side failed or lacks the figure."""
    if base is None or base.get("status") != "ok" or cell.get("status") != "ok":
        return None
    column, higher_better = SPEEDUPS[name]
    b, c = base.get(column), cell.get(column)
    if not b or not c or not (math.isfinite(b) and math.isfinite(c)):
        return None
    return c / b if higher_better else b / c


def _cell_runs(cells_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every serving cell file of the sweep (each engine run's), grouped by config hash."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(cells_dir.glob("*.parquet")):
        if path.name.endswith(".tokens.parquet"):
            continue
        try:
            row = read_rows(path)[0]
        except (ResultsError, IndexError):
            continue
        if is_serving_row(row):
            found.setdefault(row.get("config_hash") or row["cell_id"], []).append(row)
    for group in found.values():
        group.sort(key=lambda r: r.get("engine_run") or 0)
    return found


def pays(row: Mapping[str, Any]) -> bool:
    """Whether a serving cell pays at its rate: the one rule of the verdicts, on the E2E p50 speedup."""
    return stats.clears(row[f"serving_speedup_{PAYS_ON}"], row.get(f"serving_speedup_{PAYS_ON}_ci_low"),
                        row.get(f"serving_speedup_{PAYS_ON}_ci_high"))


def offline_beside_serving(offline: Sequence[Mapping[str, Any]], served: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each speculative serving cell beside the offline cell of its configuration and workload at the batch
    size nearest (on a log scale) to the mean running batch its load induced, with the model's figure for each.

    The offline figure is the decode speedup (the ratio of TPOTs, which the batch size decides), held
    against the serving TPOT p50 speedup; None where no offline cell of that configuration was measured.
    """
    table = []
    for row in served:
        batch = row.get("running_batch_mean")
        if row.get("method") == "baseline" or row.get(f"serving_speedup_{PAYS_ON}") is None or not batch:
            continue
        peers = [o for o in offline if o.get("method_label") == row.get("method_label")
                 and o.get("workload") == row.get("workload") and o.get("decode_speedup") is not None]
        peer = min(peers, key=lambda o: abs(math.log(o["batch_size"] / batch)), default=None)
        table.append({
            "workload": row.get("workload"), "config": row.get("method_label"),
            "request_rate": row.get("load_request_rate"), "running_batch_mean": batch,
            "serving_tpot_speedup": row.get("serving_speedup_tpot_p50"),
            "serving_predicted": row.get("serving_predicted_speedup"),
            "offline_batch": peer and peer["batch_size"],
            "offline_decode_speedup": peer and peer["decode_speedup"],
            "offline_predicted": peer and peer.get("predicted_decode_speedup"),
            # A flagged or mismatched serving cell stays in the table but out of any verdict drawn from it.
            "left_out": bool(row.get("flagged")) or row.get("exactness") == "mismatch",
        })
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m specbench.results.serving OFFLINE SERVING``: the offline speedup at the batch size each
    rate induced beside the serving speedup at that rate, and what the model predicts for both."""
    import argparse

    import pandas as pd

    from specbench.results.schema import results_path

    parser = argparse.ArgumentParser(prog="python -m specbench.results.serving", description=main.__doc__)
    parser.add_argument("offline", help="an offline sweep directory (or its results.parquet)")
    parser.add_argument("serving", help="a serving sweep directory (or its results.parquet)")
    args = parser.parse_args(argv)
    offline = [r for r in read_rows(results_path(args.offline)) if not is_serving_row(r) and r.get("status") == "ok"]
    served = [r for r in read_rows(results_path(args.serving)) if is_serving_row(r) and r.get("status") == "ok"]
    table = offline_beside_serving(offline, served)
    if not table:
        print("no speculative serving cell compared with its baseline", file=sys.stderr)
        return 1
    print(pd.DataFrame(table).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
