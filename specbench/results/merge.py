"""The merge: a sweep's cell files into results rows, compared and flagged.

One row per cell, its engine runs combined, every speculative cell compared
against its baseline (same model, workload, batch size, engine settings and
engine run): speedup with its interval, exactness, and flags for
measurements that need care.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from specbench import stats
from specbench.analytic import theory
from specbench.results.files import CellFiles
from specbench.results.metrics import median_known
from specbench.results.provenance import provenance_differences
from specbench.results.schema import ResultsError, read_rows

# A speculative cell is flagged when at least this share of its outputs loop.
LOOPING_FLAG_SHARE = 0.1
# A measurement is flagged when other processes kept more than this share of
# the machine's cores busy while it ran.
OTHER_CPU_FLAG_SHARE = 0.1


def merge(cells_dir: Path, cell_ids: Iterable[str]) -> list[dict[str, Any]]:
    """Combine a sweep's cell files into results rows, one per cell (engine runs combined).

    Speculative cells get speedup and exactness against their baseline in the
    same engine run, provided both were measured with the same schema, software and
    requests (:func:`provenance_differences`); otherwise the comparison fails
    with the reason and no speedup. The speedup is the geometric mean of the
    per-run ratios. Its intervals use the engine-to-engine spread of log
    ratios pooled over every cell of the sweep, its degrees of freedom counted
    per shared baseline (``stats.pooled_engine_run_spread``); with a single pass
    everywhere only the within-engine spread of the repetitions is known, and
    the method tag says so; with one repetition as well there is no interval.
    Cells are flagged when their engine runs disagree beyond that spread, when a
    run ran under heavy load, when baseline and cell ran on different
    hardware, when their outputs differ from the baseline's, or when their
    outputs loop. Missing cells are skipped; unreadable ones become failed
    rows naming the file.
    """
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for cell_id in cell_ids:
        files = CellFiles(cells_dir, cell_id)
        if not files.row.exists():
            continue
        try:
            row = read_rows(files.row)[0]
        except ResultsError as exc:
            row = {"cell_id": cell_id, "status": "failed", "error": str(exc)}
        by_cell.setdefault(row.get("config_hash") or cell_id, []).append(row)

    rows = []
    for group in by_cell.values():
        group.sort(key=lambda r: r.get("engine_run") or 0)
        rows.append(_combine_engine_runs(cells_dir, group))
    speculative = [r for r in rows if r.get("method") != "baseline" and r.get("speedup_per_engine_run")]
    spread = stats.pooled_engine_run_spread(
        [r["speedup_per_engine_run"] for r in speculative], groups=[r["_baseline"] for r in speculative]
    )
    for row in speculative:
        interval = stats.speedup_interval(row["speedup_per_engine_run"], spread, row.pop("_within", None))
        row |= {
            "speedup": interval.point,
            "speedup_ci_low": interval.ci_low,
            "speedup_ci_high": interval.ci_high,
            "speedup_rerun_low": interval.rerun_low,
            "speedup_rerun_high": interval.rerun_high,
            "speedup_ci_method": interval.method,
        }
        if interval.engine_runs_disagree:
            row["flag_reasons"] = (row.get("flag_reasons") or []) + [
                "engine runs disagree: " + ", ".join(f"{r:.2f}x" for r in row["speedup_per_engine_run"])
            ]
    for row in rows:
        for private in ("_within", "_baseline"):
            row.pop(private, None)
        row["flagged"] = bool(row.get("flag_reasons"))
    return rows


def _combine_engine_runs(cells_dir: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    first = dict(runs[0])
    ok = [r for r in runs if r.get("status") == "ok"]
    if len(ok) < len(runs):
        failed = next(r for r in runs if r.get("status") != "ok")
        return first | {"status": "failed", "error": failed.get("error"), "engine_run": None}
    row = first | {"engine_run": None, "engine_runs": len(runs)}
    if len(runs) > 1:
        row |= _across_engine_runs(cells_dir, runs)
        for key in ("drafts", "draft_tokens", "accepted_tokens", "target_passes"):
            row[key] = sum(r[key] or 0 for r in runs)
        row |= _pooled_acceptance(runs, row)
    if row["method"] == "baseline":
        # A baseline's speedup is 1 by definition: there is nothing to put an interval on.
        return row | {"speedup": 1.0, "speedup_ci_low": None, "speedup_ci_high": None,
                      "speedup_ci_method": "none: the baseline itself",
                      "speedup_per_engine_run": [1.0] * len(runs), "decode_speedup": 1.0,
                      "exact_match": True, "mismatched_requests": 0}
    return row | _compare(cells_dir, runs)


_LATENCY_COLUMNS = tuple(f"{m}_p{q}" for m in ("ttft_s", "tpot_s", "e2e_s") for q in (50, 90, 99))
# Provenance that should not differ between engine runs, but can (a cluster
# launcher puts engine runs on several hosts): every distinct value is kept.
_JOINED_COLUMNS = ("host", "hardware", "gpu_state", "specbench_version", "git_commit", "vllm_version",
                   "torch_version", "transformers_version", "python_version")


def _across_engine_runs(cells_dir: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-cell columns of a merged row, each describing every engine run (not the first run's copy).

    Time summaries are over the repetitions of all engine runs; latency
    percentiles, TPOT, warm-up and start-up are medians (TPOT a mean) of the
    engine runs' own; loads and looping outputs the worst engine run; outputs are stable
    only if every repetition of every engine run produced the same tokens.
    """
    reps = [w for r in runs for w in r["wall_time_s_reps"]]
    wall = stats.summarize(reps)
    tps = stats.summarize([r["output_tokens"] / w for r in runs for w in r["wall_time_s_reps"]])
    out: dict[str, Any] = {
        "wall_time_s": wall.median,
        "wall_time_s_ci_low": wall.ci_low,
        "wall_time_s_ci_high": wall.ci_high,
        "wall_time_s_cv": wall.cv,
        "wall_time_s_reps": reps,
        "tokens_per_s": tps.median,
        "tokens_per_s_ci_low": tps.ci_low,
        "tokens_per_s_ci_high": tps.ci_high,
        "reps_ci_coverage": wall.coverage,
        "output_tokens": statistics.median_low(r["output_tokens"] for r in runs),
        "outputs_stable": _stable_across_engine_runs(cells_dir, runs),
        "repetitive_requests": _max_known(r.get("repetitive_requests") for r in runs),
        "acceptance_length_per_request": _elementwise_median(
            [r.get("acceptance_length_per_request") or [] for r in runs]
        ),
        "output_tokens_per_request": _elementwise_median(
            [r.get("output_tokens_per_request") or [] for r in runs], low=True
        ),
        "decode_passes_per_request": _elementwise_median(
            [r.get("decode_passes_per_request") or [] for r in runs], low=True
        ),
        "latency_note": next((r["latency_note"] for r in runs if r.get("latency_note")), None),
        "started_at": min((r["started_at"] for r in runs if r.get("started_at")), default=None),
        "load_avg_1m": _max_known(r.get("load_avg_1m") for r in runs),
        "other_cpu_share": _max_known(r.get("other_cpu_share") for r in runs),
    }
    for column in (*_LATENCY_COLUMNS, "warmup_s", "engine_start_s"):
        out[column] = median_known(r.get(column) for r in runs)
    # Each engine run decodes the same requests, so their decode token counts agree
    # and the plain mean of the engine runs' token-weighted TPOTs stays token-weighted.
    tpots = [r["tpot_s_mean"] for r in runs if r.get("tpot_s_mean") is not None]
    out["tpot_s_mean"] = statistics.fmean(tpots) if tpots else None
    for column in _JOINED_COLUMNS:
        values = list(dict.fromkeys(str(r[column]) for r in runs if r.get(column) is not None))
        out[column] = " | ".join(values) if values else None
    return out


def _stable_across_engine_runs(cells_dir: Path, runs: list[dict[str, Any]]) -> bool | None:
    """False if any engine run was unstable or two engine runs produced different tokens; None if unknown."""
    flags = [r.get("outputs_stable") for r in runs]
    if False in flags:
        return False
    tokens = [CellFiles(cells_dir, r["cell_id"]).read_tokens() for r in runs]
    known = [t for t in tokens if t is not None]
    if any(t != known[0] for t in known[1:]):
        return False
    return None if None in flags or len(known) < len(tokens) else True


def _max_known(values: Iterable[Any]) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _elementwise_median(lists: Sequence[Sequence[Any]], *, low: bool = False) -> list[Any]:
    """Position by position, the median over engine runs; ``low``: the lower middle value, so counts stay counts."""
    width = max((len(values) for values in lists), default=0)
    middle = _median_low_known if low else median_known
    return [middle(values[i] for values in lists if i < len(values)) for i in range(width)]


def _median_low_known(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return statistics.median_low(known) if known else None


def _pooled_acceptance(runs: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
    drafts = row["drafts"]
    if not drafts:
        return {}
    # Back from each engine run's rates to its counts, then rates over the pooled counts.
    accepted: list[float] = []
    drafted: list[int] = []
    known = all(r.get("drafted_per_pos") or not r["drafts"] for r in runs)
    for r in runs:
        rates = r["acceptance_rate_per_pos"] or []
        denominators = (r.get("drafted_per_pos") or []) if known else [r["drafts"]] * len(rates)
        for i, (rate, d) in enumerate(zip(rates, denominators)):
            if i == len(accepted):
                accepted.append(0.0)
                drafted.append(0)
            accepted[i] += rate * d
            drafted[i] += d
    rates = [a / d for a, d in zip(accepted, drafted) if d] if known else [a / drafts for a in accepted]
    out_total = sum(r["output_tokens"] * len(r["wall_time_s_reps"]) for r in runs)
    return {
        "acceptance_length": 1.0 + row["accepted_tokens"] / drafts,
        "acceptance_rate_per_pos": rates,
        "drafted_per_pos": drafted if known else [],
        "draft_acceptance_rate": row["accepted_tokens"] / row["draft_tokens"] if row["draft_tokens"] else None,
        "alpha": theory.fit_alpha(rates) if rates else None,
        "tokens_per_pass": out_total / row["target_passes"] if row["target_passes"] else None,
        "draft_coverage": drafts / row["target_passes"] if row["target_passes"] else None,
        "acceptance_length_p50": median_known(
            v for r in runs for v in r.get("acceptance_length_per_request") or []
        ),
    }


def _interference(who: str, side: dict[str, Any]) -> str | None:
    """Why a measurement shared its machine, or None.

    other_cpu_share counts only other processes' CPU time. The load average,
    the fallback for rows without it, includes the engine's own threads, so
    it flags only a load beyond the engine's own (one thread per core).
    """
    share, load, cores = side.get("other_cpu_share"), side.get("load_avg_1m"), side.get("cpu_cores")
    if share is not None:
        if share > OTHER_CPU_FLAG_SHARE:
            return f"{who}: other processes kept {share:.0%} of the cores busy"
        return None
    if load is not None and cores and load > 2 * cores:
        return f"{who} ran under load {load:.1f} on {cores} cores"
    return None


def _compare(cells_dir: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Speedup and exactness of a speculative cell's engine runs against their baselines.

    An engine run whose baseline is missing, failed, or measured with another
    schema, software or set of requests fails the comparison: the row gets
    no speedup and an error naming the difference.
    """
    ratios, decode_ratios, within = [], [], []
    missing, incomparable, reasons = [], [], []
    mismatched: set[int] = set()
    compared, requests_compared = 0, 0
    baseline_group = None
    for spec in runs:
        base_files = CellFiles(cells_dir, spec["baseline_cell_id"])
        try:
            base = read_rows(base_files.row)[0] if base_files.row.exists() else None
        except ResultsError:
            base = None
        if base is None or base.get("status") != "ok":
            missing.append(spec["baseline_cell_id"])
            continue
        differences = provenance_differences(spec, base)
        if differences:
            incomparable.append(f"{spec['cell_id']} against {base['cell_id']}: {'; '.join(differences)}")
            continue
        baseline_group = baseline_group or base.get("config_hash") or base["cell_id"]
        ratios.append(base["wall_time_s"] / spec["wall_time_s"])
        if base.get("hardware") != spec.get("hardware"):
            reasons.append(f"baseline ran on {base.get('hardware')}, this cell on {spec.get('hardware')}")
        reasons += [
            reason for name, side in (("baseline", base), ("cell", spec))
            if (reason := _interference(f"engine run {side.get('engine_run')} {name}", side))
        ]
        # Token-weighted mean TPOT: the ratio of total decode time. (A median
        # request's TPOT is a latency; it moves with which request is median.)
        # Rows written before tpot_s_mean existed fall back on the p50.
        column = "tpot_s_mean" if base.get("tpot_s_mean") and spec.get("tpot_s_mean") else "tpot_s_p50"
        if base.get(column) and spec.get(column):
            decode_ratios.append(base[column] / spec[column])
        within.append(_within_noise(base, spec))
        base_tokens = base_files.read_tokens()
        spec_tokens = CellFiles(cells_dir, spec["cell_id"]).read_tokens()
        if base_tokens is not None and spec_tokens is not None:
            compared += 1
            requests_compared = max(requests_compared, len(base_tokens), len(spec_tokens))
            # By request index, so a request that differs in every engine run counts once.
            mismatched |= {i for i, (a, b) in enumerate(zip(base_tokens, spec_tokens)) if a != b}
            mismatched |= set(range(min(len(base_tokens), len(spec_tokens)), max(len(base_tokens), len(spec_tokens))))
    if missing:
        return {"speedup": None, "exact_match": None, "mismatched_requests": None,
                "error": f"no successful baseline measurement: {', '.join(missing)}"}
    if incomparable:
        return {"speedup": None, "exact_match": None, "mismatched_requests": None,
                "error": "not compared: baseline measured differently: " + " | ".join(incomparable)}
    exact = len(mismatched) == 0 if compared == len(runs) else None
    if exact is False:
        reasons.append(
            f"outputs differ from the baseline's in {len(mismatched)} of {requests_compared} "
            "requests: greedy speculative decoding should be exact, so this speedup is not of the same work"
        )
    looping = _max_known(r.get("repetitive_requests") for r in runs)
    requests = runs[0].get("num_requests")
    if looping and requests and looping / requests >= LOOPING_FLAG_SHARE:
        reasons.append(
            f"{looping} of {requests} outputs loop: drafts of a loop are accepted whole, so acceptance "
            "and speedup overstate what this workload gives on text that does not repeat itself"
        )
    known_within = [w for w in within if w is not None]
    return {
        "speedup_per_engine_run": ratios,
        "_within": max(known_within, key=lambda w: w.se) if known_within else None,
        "_baseline": baseline_group,
        "flag_reasons": reasons,
        "decode_speedup": _geometric_mean(decode_ratios),
        "exact_match": exact,
        "mismatched_requests": len(mismatched) if exact is not None else None,
    }


def _within_noise(base: Mapping[str, Any], spec: Mapping[str, Any]) -> stats.WithinNoise | None:
    """The repetitions' noise on a ratio of two medians; None when a side has one repetition."""
    variance, df = 0.0, 0
    for side in (base, spec):
        cv, n = side.get("wall_time_s_cv"), len(side.get("wall_time_s_reps") or [])
        if cv is None or n < 2:
            return None
        variance += cv * cv / n
        df += n - 1
    return stats.WithinNoise(se=math.sqrt(variance), df=df)


def _geometric_mean(values: Sequence[float]) -> float | None:
    """The centre of ratios, as for the speedup (stats.speedup_interval)."""
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None
