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
from typing import Any, Iterable, Mapping, Sequence, cast

from specbench import methods
from specbench.results import distribution, exactness, judging
from specbench.results.files import CellFiles
from specbench.results.metrics import REPETITIVE_SHARE, median_known
from specbench.results.provenance import provenance_differences
from specbench.results.rows import decode_speedup, output_token_ratio, speedup
from specbench.results.schema import (
    ResultsError,
    curve_key,
    engine_groups,
    engine_instance,
    read_rows,
    row_config,
)
from specbench.stats import acceptance, timings

# A speculative cell is flagged when at least this share of its outputs loop.
LOOPING_FLAG_SHARE = 0.1
# A measurement is disturbed when other processes kept more than this share of
# the machine's cores busy while it ran: the sweep measures it again, and a
# cell still disturbed after its last attempt is flagged.
DISTURBED_SHARE = 0.1


def merge(cells_dir: Path, cell_ids: Iterable[str]) -> list[dict[str, Any]]:
    """Combine a sweep's cell files into results rows, one per cell (engine runs combined).

    Speculative cells get speedup and exactness against their baseline in the
    same engine run, provided both were measured with the same schema, software and
    requests (:func:`provenance_differences`); otherwise the comparison fails
    with the reason and no speedup. The speedup is the geometric mean of the
    per-run ratios of time per output token (:func:`rows.speedup`: equal work
    where outputs differ in length; ``output_token_ratio`` records by how much). Its intervals use the
    engine-to-engine spread of log ratios pooled over the cells of its batch size (:func:`judging.judge_speedups`),
    with degrees of freedom counted in independent engines (``stats.spreads.engine_run_spread``: cells of one engine
    share its deviations, and the baseline engine's are estimated apart from the speculative ones'); with
    one engine run everywhere only the within-engine spread of the repetitions is
    known, and the method tag says so; with one repetition as well there is no interval.

    Outputs that differ from the reference are classified at their first
    divergence as numerical ties or mismatches (:mod:`specbench.results.exactness`);
    a baseline at batch size B is compared with the baseline at the smallest
    batch size, the control. Cells are flagged, and so left out of verdicts,
    when their engine runs disagree beyond the spread, when a run stayed
    disturbed by other processes, when baseline and cell ran on different
    hardware, or when outputs mismatch; ties, looping outputs and batches run
    in waves are caveats, which qualify a speedup without excluding it.
    Missing cells are skipped; unreadable ones become failed rows naming the file.
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

    references = _References(cells_dir, [r for group in by_cell.values() for r in group])
    rows = []
    for group in by_cell.values():
        group.sort(key=lambda r: r.get("engine_run") or 0)
        rows.append(_combine_engine_runs(cells_dir, group, references))
    # Serving cells are judged on their own figures at their own load (specbench.results.serving): their
    # ratios join neither the offline spread, nor the shifted-baseline test, nor (without a speedup) batch-1 evidence.
    speculative = [r for r in rows if r.get("method") != "baseline" and r.get("speedup_per_engine_run")
                   and r.get("load_request_rate") is None]
    # Cells whose baselines ran on one engine share its deviations: grouped by the engines they shared.
    for row, group in zip(speculative, engine_groups([r["_runs"] for r in speculative])):
        row["_baseline"] = group
    judging.judge_baselines(rows, speculative)
    judging.judge_speedups(speculative, tests=judging.disagreement_tests(rows))
    judging.judge_distributions(rows)
    judging.judge_tie_excess(rows)
    for row in rows:
        for private in ("_within", "_baseline", "_reference", "_engine", "_runs", "_run_numbers", "_disturbed",
                        "_tie_excess", "_draws"):
            row.pop(private, None)
        row["flagged"] = bool(row.get("flag_reasons"))
    return rows


def _combine_engine_runs(cells_dir: Path, runs: list[dict[str, Any]], references: _References) -> dict[str, Any]:
    first = dict(runs[0])
    ok = [r for r in runs if r.get("status") == "ok"]
    if len(ok) < len(runs):
        failed = next(r for r in runs if r.get("status") != "ok")
        return first | {"status": "failed", "error": failed.get("error"), "engine_run": None}
    ids = [r.get("engine_id") for r in runs]
    row = first | {"engine_run": None, "engine_runs": len(runs), "engine_id": ",".join(ids) if all(ids) else None}
    if len(runs) > 1:
        row |= _across_engine_runs(cells_dir, runs)
        for key in ("drafts", "draft_tokens", "accepted_tokens", "target_passes"):
            row[key] = sum(r[key] or 0 for r in runs)
        row |= _pooled_acceptance(runs, row) | _pooled_raw_acceptance(runs, row)
    row |= _pooled_draws(runs)
    if row["method"] == "baseline":
        # A baseline's speedup is 1 by definition: there is nothing to put an interval on.
        # A sampled one has no token-exact control: its reference is its own distribution.
        return row | {"speedup": 1.0, "speedup_ci_low": None, "speedup_ci_high": None,
                      "speedup_ci_method": "none: the baseline itself",
                      "speedup_per_engine_run": [1.0] * len(runs), "decode_speedup": 1.0,
                      "exact_match": True} | ({} if _sampled(row) else references.control(runs))
    return row | _compare(cells_dir, runs, references)


_LATENCY_COLUMNS = tuple(f"{m}_p{q}" for m in ("ttft_s", "tpot_s", "e2e_s") for q in (50, 90, 99))
# Provenance that should not differ between engine runs, but can (a cluster
# launcher puts engine runs on several hosts): every distinct value is kept.
_JOINED_COLUMNS = ("host", "machine", "gpu_state", "specbench_version", "git_commit", "vllm_version",
                   "torch_version", "transformers_version", "python_version")
# Each engine run's peaks are its own cell's (reset as the cell starts): the
# merged row keeps the largest, what a rerun of the cell should be ready for.
_PEAK_COLUMNS = ("peak_gpu_allocated_bytes", "peak_gpu_reserved_bytes", "gpu_used_bytes", "peak_rss_bytes")


def _across_engine_runs(cells_dir: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-cell columns of a merged row, each describing every engine run (not the first run's copy).

    Wall time and tokens/s treat each engine run as one cluster of
    repetitions (``timings.engine_run_interval``): the geometric mean of the
    engine runs' medians, with a t interval from their spread; the CV and
    ``wall_time_s_reps`` keep every repetition. Latency percentiles, TPOT,
    warm-up and start-up are medians (TPOT a mean) of the engine runs' own;
    loads, looping outputs and memory peaks the worst engine run (the
    weights and KV cache, fixed by the engine's settings, stay the first
    run's); outputs are stable only if every repetition of every engine run
    produced the same tokens.
    """
    reps = [w for r in runs for w in r["wall_time_s_reps"]]
    wall = timings.engine_run_interval([r["wall_time_s_reps"] for r in runs])
    tps = timings.engine_run_interval([[r["output_tokens"] / w for w in r["wall_time_s_reps"]] for r in runs])
    out: dict[str, Any] = {
        "wall_time_s": wall.point,
        "wall_time_s_ci_low": wall.ci_low,
        "wall_time_s_ci_high": wall.ci_high,
        "wall_time_s_cv": timings.summarize(reps).cv,
        "wall_time_s_reps": reps,
        "tokens_per_s": tps.point,
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
    for column in _PEAK_COLUMNS:
        out[column] = _max_known(r.get(column) for r in runs)
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
    known = all(r.get("drafted_per_pos") or not r["drafts"] for r in runs)
    rates, drafted = _pooled_rates(runs, "acceptance_rate_per_pos", known)
    out_total = sum(r["output_tokens"] * len(r["wall_time_s_reps"]) for r in runs)
    return {
        "acceptance_length": 1.0 + row["accepted_tokens"] / drafts,
        "acceptance_rate_per_pos": rates,
        "drafted_per_pos": drafted if known else [],
        "draft_acceptance_rate": row["accepted_tokens"] / row["draft_tokens"] if row["draft_tokens"] else None,
        "alpha": acceptance.fit_alpha(rates) if rates else None,
        "tokens_per_pass": out_total / row["target_passes"] if row["target_passes"] else None,
        "draft_coverage": drafts / row["target_passes"] if row["target_passes"] else None,
        "acceptance_length_p50": median_known(
            v for r in runs for v in r.get("acceptance_length_per_request") or []
        ),
    }


def _pooled_raw_acceptance(runs: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own counters (accepted tokens past an output's end included) pooled over engine runs."""
    if not row["drafts"] or any(r.get("raw_accepted_tokens") is None for r in runs):
        return {}
    raw = sum(r["raw_accepted_tokens"] for r in runs)
    known = all(r.get("drafted_per_pos") or not r["drafts"] for r in runs)
    return {
        "raw_accepted_tokens": raw,
        "raw_acceptance_length": 1.0 + raw / row["drafts"],
        "raw_acceptance_rate_per_pos": _pooled_rates(runs, "raw_acceptance_rate_per_pos", known)[0],
    }


def _pooled_rates(runs: list[dict[str, Any]], column: str, known: bool) -> tuple[list[float], list[int]]:
    """Per-position rates over the pooled counts of every engine run, and the drafts that reached each position.

    Back from each run's rates to its counts (rate x the drafts that reached
    the position, or x all drafts where that is unknown), then summed.
    """
    accepted: list[float] = []
    drafted: list[int] = []
    for r in runs:
        rates = r.get(column) or []
        denominators = (r.get("drafted_per_pos") or []) if known else [r["drafts"]] * len(rates)
        for i, (rate, d) in enumerate(zip(rates, denominators)):
            if i == len(accepted):
                accepted.append(0.0)
                drafted.append(0)
            accepted[i] += rate * d
            drafted[i] += d
    return [a / d for a, d in zip(accepted, drafted) if d], drafted


def _interference(who: str, side: dict[str, Any]) -> str | None:
    """Why a measurement shared its machine, or None.

    other_cpu_share counts only other processes' CPU time. The load average,
    the fallback for rows without it, includes the engine's own threads, so
    it flags only a load beyond the engine's own (one thread per core).
    """
    share, load, cores = side.get("other_cpu_share"), side.get("load_avg_1m"), side.get("cpu_cores")
    if share is not None:
        if share > DISTURBED_SHARE:
            return f"{who}: other processes kept {share:.0%} of the cores busy"
        return None
    if load is not None and cores and load > 2 * cores:
        return f"{who} ran under load {load:.1f} on {cores} cores"
    return None


def _compare(cells_dir: Path, runs: list[dict[str, Any]], references: _References) -> dict[str, Any]:
    """Speedup and exactness of a speculative cell's engine runs against their baselines.

    An engine run whose baseline is missing, failed, or measured with another
    schema, software or set of requests fails the comparison: the row gets
    no speedup and an error naming the difference. Outputs that differ from
    the baseline's are classified (:mod:`specbench.results.exactness`): only
    mismatches flag the cell; ties and looping outputs are caveats.
    """
    ratios, decode_ratios, within, token_ratios, engine_runs, modes = [], [], [], [], [], []
    missing, incomparable, reasons = [], [], []
    divergences: list[list[exactness.Divergence]] = []
    bases: list[dict[str, Any]] = []
    base_engines, spec_engines = [], []
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
        base_engines.append(engine_instance(base))
        spec_engines.append(engine_instance(spec))
        ratios.append(speedup(base, spec))
        token_ratios.append(output_token_ratio(base, spec))
        engine_runs.append(spec.get("engine_run") or 0)
        if base.get("machine") != spec.get("machine"):
            reasons.append(f"baseline ran on {base.get('machine')}, this cell on {spec.get('machine')}")
        reasons += [
            reason for name, side in (("baseline", base), ("cell", spec))
            if (reason := _interference(f"engine run {side.get('engine_run')} {name}", side))
        ]
        if (decode := decode_speedup(base, spec)) is not None:
            decode_ratios.append(decode)
        within.append(judging.within_noise(base, spec))
        if (differs := mode_mismatch(base, spec)) is not None:
            modes.append(differs)
        bases.append(base)
        if _sampled(spec):
            continue  # checked in distribution below, not token for token
        found = references.classify(base, spec)
        if found is not None:
            divergences.append(found)
    if missing:
        return {"speedup": None, "exact_match": None, "mismatched_requests": None,
                "error": f"no successful baseline measurement: {', '.join(missing)}"}
    if incomparable:
        return {"speedup": None, "exact_match": None, "mismatched_requests": None,
                "error": "not compared: baseline measured differently: " + " | ".join(incomparable)}
    disturbed = bool(reasons)  # other processes or other hardware: a measurement of something else
    if _sampled(runs[0]):
        columns = _distribution_columns(references.distribution_reference(bases), runs)
    else:
        columns = _exactness_columns(divergences, len(runs), runs[0]["baseline_cell_id"], runs[0].get("dtype"))
    if columns["mismatched_requests"]:
        requests = len(references.tokens(runs[0]["cell_id"]) or []) or runs[0].get("num_requests")
        reasons.append(
            f"outputs differ from the baseline's in {columns['mismatched_requests']} of {requests} "
            "requests where the target had a clear winner: greedy speculative decoding should be exact, "
            "so this speedup is not of the same work"
        )
    mismatch = " | ".join(dict.fromkeys(modes)) or None
    shape = int(runs[0].get("batch_size") or 1) * (int(runs[0].get("num_speculative_tokens") or 0) + 1)
    excess = _tie_excess(columns, bases, references, shape)
    caveats = [c for c in (_tie_caveat(columns, controlled=bool(excess)), _untested_caveat(columns),
                           _loop_caveat(references, runs), _wave_caveat(runs), _mode_caveat(mismatch)) if c]
    known_within = [w for w in within if w is not None]
    return columns | excess | {
        "speedup_per_engine_run": ratios,
        "output_token_ratio": _geometric_mean(token_ratios),
        "_within": max(known_within, key=lambda w: w.se) if known_within else None,
        "_reference": bases[0].get("config_hash") if bases else None,
        # Each engine run is known by its baseline's engine (stats pairs cells on it), and the cell's
        # speculative engine by its engines in those runs (schema.engine_instance).
        "_engine": tuple(spec_engines),
        "_runs": base_engines,
        "_run_numbers": engine_runs,
        "_disturbed": disturbed,
        "flag_reasons": reasons,
        "caveats": caveats,
        "mode_mismatch": mismatch,
        "decode_speedup": _geometric_mean(decode_ratios),
    }


def _sampled(row: Mapping[str, Any]) -> bool:
    """Whether a row sampled (temperature > 0): its exactness is checked in distribution."""
    return bool(row.get("temperature"))


def _pooled_draws(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A merged row's distribution-check draws: every engine run's, per prompt (their seeds differ),
    with the pass's seconds and drafts summed and its cost over the timed seconds of them all."""
    drawn = [r for r in runs if r.get("distribution_samples")]
    if not drawn:
        return {}
    prompts = min(len(r["distribution_samples"]) for r in drawn)
    timed = sum(sum(r.get("wall_time_s_reps") or []) for r in drawn)
    seconds = sum(r.get("distribution_check_s") or 0.0 for r in drawn)
    return {
        "distribution_samples": [[s for r in drawn for s in r["distribution_samples"][p]] for p in range(prompts)],
        "distribution_check_s": seconds,
        "distribution_check_share": seconds / timed if timed else None,
        # Unknown (None) unless every engine run counted them: the check's power depends on them.
        "distribution_drafts": _sum_known(r.get("distribution_drafts") for r in drawn),
        "distribution_accepted_tokens": _sum_known(r.get("distribution_accepted_tokens") for r in drawn),
    }


def _sum_known(values: Iterable[int | None]) -> int | None:
    """The sum, or None if any value is unknown."""
    known = list(values)
    return None if None in known else sum(cast(int, v) for v in known)


def _distribution_columns(bases: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A sampled cell's draws against its reference baselines' (:meth:`_References.distribution_reference`),
    each side pooled, set aside (``_draws``) for :func:`judging.judge_distributions`, which tests them once it
    knows how many cells the sweep checks.

    Exactness is "untested" when no draft of the cell's draws reached verification (the check then
    compared the target with itself); unknown (None) without draws on both sides.
    """
    drawn = _pooled_draws(runs)
    mine, theirs = drawn.get("distribution_samples"), _pooled_draws(bases).get("distribution_samples")
    unknown = {"exact_match": None, "exactness": None, "mismatched_requests": None,
               "exactness_reference": runs[0]["baseline_cell_id"]}
    if not mine or not theirs:
        return unknown
    if drawn.get("distribution_drafts") == 0 and all(r.get("distribution_drafts") is not None for r in runs):
        return unknown | {"exactness": judging.UNTESTED}
    prompts = min(len(mine), len(theirs))
    # Every token drawn is compared: the draws are cut at distribution_check.tokens (or the workload's
    # max_tokens), and a sequence that ended early is padded with its end.
    tokens = max(distribution.FIRST_CHECKED_POSITION + 1,
                 max(len(s) for side in (mine, theirs) for prompt in side[:prompts] for s in prompt))
    return unknown | {"exactness": "distribution", "_draws": (theirs[:prompts], mine[:prompts], tokens)}


def _check_settings(row: Mapping[str, Any]) -> Any:
    """What decides a cell's distribution-check draws besides its curve: the check's size (config)."""
    return row_config(row).get("distribution_check")


class _References:
    """What outputs are compared against: token files (each read once) and each baseline's siblings.

    A baseline's siblings are the baselines of the same engine run that
    differ from it only in batch size: plain decoding against itself at
    another shape, the control that shows where numerics alone part outputs.
    """

    def __init__(self, cells_dir: Path, rows: Sequence[dict[str, Any]]) -> None:
        self._cells_dir = cells_dir
        self._tokens: dict[str, list[list[int]] | None] = {}
        self._controls: dict[tuple[str, int], tuple[set[int], int] | None] = {}
        self._baselines: dict[tuple[str, Any], dict[int, dict[str, Any]]] = {}
        for row in rows:
            if row.get("method") == "baseline" and row.get("status") == "ok":
                self._baselines.setdefault((curve_key(row), row.get("engine_run")), {})[row["batch_size"]] = row

    def tokens(self, cell_id: str) -> list[list[int]] | None:
        """A cell's output token ids per request (None: unreadable)."""
        if cell_id not in self._tokens:
            self._tokens[cell_id] = CellFiles(self._cells_dir, cell_id).read_tokens()
        return self._tokens[cell_id]

    def _siblings(self, base: dict[str, Any]) -> dict[int, dict[str, Any]]:
        return self._baselines.get((curve_key(base), base.get("engine_run")), {})

    def distribution_reference(self, bases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The baseline runs whose draws a sampled cell's are tested against: its own baselines and their
        siblings at every other batch size, where they drew with the same check settings.

        The check's draws do not depend on the cell's batch size (the same first prompts, cut alike, in
        calls of the engine's step budget), so every sibling drew from the same distribution, with seeds
        of its own. Pooling them makes the reference larger than any one baseline's: one unlucky
        baseline draw no longer fails every speculative cell compared with it (on 2026-12-02 one baseline
        at batch 8 failed two EAGLE-3 cells, p = 0.003 and 0.0005, that its batch-1 sibling passed, p =
        0.26 and more).
        """
        found: dict[str, dict[str, Any]] = {}
        for base in bases:
            check = _check_settings(base)
            for other in [base, *self._siblings(base).values()]:
                if _check_settings(other) == check:
                    found.setdefault(other["cell_id"], other)
        return list(found.values())

    def control_ties(self, base: dict[str, Any], shape: int) -> tuple[set[int], int] | None:
        """Which of this baseline's requests plain decoding at one other batch size leaves at a tie, and how
        many requests it compared; None without a sibling (one batch size) or with an unreadable token file.

        The control is matched to the cell it is held against: one comparison per engine run, as the
        cell's is, with plain decoding at the sibling batch size nearest ``shape``, the tokens a step of
        the cell's verify pass (batch size x (K + 1)), on a log scale, the smaller on a tie. Pooling every
        sibling made the control meet more ties than any one comparison does. A sibling's mismatch is no
        evidence of numerics. Worked out once per baseline and sibling.
        """
        siblings = {b: r for b, r in self._siblings(base).items() if b != base["batch_size"]}
        if not siblings:
            return None
        batch = min(siblings, key=lambda b: (abs(math.log(b / shape)), b))
        key = (base["cell_id"], batch)
        if key not in self._controls:
            found = self.classify(base, siblings[batch], control=True)
            compared = min(len(self.tokens(base["cell_id"]) or []), len(self.tokens(siblings[batch]["cell_id"]) or []))
            self._controls[key] = None if found is None or not compared else (
                {d.request for d in found if d.kind == exactness.TIE}, compared)
        return self._controls[key]

    def classify(self, base: dict[str, Any], other: dict[str, Any], *, control: bool = False
                 ) -> list[exactness.Divergence] | None:
        """``other``'s outputs against the baseline ``base``'s (None: a token file is unreadable).

        ``control``: ``other`` is plain decoding at another batch size, so only
        the requests both decoded are compared.
        """
        reference, outputs = self.tokens(base["cell_id"]), self.tokens(other["cell_id"])
        if reference is None or outputs is None:
            return None
        if control:
            count = min(len(reference), len(outputs))
            reference, outputs = reference[:count], outputs[:count]
        return exactness.classify(
            reference, outputs, tolerance=exactness.tie_tolerance(base.get("dtype")),
            margins=base.get("top2_margins") or [], near_ties=base.get("near_tie_tokens") or [],
        )

    def control(self, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """A baseline's exactness columns: plain decoding at its batch size against the smallest measured.

        Empty for the smallest batch size itself (and a sweep of one batch size).
        """
        found, reference = [], None
        for run in runs:
            siblings = self._siblings(run)
            smallest = min(siblings, default=run["batch_size"])
            if smallest == run["batch_size"]:
                return {}
            reference = siblings[smallest]
            if (divergences := self.classify(reference, run, control=True)) is not None:
                found.append(divergences)
        assert reference is not None
        return _exactness_columns(found, len(runs), reference["cell_id"], runs[0].get("dtype"))


def _exactness_columns(
    per_run: Sequence[Sequence[exactness.Divergence]], runs: int, reference: str, dtype: str | None
) -> dict[str, Any]:
    """Exactness over a cell's engine runs: a request is as bad as its worst engine run (mismatch over tie).

    Unknown (nulls) unless every engine run's tokens could be compared.
    """
    tolerance = exactness.tie_tolerance(dtype)
    if len(per_run) < runs:
        return {"exact_match": None, "exactness": None, "differing_requests": None, "tie_requests": None,
                "mismatched_requests": None, "divergences": None, "exactness_reference": reference,
                "tie_tolerance": tolerance}
    worst: dict[int, exactness.Divergence] = {}
    for divergences in per_run:
        for d in divergences:
            if d.request not in worst or (worst[d.request].kind == exactness.TIE and d.kind == exactness.MISMATCH):
                worst[d.request] = d
    kept = [worst[i] for i in sorted(worst)]
    return {
        "exact_match": not kept,
        "exactness": exactness.verdict(kept),
        "differing_requests": len(kept),
        "tie_requests": sum(d.kind == exactness.TIE for d in kept),
        "mismatched_requests": sum(d.kind == exactness.MISMATCH for d in kept),
        "divergences": [d.as_row() for d in kept],
        "exactness_reference": reference,
        "tie_tolerance": tolerance,
    }


def _tie_excess(columns: Mapping[str, Any], bases: Sequence[dict[str, Any]], references: _References,
                shape: int) -> dict[str, Any]:
    """The cell's ties held against the control's on the same requests: ``_tie_excess`` (p-value,
    description) for :func:`judging.judge_tie_excess`, or nothing when the cell has no ties or its baselines no
    control (:meth:`_References.control_ties` at the cell's verify shape, ``shape`` tokens a step).

    Both sides are pooled over the cell's engine runs alike (a request ties if it does in any engine
    run), and paired by request: McNemar's test on the discordant requests
    (:func:`exactness.tie_excess_p_value`).
    """
    if not columns.get("tie_requests") or not bases:
        return {}
    tied: set[int] = set()
    compared = 0
    for base in bases:
        control = references.control_ties(base, shape)
        if control is None:
            return {}
        tied |= control[0]
        compared = max(compared, control[1])
    mine = {d["request"] for d in columns["divergences"] if d["kind"] == exactness.TIE and d["request"] < compared}
    p_value = exactness.tie_excess_p_value(len(mine - tied), len(tied - mine))
    return {"_tie_excess": (p_value, f"ties on {len(mine)} of {compared} requests where plain decoding at "
                                     f"another batch size ties on {len(tied)} of them ({len(mine - tied)} "
                                     f"only in the cell, {len(tied - mine)} only in plain decoding)")}


def _tie_caveat(columns: Mapping[str, Any], *, controlled: bool) -> str | None:
    """The ties' caveat; ``controlled``: whether their number was held against a control (one batch size
    has none, and then the caveat says that an excess of ties could not be tested)."""
    ties = columns.get("tie_requests")
    if not ties:
        return None
    positions = ", ".join(str(d["position"]) for d in columns["divergences"] if d["kind"] == exactness.TIE)
    untested = "" if controlled else (" (no control: plain decoding at another batch size was not measured, so "
                                      "whether the cell ties more often than numerics explain is untested)")
    # Ties exist only in a 16-bit dtype, which has a tolerance.
    return (f"{ties} request(s) part from the baseline at numerical ties (token positions {positions}): "
            f"both tokens taken there were within {columns['tie_tolerance']:.2f} nats of the target's top token, "
            f"which rounding in this dtype can swap; the same work, not a fault{untested}")


def _untested_caveat(columns: Mapping[str, Any]) -> str | None:
    if columns.get("exactness") != judging.UNTESTED:
        return None
    return ("not checked in distribution: no draft reached verification in the check's draws, so they "
            "compared the target with itself and could not fail")


def _loop_caveat(references: _References, runs: Sequence[Mapping[str, Any]]) -> str | None:
    """How much of a cell's acceptance its looping outputs carry, or None when few loop.

    Drafts of a loop are accepted whole, so a looping request lifts tokens
    per pass; this says by how much, from engine run 0's per-request decode passes.
    """
    looping_count = _max_known(r.get("repetitive_requests") for r in runs)
    requests = runs[0].get("num_requests")
    if not looping_count or not requests or looping_count / requests < LOOPING_FLAG_SHARE:
        return None
    line = f"{looping_count} of {requests} outputs loop"
    tokens = references.tokens(runs[0]["cell_id"]) or []
    looping = [acceptance.repeated_ngram_share(ids) >= REPETITIVE_SHARE for ids in tokens]
    outputs = runs[0].get("output_tokens_per_request") or []
    passes = runs[0].get("decode_passes_per_request") or []
    if any(looping) and len(outputs) == len(passes) == len(looping) and None not in passes:
        def per_pass(keep: Sequence[bool]) -> tuple[float | None, int]:
            decoded = sum(o - 1 for o, k in zip(outputs, keep) if k)
            spent = sum(p for p, k in zip(passes, keep) if k)
            return (decoded / spent if spent else None), decoded - spent

        everyone, accepted = per_pass([True] * len(looping))
        rest, rest_accepted = per_pass([not loop for loop in looping])
        if everyone is not None and accepted > 0:
            without = f"{rest:.2f}" if rest is not None else "none left"
            line += (f" and carry {1 - rest_accepted / accepted:.0%} of the accepted tokens "
                     f"(tokens per decode pass {everyone:.2f}, {without} without them)")
    return line + ": drafts of a loop are accepted whole, so text that does not repeat itself gives less"


def _wave_caveat(runs: Sequence[Mapping[str, Any]]) -> str | None:
    """Where vLLM ran a batch in waves because its KV cache held fewer requests than the batch."""
    reached = [r.get("reached_concurrency") for r in runs if r.get("reached_concurrency") is not None]
    batch = runs[0].get("batch_size")
    if not reached or not batch or min(reached) >= batch:
        return None
    return (f"ran in waves: at most {min(reached)} of its {batch} requests at once (the KV cache holds no "
            "more), so this measures a smaller batch, queued")


def mode_mismatch(base: Mapping[str, Any], cell: Mapping[str, Any]) -> str | None:
    """How ``cell``'s engine ran otherwise than its baseline's, in what sets a step's time; None when alike.

    Compared: the model runner, async scheduling, the CUDA-graph mode and
    whether each side's decode step (batch size tokens plainly, batch size x
    (K + 1) when speculating) fits the largest captured graph, the step
    budget (max_num_batched_tokens) and prefix caching, as vLLM resolved
    them (the ``engine_*`` columns). Where vLLM made the difference itself
    (async scheduling off, or the V1 runner, for the cell's speculative
    method) the text says so. Rows without the columns (schema < 14) are
    not compared.
    """
    def on(value: Any) -> str:
        return "on" if value else "off"

    vllm_method = ((row_config(cell).get("method") or {}).get("speculative_config") or {}).get("method")
    differences = []
    runner_b, runner_c = base.get("engine_model_runner"), cell.get("engine_model_runner")
    if None not in (runner_b, runner_c) and runner_b != runner_c:
        speculative = (row_config(cell).get("method") or {}).get("speculative_config") or {}
        what = "heterogeneous-vocabulary drafts" if speculative.get("use_heterogeneous_vocab") else vllm_method
        why = (f" (vLLM 0.32 runs {what} on V1)"
               if runner_c == "V1" and methods.model_runner(runner_b, speculative) == "V1" else "")
        differences.append(f"model runner: baseline {runner_b}, cell {runner_c}{why}")
    async_b, async_c = base.get("engine_async_scheduling"), cell.get("engine_async_scheduling")
    if None not in (async_b, async_c) and async_b != async_c:
        pinned = (row_config(cell).get("engine") or {}).get("async_scheduling") is not None
        why = (f" (vLLM turns async scheduling off for method {vllm_method})"
               if async_b and not pinned and vllm_method is not None else "")
        differences.append(f"async_scheduling: baseline {on(async_b)}, cell {on(async_c)}{why}")
    graphs_b, graphs_c = base.get("engine_cudagraph_mode"), cell.get("engine_cudagraph_mode")
    if None not in (graphs_b, graphs_c):
        if graphs_b != graphs_c:
            differences.append(f"cudagraph_mode: baseline {graphs_b}, cell {graphs_c}")
        else:
            step_b = base.get("batch_size") or 1
            step_c = (cell.get("batch_size") or 1) * ((cell.get("num_speculative_tokens") or 0) + 1)
            covered_b, covered_c = _graph_covers(base, step_b), _graph_covers(cell, step_c)
            if covered_b != covered_c:
                def side(name: str, step: int, covered: bool, row: Mapping[str, Any]) -> str:
                    largest = row.get("engine_max_cudagraph_capture_size") or 0
                    return (f"{name}'s {step}-token steps {'run a captured graph' if covered else 'run eager'} "
                            f"(largest capture size {largest})")
                differences.append("cuda graphs: " + side("baseline", step_b, covered_b, base) + ", "
                                   + side("cell", step_c, covered_c, cell))
    for column, name in (("engine_max_num_batched_tokens", "max_num_batched_tokens"),
                         ("engine_prefix_caching", "prefix caching")):
        value_b, value_c = base.get(column), cell.get(column)
        if None not in (value_b, value_c) and value_b != value_c:
            shown = on if isinstance(value_b, bool) else str
            differences.append(f"{name}: baseline {shown(value_b)}, cell {shown(value_c)}")
    return "; ".join(differences) or None


def _graph_covers(row: Mapping[str, Any], step_tokens: int) -> bool:
    """Whether a decode step of ``step_tokens`` tokens runs a captured CUDA graph on the row's engine."""
    return (row.get("engine_cudagraph_mode") not in (None, "NONE")
            and (row.get("engine_max_cudagraph_capture_size") or 0) >= step_tokens)


def _mode_caveat(mismatch: str | None) -> str | None:
    if mismatch is None:
        return None
    hint = "; engine.async_scheduling=false runs both synchronously" if "async_scheduling" in mismatch else ""
    return (f"baseline and cell engines ran in different modes ({mismatch}): the speedup measures the mode "
            f"as well as the method{hint}")


def _geometric_mean(values: Sequence[float]) -> float | None:
    """The centre of ratios, as for the speedup (stats.intervals.speedup_interval)."""
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None
