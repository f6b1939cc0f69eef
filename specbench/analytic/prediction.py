"""The analytic model beside every measurement: predicted speedups for merged rows.

For each measured row, :func:`with_predicted_speedups` prices the row's own cell with
the model's modules in :mod:`specbench.analytic`:

- hardware: the profile the sweep's config names (``hardware=<name>``, from
  ``conf/hardware``), else the calibrated profile of this machine that
  ``python -m specbench.calibrate`` stored in the user cache;
- model: the target's own config.json (``ModelProfile.from_config_json``),
  at the dtype the cell ran in; the drafter from :func:`drafter_profile`
  (a draft model's config.json; an EAGLE head's own shapes, as the plan and
  the memory model price it too);
- acceptance: tokens and drafted tokens per *decode* pass
  (:func:`decode_acceptance`), from the row's own counters
  (``predicted_speedup``, ``predicted_decode_speedup``) or from those of the
  batch-size-1 row of the same method, K and workload
  (``predicted_speedup_bs1_alpha``), which tests whether acceptance measured
  once predicts the whole batch-size curve;
- context: mean prompt tokens per request plus half the mean output tokens
  per request (the average KV length a decode step attends to).

``predicted_decode_speedup`` is held against the measured ``decode_speedup``,
a ratio of mean TPOTs, and is priced as one: each request's TPOT as its batch
thins (requests that accept much finish early, and the rest step at a
smaller batch) and, where a batch's prompts take several prefill steps,
beside the chunks prefilled after it (:func:`speedup.mean_tpot`); with every
request at the mean, it is :func:`speedup.predicted_decode_speedup`. ``predicted_speedup``
adds the prefill of each batch (:func:`steps.prefill_time`), which the
target pays alike with and without speculation, and the drafter's own pass
over the prompts (:func:`drafting.draft_prefill_time`: draft_model and EAGLE),
which only the speculative side pays; it is held against the wall-time
``speedup``: on long prompts prefill dilutes the decode gain. It also pays
each batch's tail (:func:`speedup.batch_tail`): a batch decodes until its
slowest request is done, and requests that accept little need many more
passes than those that accept much; the row's per-request pass counts
(``decode_passes_per_request``, ``output_tokens_per_request``) give it.

``controlled`` cells are priced like ``ngram``: their draft is a table
lookup on the host, free next to a forward pass. Each pass verifies the
drafts the row's engine proposed, except where the profile's model runner
pads a lookup drafter's misses (``ngram`` and ``ngram_gpu`` on Model Runner
V2, a GPU profile's: :func:`drafting.verified_draft_tokens`), where it
verifies K. A row the model cannot
price gets nulls and a ``prediction_note`` saying why.

:func:`accuracy` and :func:`break_even` hold the predictions against the
measurements; ``python -m specbench.analytic.prediction <sweep>`` prints both (and
``--reprice`` prices an existing sweep again, e.g. after a new calibration, and says which of its rows a
calibration narrowed to another sweep's range prices outside what it measured: :func:`extrapolated_rows`).
Result rows (dicts) in and out; no vLLM.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import MISSING

from specbench import methods, models, paths
from specbench.analytic import drafting, profiles, speedup, steps
from specbench.results.schema import SCHEDULE_KEY, curve_key, method_label, results_path, row_config
from specbench.results.serving import is_serving_row

CALIBRATED_FILE = "calibrated.yaml"
CALIBRATE_HINT = (
    "no hardware profile for the analytic model: run `python -m specbench.calibrate` "
    "(measures this machine, a few minutes) or pass hardware=<name> (conf/hardware); "
    "predicted_speedup columns left empty"
)
# vLLM's max_num_batched_tokens for the offline LLM on CPU, used when the
# engine config leaves it to vLLM (EngineArgs.get_batch_defaults, vLLM 0.32);
# GPUs default higher, see default_step_tokens.
DEFAULT_STEP_TOKENS = 4096
# The offline LLM's GPU defaults: 16384 on GPUs of 70 GiB or more except the
# A100 (vLLM measured a regression there), 8192 on the rest.
_GPU_STEP_TOKENS, _LARGE_GPU_STEP_TOKENS = 8192, 16384
# GPUs with at least 70 GiB in every variant, by the name the driver reports.
_LARGE_GPUS = ("h100", "h200", "h800", "h20", "gh200", "b200", "b300", "gb200", "gb300", "mi300", "mi325", "mi355")
PREDICTED_SPEEDUP_COLUMNS = ("predicted_speedup", "predicted_decode_speedup", "predicted_speedup_bs1_alpha")


def calibrated_path() -> Path:
    """The calibrated profile of this machine that later sweeps use."""
    return paths.hardware_dir() / CALIBRATED_FILE


@dataclass
class HardwareSchema:
    """The keys of a ``hardware`` config (conf/hardware/*.yaml) and their types, checked by Hydra.

    The rates are :meth:`profiles.HardwareProfile.from_mapping`'s (its units);
    memory and the step budget are what the memory model and the plan read
    (:mod:`specbench.analytic.memory`).
    """

    name: str = MISSING
    source: str = MISSING  # vendor (a datasheet) or calibrated
    memory_bandwidth_gbps: float = MISSING
    peak_tflops: float = MISSING
    fixed_overhead_ms: float = MISSING
    kv_bandwidth_gbps: Optional[float] = None
    attention_tflops: Optional[float] = None
    per_sequence_overhead_ms: Optional[float] = None
    draft_overhead_ms: Optional[float] = None
    head_draft_overhead_ms: Any = None  # method name -> ms: a draft pass timed on that method's head
    head_draft_step_overhead_ms: Any = None  # method name -> ms: that head's draft cost once per speculative step
    per_layer_overhead_ms: Optional[float] = None  # per decoder layer and pass (a GPU's kernel latency)
    overlap_exponent: Optional[float] = None  # how fully matmul reads and compute overlap (inf: max())
    memory_bytes: Optional[int] = None  # a GPU's memory as the driver reports it
    memory_gb: Optional[float] = None
    max_num_batched_tokens: Optional[int] = None  # vLLM's default step budget on it
    notes: str = ""
    # A calibrated profile's record of how it was measured (calibrate writes it; the model reads none of it).
    device: Optional[str] = None
    model: Any = None
    measured_at: Optional[str] = None
    vllm_version: Optional[str] = None
    settings: Any = None
    rms_residual: Any = None
    residuals: Any = None
    samples: Any = None
    samples_measured: Any = None
    draft_samples: Any = None
    lookup_samples: Any = None  # ngram's timed decode passes, behind its head_draft_overhead_ms entry
    sources: Any = None  # where each figure of a datasheet profile came from
    device_rates: Any = None  # the copy bandwidth and matmul rate that bounded the fit
    fit_warnings: Any = None  # rates at their bound, residuals beyond 10%


@dataclass(frozen=True)
class HardwareChoice:
    """The hardware profile a sweep is priced with, and where it came from."""

    profile: profiles.HardwareProfile
    label: str  # what the hardware_profile column records


def choose_hardware(config_hardware: Mapping[str, Any] | None) -> HardwareChoice | None:
    """The config's hardware profile if set, else the calibrated one, else None."""
    if config_hardware:
        profile = profiles.HardwareProfile.from_mapping(config_hardware)
        return HardwareChoice(profile, f"{profile.name} ({profile.source}, hardware={profile.name})")
    path = calibrated_path()
    if not path.is_file():
        return None
    return load_hardware_file(path)


# The calibrated profile's settings key listing the EAGLE heads its calibration left out by choice
# (``calibrate --heads``), which ``calibrate --add-heads`` times later.
HEADS_LEFT_OUT = "heads_left_out"


def heads_left_out(methods: Iterable[str], config_hardware: Mapping[str, Any] | None) -> list[str]:
    """Those of ``methods`` whose EAGLE head the calibrated profile that would price them (no ``hardware``
    in the sweep's config) left out by choice (``calibrate --heads``): their draft passes would be priced
    with another head's cost per pass, silently off, until ``calibrate --add-heads`` times them."""
    path = calibrated_path()
    if config_hardware or not path.is_file():
        return []
    settings = (yaml.safe_load(path.read_text()) or {}).get("settings") or {}
    return [m for m in dict.fromkeys(methods) if m in (settings.get(HEADS_LEFT_OUT) or [])]


# The calibrated profile's settings key of a calibration narrowed to one sweep's range (``calibrate
# --batch-sizes``, ``--prompt-lengths``, ``--draft-ks``): the batch sizes, prompt lengths and head K it measured;
# absent from a full calibration.
NARROWED_TO = "narrowed_to"
# The K a full calibration times each EAGLE head at (``calibrate.DRAFT_KS``, which says why). Timed at fewer, a
# head's cost per speculative step is folded into its passes' at the K it was timed at.
DRAFT_KS = (2, 8)


@dataclass(frozen=True)
class PricedExtent:
    """What of a cell decides whether a calibration measured what prices it: its batch, the longest prompt its
    pricing reads, and the K its method drafts at (:func:`coverage_gaps`)."""

    method: str
    k: int  # the K drafted at this batch size (a K schedule's entry); 0 for plain decoding
    batch_size: int
    workload: str  # its name
    prompt_tokens: int | None  # the longest prompt priced; None where it is not known

    @classmethod
    def of_config(cls, plain: Mapping[str, Any], longest_prompt: int | None) -> PricedExtent:
        """A cell's, from its resolved config and its longest prompt (:func:`specbench.config.longest_prompt`)."""
        method, batch = plain["method"]["name"], int(plain["batch_size"])
        k = 0 if method == "baseline" else effective_k(
            plain["method"].get("speculative_config"), int(plain["num_speculative_tokens"]), batch)
        return cls(method, k, batch, plain["workload"]["name"], longest_prompt)

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> PricedExtent:
        """A measured row's, as :func:`with_predicted_speedups` prices it: its K at its batch size, and its prompts
        at their mean (the one prompt length its prediction reads)."""
        batch = int(row["batch_size"])
        speculative = (row_config(row).get("method") or {}).get("speculative_config")
        requests, prompts = row.get("num_requests"), row.get("prompt_tokens")
        return cls(row["method"], effective_k(speculative, int(row.get("num_speculative_tokens") or 0), batch), batch,
                   row["workload"], math.ceil(prompts / requests) if requests and prompts is not None else None)


def coverage_gaps(narrowed: Mapping[str, Any], cells: Iterable[PricedExtent], head_ks: Mapping[str, set[int]]
                  ) -> list[str]:
    """What of ``cells`` lies outside a narrowed calibration's range (its settings' :data:`NARROWED_TO`), one
    phrase each: a batch above its largest, prompts longer than its longest, an EAGLE head at a K it was not
    timed at where it was timed at fewer than :data:`DRAFT_KS` (``head_ks``: each timed head's K). Empty: all
    covered."""
    batch, prompt = max(narrowed["batch_sizes"]), max(narrowed["prompt_lengths"])
    gaps: dict[str, None] = {}
    for cell in cells:
        if cell.batch_size > batch:
            gaps[f"batch {cell.batch_size} above its {batch}"] = None
        if cell.prompt_tokens is None or cell.prompt_tokens > prompt:
            gaps[f"{cell.workload} prompts of up to {cell.prompt_tokens or 'unknown'} tokens above its {prompt}"] = None
        ks = head_ks.get(cell.method)
        if cell.k and ks and not ks >= set(DRAFT_KS) and cell.k not in ks:
            gaps[f"{cell.method} at K={cell.k}, its head timed at K={','.join(map(str, sorted(ks)))}"] = None
    return list(gaps)


def narrowed_gaps(cells: Iterable[PricedExtent], config_hardware: Mapping[str, Any] | None) -> list[str]:
    """:func:`coverage_gaps` of ``cells`` against the calibrated profile that would price them (no ``hardware``
    in the sweep's config), where its calibration was narrowed to another sweep's range; empty where it was
    not, or a named profile prices them. Priced outside that range, their predictions are extrapolated until
    ``calibrate --complete`` times the rest of the default calibration."""
    path = calibrated_path()
    if config_hardware or not path.is_file():
        return []
    doc = yaml.safe_load(path.read_text()) or {}
    if not (narrowed := (doc.get("settings") or {}).get(NARROWED_TO)):
        return []
    head_ks = {m: {r["k"] for r in records} for m, records in (doc.get("head_draft_samples") or {}).items()}
    return coverage_gaps(narrowed, cells, head_ks)


def narrower_than(gaps: Sequence[str]) -> str:
    """The calibrated profile named, with what of a sweep (:func:`narrowed_gaps`) its calibration left out."""
    return f"the calibrated profile {calibrated_path()} was measured for a narrower sweep ({'; '.join(gaps)})"


def extrapolated_note(gaps: Sequence[str], priced: str) -> str:
    """One line: ``priced`` (cells, rows) predicted with the calibrated profile outside what it measured
    (``gaps``, :func:`narrowed_gaps`), and the command that measures it."""
    return (f"{narrower_than(gaps)}: the predictions for those {priced} are extrapolated; `python -m "
            "specbench.calibrate --complete` times the rest of the default calibration, as a sweep of them does "
            "before its cells")


def load_hardware_file(path: Path) -> HardwareChoice:
    """A hardware profile YAML (conf/hardware or calibrated) as a :class:`HardwareChoice`."""
    data = yaml.safe_load(path.read_text())
    profile = profiles.HardwareProfile.from_mapping(data)
    when = f", measured {data['measured_at']}" if data.get("measured_at") else ""
    return HardwareChoice(profile, f"{profile.name} ({profile.source}{when}, {path})")


def default_step_tokens(hardware: str | None) -> int:
    """vLLM's default max_num_batched_tokens for the offline LLM on the hardware a row names.

    Mirrors ``EngineArgs.get_batch_defaults``: 4096 on CPU, 16384 on GPUs of
    70 GiB or more other than the A100, 8192 on other GPUs. ``hardware`` is
    the row's ``hardware`` column (``"CPU ..."`` or ``"<n>x <GPU name>"``);
    unknown hardware is taken as a CPU, this project's default engine.
    """
    text = (hardware or "").lower()
    if not text or text.startswith("cpu"):
        return DEFAULT_STEP_TOKENS
    name = text.split("x ", 1)[-1]
    if "a100" not in name and any(gpu in name for gpu in _LARGE_GPUS):
        return _LARGE_GPU_STEP_TOKENS
    return _GPU_STEP_TOKENS


def context_length(row: Mapping[str, Any]) -> float | None:
    """Mean KV length a decode step attends to: prompt tokens + half the output, per request."""
    requests = row.get("num_requests")
    if not requests or row.get("prompt_tokens") is None or row.get("output_tokens") is None:
        return None
    return (row["prompt_tokens"] + 0.5 * row["output_tokens"]) / requests


def effective_k(speculative_config: Mapping[str, Any] | None, k: int, batch_size: int) -> int:
    """The K vLLM uses at this batch size: the schedule's entry (capped at K) when one is set.

    Mirrors vLLM's lookup: inclusive ranges, a gap takes the previous
    range's K, sizes past the last range keep the last K. vLLM looks up the
    number of requests scheduled in each step, which falls below the
    submitted batch size while a batch prefills in chunks or drains; the
    prediction uses the submitted batch size.
    """
    schedule = (speculative_config or {}).get(SCHEDULE_KEY)
    if not schedule:
        return k
    chosen = None
    for start, end, entry_k in sorted(tuple(e) for e in schedule):
        if start > batch_size:
            break
        chosen = entry_k
    return k if chosen is None else min(k, int(chosen))


@lru_cache(maxsize=32)
def _profile_from(folder: str, dtype: str, name: str) -> profiles.ModelProfile:
    return profiles.ModelProfile.from_config_json(folder, dtype=dtype, name=name)


def model_profile(reference: str, dtype: str, name: str | None = None) -> profiles.ModelProfile:
    """Profile of a checkpoint from its config.json; ValueError naming what is missing.

    ``reference`` is what a config names: ``embedded:<name>`` (resolved to its
    prepared folder, without preparing it), a local folder, or a hub id found
    in the local Hugging Face cache or in ``models.PUBLISHED_CONFIGS``.
    """
    folder = Path(models.resolve(reference, prepare=False)).expanduser()
    if not (folder / "config.json").is_file():
        cached = _hub_config(reference)
        if cached is None and reference in models.PUBLISHED_CONFIGS:
            return profiles.ModelProfile.from_config_json(
                models.PUBLISHED_CONFIGS[reference], dtype=dtype, name=name or reference
            )
        if cached is None:
            raise ValueError(f"no config.json for {reference} (looked in {folder} and the HF cache)")
        folder = cached.parent
    return _profile_from(str(folder), dtype, name or reference)


def _hub_config(reference: str) -> Path | None:
    if models.is_embedded(reference) or reference.count("/") != 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(reference, "config.json")
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def drafter_profile(
    method: Mapping[str, Any], target: profiles.ModelProfile, dtype: str
) -> profiles.ModelProfile | None:
    """The drafter's profile, for pricing and memory alike; None for drafters without weights.

    ``method`` is a cell's method config (name, speculative_config). The
    method's cost model (:meth:`drafting.DraftCost.drafter`) makes it from
    the config.json of the checkpoint ``speculative_config.model`` names
    (:attr:`methods.Method.checkpoint`). A draft model: its own config.json,
    a ValueError when it is missing. An EAGLE head:
    ``drafting.eagle_head_profile`` from the head's config.json (its one
    layer, EAGLE-3's reduced vocabulary), or from the target's shapes where
    the head's config cannot be read (a hub id offline): an upper bound.
    """
    registered = methods.get(method.get("name"))
    if registered is None or registered.cost is None:
        return None
    spec = method.get("speculative_config") or {}
    checkpoint = None
    if registered.checkpoint == "model" and spec.get("model"):
        checkpoint = model_profile(spec["model"], dtype)
    elif registered.checkpoint == "head":
        checkpoint = _head_shapes(spec.get("model"), dtype)
    return drafting.cost_model(registered.cost).drafter(target, checkpoint)


def _head_shapes(reference: str | None, dtype: str) -> profiles.ModelProfile | None:
    if not reference:
        return None
    try:
        return model_profile(reference, dtype)
    except (KeyError, ValueError, OSError):
        return None


class _Unpriced(Exception):
    """A row the model cannot price; the message says why."""


@dataclass(frozen=True)
class DecodeAcceptance:
    """What a row's counters say about its decode passes (prefill passes excluded)."""

    tokens_per_pass: float  # output tokens after each request's first / decode passes
    draft_tokens_per_pass: float  # drafted tokens per decode pass (K when every pass drafts fully)


def decode_acceptance(row: Mapping[str, Any]) -> DecodeAcceptance:
    """Tokens and drafted tokens per decode pass, from a row's counters.

    Each request's first token comes from its prefill pass, which carries no
    draft; the rest come from decode passes, which is what the decode speedup
    (the TPOT ratio) and the step model describe. Passes are bounded below by
    requests + drafts, as :func:`specbench.results.measured_fields` does
    (rows written before it did get the same bound here).
    """
    runs = len(row.get("wall_time_s_reps") or [])
    requests = (row.get("num_requests") or 0) * runs
    if not runs or not requests or row.get("target_passes") is None or row.get("output_tokens") is None:
        raise _Unpriced("no pass counts (target_passes, output_tokens, repetitions)")
    k = int(row["num_speculative_tokens"])
    drafts = row.get("drafts") or 0
    passes = max(float(row["target_passes"]), requests + drafts)
    decode_passes = passes - requests
    decode_tokens = row["output_tokens"] * runs - requests
    if decode_passes <= 0 or decode_tokens <= 0:
        raise _Unpriced("no decode passes (one output token per request)")
    return DecodeAcceptance(
        tokens_per_pass=min(max(decode_tokens / decode_passes, 1.0), k + 1.0),
        draft_tokens_per_pass=min((row.get("draft_tokens") or 0) / decode_passes, float(k)),
    )


@dataclass(frozen=True)
class Prediction:
    """The model's speedups for one row: decode only, and end to end with prefill."""

    decode: float
    end_to_end: float


def _predict(
    row: Mapping[str, Any],
    cfg: Mapping[str, Any],
    hw: profiles.HardwareProfile,
    acceptance: DecodeAcceptance,
) -> Prediction:
    method = row["method"]
    priced_as = methods.cost(method)
    if priced_as is None:
        raise _Unpriced(f"method {method} has no cost model")
    context = context_length(row)
    if context is None:
        raise _Unpriced("prompt/output token counts missing")
    model_cfg = cfg.get("model") or {}
    dtype = row.get("dtype") or model_cfg.get("dtype") or "bfloat16"
    method_cfg = cfg.get("method") or {}
    speculative = method_cfg.get("speculative_config") or {}
    try:
        target = model_profile(model_cfg["path"], dtype, row.get("model"))
        draft = drafter_profile({**method_cfg, "name": method}, target, dtype)
    except (KeyError, ValueError) as exc:
        raise _Unpriced(f"no model profile: {exc}") from exc
    batch = int(row["batch_size"])
    k = effective_k(speculative, int(row["num_speculative_tokens"]), batch)
    # What the target verifies per pass: the drafts the row's engine proposed, or K on a model runner
    # that pads a lookup drafter's misses (pricing a CPU-measured ngram row for a GPU profile).
    drafted = drafting.verified_draft_tokens(k, min(acceptance.draft_tokens_per_pass, float(k)),
                                             padded=methods.pads_drafts(method, hw.model_runner))
    tokens_per_pass = min(acceptance.tokens_per_pass, k + 1.0)
    decode = speedup.predicted_decode_speedup(
        method=priced_as, k=k, batch_size=batch, tokens_per_pass=tokens_per_pass, target=target, hw=hw,
        context_len=context, draft=draft, draft_tokens_per_pass=drafted,
    )
    # One batch as the cell runs it: prefill every prompt, then decode the
    # tokens after each request's first (which the prefill pass emits).
    requests = row["num_requests"]
    step_tokens = (cfg.get("engine") or {}).get("max_num_batched_tokens") or default_step_tokens(row.get("machine"))
    prompt_len = max(row["prompt_tokens"] / requests, 1.0)
    prefill = steps.prefill_time(target, hw, batch, prompt_len, max_step_tokens=step_tokens)
    # A draft model or EAGLE head processes the prompts too; only the speculative side pays it.
    draft_prefill = drafting.draft_prefill_time(
        priced_as, hw=hw, batch_size=batch, prompt_len=prompt_len, max_step_tokens=step_tokens,
        draft=draft, target=target,
    )
    output_len = max(row["output_tokens"] / requests, 1.0)

    def plain_step(b: int) -> float:
        return steps.plain_decode_step(target, hw, b, context)

    def speculative_step(b: int) -> float:
        return speedup.speculative_step(priced_as, target=target, hw=hw, batch_size=b, k=k, context_len=context,
                                        draft=draft, draft_tokens_per_pass=drafted)

    outputs, plain_passes, speculative_passes = _requests(row, batch, output_len, tokens_per_pass)
    end_to_end = speedup.end_to_end_speedup(
        decode, prefill, (output_len - 1.0) * plain_step(batch), draft_prefill,
        plain_tail=speedup.batch_tail(plain_passes, plain_step),
        speculative_tail=speedup.batch_tail(speculative_passes, speculative_step))
    # The measured decode speedup is a ratio of mean TPOTs: each request's TPOT carries the
    # batch thinning around it and, where the prompts take several steps, the later chunks.
    prefill_steps, _ = steps.prefill_steps(batch, prompt_len, step_tokens)
    plain_tpot = speedup.mean_tpot(plain_passes, outputs, plain_step, prefill_steps=prefill_steps,
                                   mixed_step_s=prefill / prefill_steps)
    speculative_tpot = speedup.mean_tpot(speculative_passes, outputs, speculative_step, prefill_steps=prefill_steps,
                                         mixed_step_s=(prefill + draft_prefill) / prefill_steps)
    return Prediction(plain_tpot / speculative_tpot, end_to_end)


def _requests(
    row: Mapping[str, Any], batch: int, output_len: float, tokens_per_pass: float
) -> tuple[list[list[float]], list[list[float]], list[list[float]]]:
    """Per batch, in submission order: each request's output tokens, and its decode passes plain and speculative.

    From the row's per-request counts (requests are submitted in batches of
    ``batch``, in the order the lists keep; plainly, request i decodes in
    output_i - 1 passes); without them, one batch of the mean request.
    """
    outputs = row.get("output_tokens_per_request") or []
    passes = row.get("decode_passes_per_request") or []
    if not outputs or len(outputs) != len(passes) or any(v is None for v in (*outputs, *passes)):
        return ([[output_len] * batch], [[output_len - 1.0] * batch],
                [[(output_len - 1.0) / tokens_per_pass] * batch])
    chunks = range(0, len(outputs), batch)
    return ([[float(n) for n in outputs[i : i + batch]] for i in chunks],
            [[max(n - 1.0, 0.0) for n in outputs[i : i + batch]] for i in chunks],
            [[float(p) for p in passes[i : i + batch]] for i in chunks])


def with_predicted_speedups(
    rows: Sequence[dict[str, Any]], hardware: HardwareChoice | None
) -> list[dict[str, Any]]:
    """Rows with controlled_alpha, predicted_speedup, predicted_speedup_bs1_alpha,
    hardware_profile and prediction_note set.

    Failed rows get only controlled_alpha. Without a hardware profile every
    prediction is null and the note is :data:`CALIBRATE_HINT`.
    """
    configs = [row_config(r) for r in rows]
    bs1: dict[str, Mapping[str, Any]] = {}
    for row, cfg in zip(rows, configs):
        if row.get("status") == "ok" and row.get("batch_size") == 1:
            bs1[curve_key(row)] = row

    out = []
    for row, cfg in zip(rows, configs):
        method_cfg = cfg.get("method") or {}
        alpha = method_cfg.get("alpha") if row.get("method") == "controlled" else None
        new = dict(row, controlled_alpha=None if alpha is None else float(alpha))
        if row.get("status") != "ok":
            out.append(new)
            continue
        if hardware is None:
            out.append(new | dict.fromkeys(PREDICTED_SPEEDUP_COLUMNS)
                       | {"hardware_profile": None, "prediction_note": CALIBRATE_HINT})
            continue
        if row.get("method") == "baseline":
            out.append(new | dict.fromkeys(PREDICTED_SPEEDUP_COLUMNS, 1.0)
                       | {"hardware_profile": hardware.label, "prediction_note": None})
            continue
        notes = []
        try:
            predicted: Prediction | None = _predict(row, cfg, hardware.profile, decode_acceptance(row))
        except _Unpriced as exc:
            predicted = None
            notes.append(str(exc))
        key = curve_key(row)
        try:
            if key not in bs1:
                raise _Unpriced("no batch-size-1 row of this method, K and workload")
            from_bs1: Prediction | None = _predict(row, cfg, hardware.profile, decode_acceptance(bs1[key]))
        except _Unpriced as exc:
            from_bs1 = None
            notes.append(f"bs1 alpha: {exc}")
        out.append(new | {
            "predicted_speedup": predicted and predicted.end_to_end,
            "predicted_decode_speedup": predicted and predicted.decode,
            "predicted_speedup_bs1_alpha": from_bs1 and from_bs1.end_to_end,
            "hardware_profile": hardware.label,
            "prediction_note": "; ".join(dict.fromkeys(notes)) or None,
        })
    return out


def sweep_hardware(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The ``hardware`` profile the rows' configs name (their sweep's), else None: the calibrated one prices them."""
    return next((c["hardware"] for c in map(row_config, rows) if c.get("hardware")), None)


def predict_sweep(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """:func:`with_predicted_speedups` with the sweep's hardware choice; the second item is a
    line telling how to calibrate when there is no profile at all, else None."""
    choice = choose_hardware(sweep_hardware(rows))
    return with_predicted_speedups(rows, choice), (CALIBRATE_HINT if choice is None else None)


def extrapolated_rows(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """:func:`extrapolated_note` of the speculative rows the calibrated profile predicted (a baseline's is 1 by
    definition) outside the range its calibration was narrowed to; None where there are none."""
    predicted = [PricedExtent.of_row(r) for r in rows if r.get("method") not in (None, "baseline")
                 and any(r.get(c) is not None for c in PREDICTED_SPEEDUP_COLUMNS)]
    gaps = narrowed_gaps(predicted, sweep_hardware(rows)) if predicted else []
    return extrapolated_note(gaps, "rows") if gaps else None


def with_serving_predictions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Serving rows with the analytic model's prediction at the batch size their load induced.

    The model (:func:`predict_sweep`) prices each speculative serving cell as
    an offline cell whose batch size is its *measured* mean running batch,
    rounded (not estimated from the rate), with its own acceptance.
    ``serving_predicted_speedup`` is its decode speedup, held against the
    measured TPOT p50 speedup; ``serving_predicted_tpot_s`` that speedup
    applied to the baseline's measured TPOT p50. Without a hardware profile
    both stay null, as offline.
    """
    by_id = {r["cell_id"]: r for r in rows}
    for row in rows:
        if not is_serving_row(row) or row.get("method") == "baseline" or row.get("status") != "ok":
            continue
        batch = row.get("running_batch_mean")
        base = by_id.get(row.get("baseline_cell_id") or "")
        if batch is None or base is None:
            continue
        # Requests were not sent in fixed batches: the per-request tails of an offline batch do not apply.
        as_offline = dict(row, batch_size=max(1, round(batch)), output_tokens_per_request=None,
                          decode_passes_per_request=None)
        predicted = predict_sweep([as_offline])[0][0].get("predicted_decode_speedup")
        row["serving_predicted_speedup"] = predicted
        tpot = base.get("tpot_s_p50")
        row["serving_predicted_tpot_s"] = tpot / predicted if predicted and tpot else None
    return rows


# --------------------------------------------------------------------------- accuracy


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def accuracy(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """How well the predictions match, per speculative method.

    For each method: the number of priced rows and the median absolute
    relative error |predicted / measured - 1| of predicted_speedup against
    the wall-time speedup, of predicted_decode_speedup against the
    decode-only speedup (TPOT ratio), and of predicted_speedup_bs1_alpha
    against the wall-time speedup; the largest of the first two beside them
    (a median can hide the batch sizes where the model fails).
    """
    by_method: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("status") == "ok" and row.get("method") != "baseline":
            by_method.setdefault(row["method"], []).append(row)

    def errors(group: Sequence[Mapping[str, Any]], predicted: str, measured: str) -> list[float]:
        return [abs(r[predicted] / r[measured] - 1.0) for r in group
                if r.get(predicted) is not None and r.get(measured)]

    def error(group: Sequence[Mapping[str, Any]], predicted: str, measured: str) -> float | None:
        return _median(errors(group, predicted, measured))

    def worst(group: Sequence[Mapping[str, Any]], predicted: str, measured: str) -> float | None:
        return max(errors(group, predicted, measured), default=None)

    return [
        {
            "method": method,
            "rows": sum(r.get("predicted_speedup") is not None for r in group),
            "mdape_wall": error(group, "predicted_speedup", "speedup"),
            "mdape_decode": error(group, "predicted_decode_speedup", "decode_speedup"),
            "max_wall": worst(group, "predicted_speedup", "speedup"),
            "max_decode": worst(group, "predicted_decode_speedup", "decode_speedup"),
            "mdape_bs1_alpha_wall": error(group, "predicted_speedup_bs1_alpha", "speedup"),
        }
        for method, group in sorted(by_method.items())
    ]


BREAK_EVEN_SERIES = (("speedup", "measured"), ("decode_speedup", "measured_decode"),
                     ("predicted_speedup", "predicted"), ("predicted_decode_speedup", "predicted_decode"),
                     ("predicted_speedup_bs1_alpha", "predicted_bs1_alpha"))


def break_even(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Measured and predicted break-even batch size for each batch-size curve.

    The one break-even rule: the report's table and ``python -m
    specbench.analytic.prediction`` both print these. A curve is the rows of one
    :func:`specbench.results.curve_key` (method, K, alpha, workload, engine,
    ...); each series (speedup, decode speedup, the predictions) takes the
    median of its rows at each batch size, and ``speedup.break_even_batch_size``
    interpolates where it first falls below 1 (None: it never does within
    the grid; "n/a": a batch size has no value). ``series`` keeps the values
    per batch size, ``rows`` the curve's rows.
    """
    curves: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("status") == "ok" and row.get("method") != "baseline":
            curves.setdefault(curve_key(row), []).append(row)
    out = []
    for group in curves.values():
        group = sorted(group, key=lambda r: r["batch_size"])
        sizes = sorted({r["batch_size"] for r in group})
        first = group[0]
        entry: dict[str, Any] = {
            "method": first["method"], "label": method_label(first), "k": first.get("num_speculative_tokens"),
            "alpha": first.get("controlled_alpha"), "workload": first.get("workload"),
            "batch_sizes": sizes, "rows": group, "series": {},
        }
        for column, name in BREAK_EVEN_SERIES:
            values = [
                _median(r[column] for r in group
                        if r["batch_size"] == size and r.get(column) is not None and math.isfinite(r[column]))
                for size in sizes
            ]
            entry["series"][column] = values
            entry[name] = (
                speedup.break_even_batch_size(sizes, values) if all(v is not None for v in values) else "n/a"
            )
        out.append(entry)
    return sorted(out, key=lambda e: (e["method"], e["k"] or 0, e["alpha"] or 0.0, e["workload"] or ""))


def format_check(rows: Sequence[Mapping[str, Any]]) -> str:
    """The accuracy and break-even tables as text."""

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 100:.1f}%"

    def size(value: Any) -> str:
        return "none in grid" if value is None else value if isinstance(value, str) else f"{value:.1f}"

    profiles = sorted({r["hardware_profile"] for r in rows if r.get("hardware_profile")})
    lines = [f"hardware profile: {', '.join(profiles) or 'none'}",
             "|predicted / measured - 1| per method, median (max):",
             f"  {'method':<12} {'rows':>4} {'vs wall':>15} {'vs decode':>15} {'bs1-alpha vs wall':>17}"]
    for a in accuracy(rows):
        wall = f"{pct(a['mdape_wall'])} ({pct(a['max_wall'])})"
        decode = f"{pct(a['mdape_decode'])} ({pct(a['max_decode'])})"
        lines.append(f"  {a['method']:<12} {a['rows']:>4} {wall:>15} {decode:>15} {pct(a['mdape_bs1_alpha_wall']):>17}")
    lines.append("break-even batch size (speedup first below 1):")
    for c in break_even(rows):
        if len(c["batch_sizes"]) < 2:
            continue  # one batch size: nothing to interpolate
        lines.append(
            f"  {c['label']} {c['workload']} (batch {c['batch_sizes'][0]}-"
            f"{c['batch_sizes'][-1]}): measured {size(c['measured'])}, predicted "
            f"{size(c['predicted'])} (from bs1 alpha {size(c['predicted_bs1_alpha'])}); "
            f"decode only: measured {size(c['measured_decode'])}, "
            f"predicted {size(c['predicted_decode'])}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m specbench.analytic.prediction <sweep dir or results.parquet> [--reprice]``.

    Prints how well the analytic model predicts the sweep's speedups;
    ``--reprice`` first prices the rows again with the current hardware
    profile (e.g. after a new calibration) and rewrites the file, saying
    which rows it priced outside a narrowed calibration's range.
    """
    parser = argparse.ArgumentParser(prog="python -m specbench.analytic.prediction",
                                     description="Predicted against measured speedups of a sweep.")
    parser.add_argument("results", type=Path, help="a sweep directory or its results.parquet")
    parser.add_argument("--reprice", action="store_true",
                        help="price the rows again with the current hardware profile and rewrite the file")
    args = parser.parse_args(argv)
    from specbench.results.files import write_results
    from specbench.results.schema import ResultsError, read_rows

    path = results_path(args.results)
    try:
        rows = read_rows(path)
    except (ResultsError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.reprice:
        rows, hint = predict_sweep(rows)
        for line in (hint, extrapolated_rows(rows)):
            if line:
                print(line)
        write_results(rows, path)
    print(format_check(rows))
    return 0


__all__ = [
    "CALIBRATE_HINT",
    "CALIBRATED_FILE",
    "PREDICTED_SPEEDUP_COLUMNS",
    "DecodeAcceptance",
    "HardwareChoice",
    "Prediction",
    "PricedExtent",
    "accuracy",
    "with_predicted_speedups",
    "break_even",
    "calibrated_path",
    "choose_hardware",
    "context_length",
    "coverage_gaps",
    "decode_acceptance",
    "default_step_tokens",
    "effective_k",
    "extrapolated_rows",
    "format_check",
    "load_hardware_file",
    "model_profile",
    "narrowed_gaps",
    "predict_sweep",
    "with_serving_predictions",
]


if __name__ == "__main__":
    sys.exit(main())
