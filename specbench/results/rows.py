"""A cell's row: the one place its columns are put together, and the one place a speedup is computed.

A cell file's row (``cells/<cell_id>.parquet``) is, in this order: the cell's
identity, the run's provenance, then either the failure or what was
measured (:func:`specbench.results.metrics.measured_fields` and the raw
counters, the engine's versions and hardware, the requests), the machine's
state, the engine's memory (:func:`memory_columns`) and the attempts. The
merge adds the comparison with the baseline, whose speedup
(:func:`speedup`, :func:`decode_speedup`) is the same number the terminal
line shows for one engine run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from specbench import methods, sampling
from specbench.measure import CellPlan, Measurement, SpecCounters
from specbench.engine import MODE_COLUMNS, EngineInfo, EngineMemory
from specbench.results.metrics import measured_fields, position_rates
from specbench.results.schema import SCHEMA_VERSION


class Cell(Protocol):
    """What a row reads of a cell (:class:`specbench.config.Cell`; named by its shape, since the config
    layer, which validates against the workloads and the heads, sits above the results)."""

    @property
    def identity(self) -> dict[str, Any]: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def cell_id(self) -> str: ...
    @property
    def config_hash(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def k(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def workload(self) -> dict[str, Any]: ...
    @property
    def engine_run(self) -> int: ...
    @property
    def is_baseline(self) -> bool: ...
    def baseline(self) -> Cell: ...


class Workload(Protocol):
    """What a row reads of the cell's workload (:class:`specbench.workloads.Workload`)."""

    @property
    def source_fingerprint(self) -> str: ...
    @property
    def prompt_ids(self) -> list[str]: ...
    @property
    def skipped_too_long(self) -> int: ...


def failed_row(cell: Cell, engine_runs: int, provenance: Mapping[str, Any], *, error: str, machine: str) -> dict[str, Any]:
    """The row of a cell that failed: its identity, the run's provenance, the error and where it ran."""
    return _identity_columns(cell, engine_runs) | dict(provenance) | {
        "status": "failed", "error": error, "machine": machine,
    }


def measured_row(
    cell: Cell,
    engine_runs: int,
    provenance: Mapping[str, Any],
    *,
    measurement: Measurement,
    info: EngineInfo,
    workload: Workload,
    plan: CellPlan,
    machine: Mapping[str, Any],
    memory: Mapping[str, Any],
    other_cpu_share_per_attempt: Sequence[float | None],
) -> dict[str, Any]:
    """The row of a measured cell.

    ``provenance``: :func:`~specbench.results.provenance.static_provenance`
    and the start time; ``machine``: the machine's state after the
    measurement (:func:`~specbench.results.provenance.machine_state`);
    ``memory``: :func:`memory_columns`; ``other_cpu_share_per_attempt``: the
    share of the cores other processes took during each attempt, in order (the
    kept attempt is the least disturbed).
    """
    shares = list(other_cpu_share_per_attempt)
    return (_identity_columns(cell, engine_runs) | dict(provenance)
            | _measured_columns(measurement, info, workload, plan) | dict(machine) | dict(memory)
            | {"other_cpu_share": min((s for s in shares if s is not None), default=None),
               "attempts": len(shares), "other_cpu_share_per_attempt": shares})


def memory_columns(
    memory: EngineMemory,
    *,
    request_tokens: int,
    checkpoint_bytes: tuple[int | None, int | None] = (None, None),
) -> dict[str, Any]:
    """Row columns from an engine's memory.

    ``request_tokens``: the KV slots the cell's longest request takes
    (:func:`specbench.analytic.footprint.request_kv_tokens`), which says how
    many such requests the KV cache holds. ``checkpoint_bytes`` (target,
    drafter) from :func:`specbench.analytic.memory.checkpoint_weight_bytes`
    replace the engine's parameter counts where known.
    """
    target_bytes, drafter_bytes = checkpoint_bytes
    return {
        "target_weight_bytes": target_bytes if target_bytes is not None else memory.target_weight_bytes,
        "drafter_weight_bytes": (drafter_bytes if drafter_bytes is not None and memory.drafter_weight_bytes
                                 else memory.drafter_weight_bytes),
        "kv_cache_blocks": memory.kv_cache_blocks,
        "kv_block_size": memory.kv_block_size,
        "kv_cache_tokens": memory.kv_cache_tokens,
        "kv_bytes_per_token": memory.kv_bytes_per_token,
        "kv_cache_bytes": memory.kv_cache_bytes,
        "kv_request_tokens": request_tokens,
        "kv_requests_fit": memory.kv_cache_tokens // request_tokens,
        "peak_gpu_allocated_bytes": memory.peak_gpu_allocated_bytes,
        "peak_gpu_reserved_bytes": memory.peak_gpu_reserved_bytes,
        "gpu_used_bytes": memory.gpu_used_bytes,
        "peak_rss_bytes": memory.peak_rss_bytes,
    }


def speedup(baseline: Mapping[str, Any], cell: Mapping[str, Any]) -> float:
    """A speculative cell's speedup in one engine run, at equal work: its baseline's time per output token
    over its own (median wall time over the output tokens of a repetition).

    Where both produced the same number of tokens (greedy decoding, exact) this
    is the ratio of wall times. Where they need not (sampling: the outputs,
    hence where requests stop, differ; 16-bit cells that part at ties), a wall-time
    ratio would compare different amounts of work, and because each request's
    seed repeats in every engine run the bias would be the same in every run,
    invisible to the interval: 7% more output tokens would understate the
    speedup by 7%. (The prompts' prefill is the same on both sides; spread over
    more output tokens it makes the longer side look slightly cheaper per token.)
    """
    return baseline["wall_time_s"] / cell["wall_time_s"] * output_token_ratio(baseline, cell)


def output_token_ratio(baseline: Mapping[str, Any], cell: Mapping[str, Any]) -> float:
    """A cell's output tokens over its baseline's, in one engine run: 1 where the outputs are equal in length."""
    if not baseline.get("output_tokens") or not cell.get("output_tokens"):
        raise ValueError(f"output_tokens must be positive to compare work: baseline {baseline.get('output_tokens')!r}, "
                         f"cell {cell.get('output_tokens')!r}")
    return cell["output_tokens"] / baseline["output_tokens"]


def decode_speedup(baseline: Mapping[str, Any], cell: Mapping[str, Any]) -> float | None:
    """The speedup of decoding alone in one engine run (None when a side has no decode time).

    Token-weighted mean TPOT: the ratio of total decode time. (A median
    request's TPOT is a latency; it moves with which request is median.)
    Rows written before ``tpot_s_mean`` existed fall back on the p50.
    """
    column = "tpot_s_mean" if baseline.get("tpot_s_mean") and cell.get("tpot_s_mean") else "tpot_s_p50"
    if baseline.get(column) and cell.get(column):
        return baseline[column] / cell[column]
    return None


def _identity_columns(cell: Cell, engine_runs: int) -> dict[str, Any]:
    engine = cell.identity["engine"]
    return {
        "schema_version": SCHEMA_VERSION,
        "cell_id": cell.cell_id,
        "baseline_cell_id": None if cell.is_baseline else cell.baseline().cell_id,
        "model": cell.identity["model"]["name"],
        "method": cell.method,
        "method_label": methods.label(cell.config["method"], cell.k),
        "num_speculative_tokens": cell.k,
        "k_schedule": cell.config["method"].get(methods.SCHEDULE),
        "batch_size": cell.batch_size,
        "workload": cell.workload["name"],
        "engine_run": cell.engine_run,
        "engine_runs": engine_runs,
        "repetitions": cell.identity["repetitions"],
        "dtype": engine["dtype"],
        "enable_prefix_caching": engine["enable_prefix_caching"],
        "enforce_eager": engine["enforce_eager"],
        "max_model_len": engine["max_model_len"],
        "seed": cell.identity["seed"],
        **_sampling_columns(cell),
        "workload_source": cell.workload["source"],
        "config_hash": cell.config_hash,
        "config_json": json.dumps(cell.config, sort_keys=True),
    }


def _distribution_columns(m: Measurement) -> dict[str, Any]:
    """The distribution check's draws and cost (sampled cells), beside the timed seconds."""
    drawn = m.distribution
    if drawn is None:
        return {}
    return {
        "distribution_samples": drawn.samples,
        "distribution_check_s": drawn.seconds,
        "distribution_check_share": drawn.seconds / sum(m.rep_wall_s) if sum(m.rep_wall_s) else None,
        "distribution_drafts": drawn.drafts,
        "distribution_accepted_tokens": drawn.accepted_tokens,
    }


def _sampling_columns(cell: Cell) -> dict[str, Any]:
    """Temperature, top_p and top_k as the cell sampled (greedy defaults where unset), and its seed rule."""
    settings = sampling.from_config(cell.identity)
    return {
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "top_k": settings.top_k,
        "seed_rule": None if settings.greedy else sampling.SEED_RULE,
    }


def _measured_columns(m: Measurement, info: EngineInfo, workload: Workload, plan: CellPlan) -> dict[str, Any]:
    raw = m.counters
    # What reached the output: vLLM counts drafts accepted past an output's end.
    c = raw - SpecCounters(accepted_tokens=m.truncated_accepted, accepted_per_pos=m.truncated_per_pos)
    return measured_fields(
        rep_wall_s=m.rep_wall_s,
        rep_output_tokens=m.rep_output_tokens,
        num_requests=len(plan.prompts),
        drafts=c.drafts,
        draft_tokens=c.draft_tokens,
        accepted_tokens=c.accepted_tokens,
        accepted_per_pos=c.accepted_per_pos,
        drafted_per_pos=c.drafted_per_pos,
        ttft_s=m.ttft_s,
        tpot_s=m.tpot_s,
        e2e_s=m.e2e_s,
        request_acceptance=m.request_acceptance,
        request_decode_passes=m.request_decode_passes,
        token_ids=m.token_ids,
        decode_s=m.decode_s,
        decode_tokens=m.decode_tokens,
    ) | {
        "reached_concurrency": m.reached_concurrency,
        "raw_accepted_tokens": raw.accepted_tokens,
        "raw_acceptance_length": 1.0 + raw.accepted_tokens / raw.drafts if raw.drafts else 1.0,
        "raw_acceptance_rate_per_pos": position_rates(raw.accepted_per_pos, raw.drafted_per_pos, raw.drafts),
        "top2_margins": m.top2_margins or None,
        "near_tie_tokens": m.near_tie_tokens or None,
        **_distribution_columns(m),
        "status": "ok",
        "num_requests": len(plan.prompts),
        "prompt_tokens": m.prompt_tokens,
        "outputs_stable": m.outputs_stable,
        "warmup_s": m.warmup_s,
        "engine_start_s": info.start_s,
        "vllm_version": info.vllm_version,
        "torch_version": info.torch_version,
        "transformers_version": info.transformers_version,
        "vllm_fixes": ",".join(info.vllm_fixes),
        "engine_id": info.engine_id,
        "engine_allocator": info.allocator,
        "engine_huge_page_bytes": info.huge_page_bytes,
        "vllm_plugins": ",".join(info.plugins),
        "machine": info.machine,
        # How vLLM resolved the engine's mode (model runner, async scheduling, graphs, step budget).
        **(info.mode.columns() if info.mode is not None else dict.fromkeys(MODE_COLUMNS)),
        "workload_fingerprint": workload.source_fingerprint,
        "requests_fingerprint": plan.fingerprint,
        "prompt_ids": workload.prompt_ids,
        "skipped_too_long": workload.skipped_too_long,
    }
