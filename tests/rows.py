"""Result rows for tests: one builder per kind of row, shared by every test module.

- :func:`make_row`: a merged ``results.parquet`` row (report, memory, recommend);
  :func:`grid_rows` a whole sweep of them, :func:`write_results` its file;
- :func:`cell_row`: a cell file's row, measured columns from
  :func:`specbench.results.metrics.measured_fields` (merge); :func:`write_cell`
  writes it with its tokens.

``tests/test_prediction.py`` keeps its own builder: its rows set the counters
so that tokens per decode pass come out exactly, which is what it tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from specbench.results.files import CellFiles, write_table
from specbench.results.metrics import measured_fields
from specbench.results.schema import rows_to_table

XSS = "<script>alert(1)</script>"

# Speedup by (workload, method, K) at batch sizes 1, 4, 16.
GRID: dict[tuple[str, str, int], tuple[float, float, float]] = {
    ("summarize", "ngram", 2): (1.5, 1.2, 0.8),
    ("summarize", "ngram", 4): (1.8, 1.1, 0.6),
    ("summarize", "draft_model", 2): (0.9, 0.7, 0.5),
    ("summarize", "draft_model", 4): (0.8, 0.6, 0.4),
    ("creative", "ngram", 2): (1.05, 0.95, 0.7),
    ("creative", "ngram", 4): (0.98, 0.85, 0.5),
    ("creative", "draft_model", 2): (1.1, 0.9, 0.6),
    ("creative", "draft_model", 4): (1.2, 0.8, 0.5),
}
BATCHES = (1, 4, 16)


def make_row(
    method: str = "ngram",
    k: int = 2,
    batch: int = 1,
    workload: str = "summarize",
    speedup: float | None = 1.5,
    alpha: float = 0.8,
    **overrides: Any,
) -> dict[str, Any]:
    """A plausible results.parquet row; keyword overrides replace any column."""
    baseline = method == "baseline"
    k = 0 if baseline else k
    speedup = 1.0 if baseline else speedup
    base_id = f"baseline-k0-b{batch}-{workload}-r0"
    base_wall = 2.0 + 0.1 * batch
    rates = [] if baseline else [alpha ** (i + 1) for i in range(k)]
    accepted = 0 if baseline else round(40 * sum(rates))
    output = 256
    row: dict[str, Any] = {
        "schema_version": 1,
        "cell_id": base_id if baseline else f"{method}-k{k}-b{batch}-{workload}-r0",
        "engine_id": f"{method}-k{k}-engine",
        "baseline_cell_id": None if baseline else base_id,
        "status": "ok",
        "error": None,
        "model": "smollm2-135m",
        "method": method,
        "num_speculative_tokens": k,
        "batch_size": batch,
        "workload": workload,
        "engine_runs": 1,
        "repetitions": 2,
        "num_requests": 4,
        "prompt_tokens": 900,
        "output_tokens": output,
        "wall_time_s": base_wall / speedup if speedup else base_wall,
        "wall_time_s_cv": 0.02,
        "wall_time_s_reps": [base_wall, base_wall],
        "tokens_per_s": output / base_wall,
        "ttft_s_p50": 0.3,
        "ttft_s_p90": 0.35,
        "tpot_s_p50": 0.04 * (1 + 0.05 * batch) / (speedup or 1.0),
        "tpot_s_p90": 0.05 * (1 + 0.05 * batch) / (speedup or 1.0),
        "drafts": 0 if baseline else 40,
        "draft_tokens": 0 if baseline else 40 * k,
        "accepted_tokens": accepted,
        "acceptance_length": 1.0 + accepted / 40 if not baseline else 1.0,
        "acceptance_rate_per_pos": rates,
        # vLLM's own counters: the same as the emitted ones unless a request ends inside a draft.
        "raw_accepted_tokens": accepted,
        "raw_acceptance_length": 1.0 + accepted / 40 if not baseline else 1.0,
        "raw_acceptance_rate_per_pos": rates,
        "alpha": None if baseline else alpha,
        "target_passes": output - accepted,
        "tokens_per_pass": output / (output - accepted),
        "draft_coverage": 0.0 if baseline else 40 / (output - accepted),
        "speedup": speedup,
        "speedup_ci_low": None if speedup is None else speedup * 0.9,
        "speedup_ci_high": None if speedup is None else speedup * 1.1,
        # The pooled spread behind an interval is left out: the +-10% above is not built from one.
        "speedup_log_sd": None,
        "speedup_df": None,
        "decode_speedup": speedup,
        "exact_match": None if speedup is None else True,
        "mismatched_requests": None if speedup is None else 0,
        # Speculative rows: exact against their baseline. Baselines: no control (as at batch 1).
        "exactness": None if speedup is None or baseline else "exact",
        "differing_requests": None if speedup is None or baseline else 0,
        "tie_requests": None if speedup is None or baseline else 0,
        "divergences": [],
        "exactness_reference": None if baseline else base_id,
        "flagged": False,
        "flag_reasons": [],
        "caveats": [],
        "attempts": 1,
        "other_cpu_share_per_attempt": [0.01],
        "reached_concurrency": batch,
        "specbench_version": "0.1.0",
        "git_commit": "abc123def456",
        "vllm_version": "0.32.0",
        "torch_version": "2.13.0+cpu",
        "transformers_version": "5.19.0",
        "python_version": "3.11.7",
        "machine": "CPU AMD EPYC (2 cores)",
        "host": "vm",
        "started_at": f"2026-11-29T11:{10 + batch:02d}:00+00:00",
        "prompt_ids": ["summarize-001", "summarize-002"],
        "config_json": json.dumps(
            {"method": {"name": method}, "num_speculative_tokens": k, "batch_size": batch,
             "workload": {"name": workload, "num_prompts": 4, "max_tokens": 64},
             "model": {"name": "smollm2-135m"}, "repetitions": 2, "engine_runs": 1, "seed": 0,
             "sweep_name": "demo"}
        ),
    }
    return row | overrides


def grid_rows() -> list[dict[str, Any]]:
    """Baselines plus every (workload, method, K, batch) of GRID."""
    rows = [make_row("baseline", batch=b, workload=w) for w in ("summarize", "creative") for b in BATCHES]
    for (workload, method, k), speedups in GRID.items():
        alpha = 0.8 if method == "ngram" else 0.4
        rows += [make_row(method, k, b, workload, s, alpha) for b, s in zip(BATCHES, speedups)]
    return rows


def write_results(
    directory: Path,
    rows: Iterable[dict[str, Any]],
    extra: Mapping[str, list] | None = None,
    drop: Iterable[str] = (),
) -> Path:
    """results.parquet in ``directory`` with the real schema, plus columns not in it yet, less ``drop``."""
    table = rows_to_table(list(rows)).drop_columns(list(drop))
    for name, values in (extra or {}).items():
        table = table.append_column(name, pa.array(values))
    path = directory / "results.parquet"
    write_table(table, path)
    return path


def cell_row(cell_id, method, wall, *, baseline_id=None, engine_run=0, config_hash=None, reps=None, k=2):
    """A cell file's row: ``wall`` seconds per repetition (3 by default, +-1%), fixed counters."""
    reps = reps or [wall * 0.99, wall, wall * 1.01]
    row = {
        "cell_id": cell_id, "baseline_cell_id": baseline_id, "status": "ok", "model": "m", "method": method,
        "num_speculative_tokens": 0 if method == "baseline" else k, "batch_size": 1, "workload": "summarize",
        "engine_run": engine_run, "engine_runs": 1, "config_hash": config_hash or cell_id,
    }
    row |= measured_fields(
        rep_wall_s=reps, rep_output_tokens=[100] * len(reps), num_requests=2,
        drafts=0 if method == "baseline" else 20, draft_tokens=0 if method == "baseline" else 40,
        accepted_tokens=0 if method == "baseline" else 30,
        accepted_per_pos=[] if method == "baseline" else [16, 14],
        ttft_s=[0.1, 0.2], tpot_s=[0.02 if method == "baseline" else 0.01] * 2, e2e_s=[1.0, 1.1],
    )
    return row


def write_cell(cells: Path, row, tokens):
    CellFiles(cells, row["cell_id"]).write(row, tokens, ["p0", "p1"])
