"""``python -m specbench.calibrate``: measure this machine and fit its hardware profile.

One engine (the plain-decoding engine a sweep's baseline would use, from the
same Hydra config and overrides) decodes batches of synthetic prompts over a
grid of batch sizes (tokens per step) and prompt lengths (KV-cache traffic).
Each grid point gives one :class:`specbench.analytic.profile_fit.StepSample`: the decode
step time is the median TPOT vLLM reports for the batch's requests
(first-to-last-token time over the tokens after the first, so prefill is
excluded), at the mean context length the steps attend to (prompt + half the
output). Each grid point also gives a prefill sample: its whole batch
prefills in one step, whose time is the median TTFT, with batch x prompt
tokens over batch sequences and logits at one position each. Decode steps
alone cannot tell compute from per-sequence cost (both grow with the batch)
nor KV reads from attention FLOPs (both grow with batch x context); the
prefill steps, many tokens per sequence, can. The grid is measured in
``--rounds`` passes (two by default) and each point keeps its fastest round: on a machine
shared with other work, interference only ever adds time.
:func:`specbench.analytic.profile_fit.fit_hardware_profile` then fits the profile's rates
(weight and KV bandwidth, linear and attention FLOP/s, overhead per step and
per sequence, the overlap of weight reads and compute) to those samples.
Before the engine starts, torch times the machine's copy bandwidth and
matmul rate in a child process (:func:`measure_device_rates`; ``--device-rates`` gives them
instead), which has exited, its CUDA context and memory with it, before any
engine asks vLLM for its share of the device: no fitted rate may pass them by more than 5%, since weight reads
and fixed cost are otherwise interchangeable in a decode grid (the fit once
reported 68 GB/s on cores that copy at 20). A rate at its bound, or a
residual beyond 10%, is printed as a warning and written as ``fit_warnings``.
``--refit PROFILE.yaml`` fits an earlier calibration's samples again.
``--heads`` names the heads to time (``make demo`` times only the ones its grid
runs); the others are recorded as left out. A later sweep of one would be priced
with another head's cost per pass: it times the head first, before its cells
(:func:`time_missing`), as ``--add-heads METHOD`` does on the head's own
engines, adding it to the profile; where that fails the sweep is refused.
``--batch-sizes``, ``--prompt-lengths`` and ``--draft-ks`` narrow the calibration
to one sweep's range (``make demo``'s: batch 1 and 4, prompts of 16 and 512
tokens, its heads at K=4: 4 grid points instead of 8 and one head engine instead
of two); the profile records what it measured (``settings.narrowed_to``), and a
later sweep outside that range has the rest of the default calibration timed
first (:func:`time_missing`), as ``--complete`` does, or is refused.

A draft pass (an EAGLE head's forward inside the engine step) skips the
scheduler and sampler that make up most of a step's fixed cost here, so it
gets its own: for each EAGLE head the model config names (EAGLE-3, then
EAGLE-1), an engine at each K of :data:`DRAFT_KS` decodes :data:`DRAFT_POINTS`
with it, and :func:`specbench.analytic.profile_fit.fit_draft_costs` takes what
the fitted step time and the head's own roofline work leave unexplained as a
line in K: a cost per draft pass (its slope) and one per speculative step (its
intercept, ``head_draft_step_overhead_ms``: the proposer's set-up, the first
pass over the accepted positions). Timed at one K, the two could not be told
apart: a cost per step spread over three passes was multiplied at K = 8 and
priced EAGLE-1's step there 20% high. Each head is priced with its own
(``head_draft_overhead_ms``): one head's overhead priced the other 12-29%
off, since the passes differ in more than the work the model counts. A
head's may be below 0, a correction to its roofline where its passes cost
less than their priced work (the EAGLE-1 head, which reads the target's
whole LM head each pass, on a CPU); floored at 0 it priced them too high. The
first head's is ``draft_overhead_ms``, which every other drafter pays, and
the output says which heads were timed. Without a head, draft passes are
charged the step's overhead (an upper bound) and the profile says so.

Prompt lookup has no draft pass, but each of its steps does host work that a
plain step does not (the lookup, the verification's metadata, the rejection
sampler), several ms a step on 2 CPU cores. An ngram engine decodes
:data:`DRAFT_POINTS` at K = :data:`DRAFT_K` too, and
:func:`specbench.analytic.profile_fit.fit_lookup_overhead` takes what its
decode passes cost beyond verifying what they drafted: ngram's
``head_draft_overhead_ms`` entry, paid once per step
(:class:`specbench.analytic.drafting.LookupDraft`), its passes written as
``lookup_samples``.

Each engine captures CUDA graphs for every batch it decodes
(``engine.cudagraph_batch_size``: the largest batch of its points, unless
the overrides set one), so that its steps replay graphs as a sweep's do.

Only grid points whose whole batch prefills in one engine step are measured
(batch size x prompt length <= ``--max-step-tokens``, which the calibration
engine gets as its ``engine.max_num_batched_tokens`` unless the overrides set
one): otherwise chunked prefill mixes prefill chunks into the decode steps of
requests that started early and inflates their TPOT. Every request in a batch
then decodes in lockstep.

The profile, the samples and their residuals are printed and written to
``$SPECBENCH_CACHE/hardware/calibrated.yaml`` (default
``~/.cache/specbench/hardware/``), where :mod:`specbench.analytic.prediction` finds it
for every later sweep that names no ``hardware``.

    python -m specbench.calibrate                      # 2-3 min on 2 CPU cores (an engine per head and K, one for ngram)
    python -m specbench.calibrate model=qwen2.5-7b-instruct --max-step-tokens 8192
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from specbench import gpu_timing, hub, models
from specbench.analytic import prediction, profile_fit, profiles
from specbench.config import Cell, ConfigError, cell_from_config, longest_prompt
from specbench.engine import EngineError, EngineWorker
from specbench.gpu_timing import positive_ints
from specbench.measure import CellPlan
from specbench.results.files import write_atomic
from specbench.results.provenance import now_iso
from specbench.workloads import load_prompts

# Every fourfold step in batch size: the 8 grid points they leave (of 14 with
# 1, 2, 4, ..., 64) cost 62 s a round here instead of 111. Refitted on those 8
# points, a full calibration's samples (2026-12-01, this 2-core machine) were
# all predicted within 5.4% rms (decode) and 4.5% (prefill), against 5.2% and
# 4.5% for the fit to all 28.
DEFAULT_BATCH_SIZES = (1, 4, 16, 64)
# Prefill is most of the calibration's time and none of its samples: the short
# length is 16 tokens (64 made batch 64 prefill 4096 tokens for a 76-token
# context), so the short-context row costs a quarter of what it did.
DEFAULT_PROMPT_LENGTHS = (16, 512, 1024)
DEFAULT_MAX_TOKENS = 24
# Each sample keeps its fastest round. One round (make demo's, --rounds 1) saves 26 s of a 2-core
# machine's grid and 2 s per head, at a price in the model's accuracy: refitted on either round of a
# quiet 2026-12-07 calibration alone, its sweep's 16 predicted speedups moved up to 1-7% (rms 0.5-3%)
# from the two-round fit's, and lay 8.3-9.4% rms from the measured ones against 8.4%
# (tests/benchmarks/calibration_cost.py).
DEFAULT_ROUNDS = 2
# vLLM's own default on CPU. A wider grid (16384: batch 32 at 512-token
# prompts) was tried: one bandwidth cannot serve both the weight-bound small
# batches and the KV-bound large ones, and the fit predicted speedups worse.
DEFAULT_MAX_STEP_TOKENS = prediction.DEFAULT_STEP_TOKENS


@dataclass(frozen=True)
class GridPoint:
    """One calibration measurement: batch_size prompts of prompt_len tokens each."""

    batch_size: int
    prompt_len: int


# The draft-pass sample: a context of the workloads' order, at batch 1. The overhead is one number; a
# batch-4 point cost 4.2 s per head and round on 2 cores and moved it most between rounds (timed once:
# 3.41 ms with it, 2.05 ms without, 1.72 ms over both points and rounds), and without it the fit
# predicts the sweep's speedups within 1.2% of the two-point fit's (tests/benchmarks/calibration_cost.py).
DRAFT_POINTS = (GridPoint(1, 512),)
# Each head is timed at both K (an engine each): the headline's smallest and largest, so that its steps are
# interpolated, not extrapolated; their spread sets how well a cost per step and one per pass separate (with
# equal noise per sample the intercept's variance is 1.9 sigma^2 at (2, 8), 2.5 at (2, 6)). Held in
# prediction.DRAFT_KS, where the plan and --reprice read which K a narrowed calibration's heads cover.
DRAFT_KS = prediction.DRAFT_KS
# The K the lookup (ngram) engine is timed at: its host work is one figure per step.
DRAFT_K = 3
# Every method the model config names a head for is timed, in this order; the first one's overhead is the
# profile's draft_overhead_ms, paid by drafters without a timed head of their own.
DRAFT_METHODS = ("eagle3", "eagle")
# The settings key listing the heads a calibration left out by choice (--heads): prediction.HEADS_LEFT_OUT.
HEADS_LEFT_OUT = prediction.HEADS_LEFT_OUT
# The settings key of a calibration narrowed to one sweep's range (make demo's: --batch-sizes, --prompt-lengths,
# --draft-ks below the defaults): what it measured (prediction.NARROWED_TO). A later sweep outside that range gets
# the rest of the default calibration timed first (time_missing, --complete); the plan and --reprice say which
# of their predictions lie outside it.
NARROWED_TO = prediction.NARROWED_TO
# Drafters without a draft pass whose per-step host work is timed on an engine of their own.
LOOKUP_METHODS = ("ngram",)


def grid(
    batch_sizes: Sequence[int], prompt_lengths: Sequence[int], max_step_tokens: int
) -> list[GridPoint]:
    """Every (batch size, prompt length) whose batch prefills in one step, by length then size."""
    points = [
        GridPoint(b, n)
        for n in sorted(set(prompt_lengths))
        for b in sorted(set(batch_sizes))
        if b * n <= max_step_tokens
    ]
    if len(points) < 3:
        raise ValueError(
            f"only {len(points)} grid point(s) fit --max-step-tokens={max_step_tokens}; "
            "the fit needs at least 3 (lower prompt lengths or batch sizes)"
        )
    return points


def synthetic_prompts(stream: Sequence[int], length: int, count: int) -> tuple[tuple[int, ...], ...]:
    """``count`` distinct prompts of exactly ``length`` tokens: consecutive windows of ``stream``.

    Windows wrap around the stream; they are distinct as long as
    count * length <= len(stream) (otherwise they repeat, which with prefix
    caching off changes nothing in the timing).
    """
    if length < 1 or len(stream) < length:
        raise ValueError(f"need a token stream of at least {length} tokens, got {len(stream)}")
    span = len(stream) - length + 1
    return tuple(tuple(stream[(i * length) % span : (i * length) % span + length]) for i in range(count))


def engine_overrides(overrides: Sequence[str], max_step_tokens: int) -> list[str]:
    """The Hydra overrides for the calibration engine: the user's, plus a step
    budget of max_step_tokens unless they set engine.max_num_batched_tokens."""
    out = list(overrides)
    if not any(o.lstrip("+").startswith("engine.max_num_batched_tokens=") for o in out):
        out.append(f"engine.max_num_batched_tokens={max_step_tokens}")
    return out


def with_graphs_for(cell: Cell, points: Sequence[GridPoint]) -> Cell:
    """``cell`` on an engine whose CUDA graphs cover every step of ``points``, unless the overrides
    set ``engine.cudagraph_batch_size``.

    A calibration cell's own ``batch_size`` is 1, and graphs sized from it
    cover batch 1 only (:func:`specbench.analytic.graphs.graph_batch`): the
    larger batches would decode eagerly on a GPU, unlike any sweep's.
    """
    if cell.config["engine"].get("cudagraph_batch_size") is not None:
        return cell
    return cell.with_graph_batch(max(p.batch_size for p in points))


def calibration_cell(overrides: Sequence[str], points: Sequence[GridPoint]) -> Cell:
    """The plain-decoding cell whose engine decodes ``points``, graphs captured for each of their batches."""
    return with_graphs_for(cell_from_config(_compose(overrides)), points)


def step_sample(
    point: GridPoint,
    max_tokens: int,
    rounds: Sequence[Sequence[float | None]],
    output_tokens: Sequence[int],
) -> tuple[profile_fit.StepSample, dict[str, Any]]:
    """The decode step sample of one grid point, and its record for the YAML.

    ``rounds`` holds, for each round over the grid, every request's time per
    output token; ``output_tokens`` each round's total output. A round's step
    time is the median TPOT of its requests (they decode in lockstep); the
    sample takes the fastest round, because interference from other work on
    the machine only ever adds time. The context is prompt_len +
    max_tokens / 2, the mean KV length over the decode steps. Raises
    ValueError when no request of any round reported a TPOT.
    """
    medians = [statistics.median(ts) for ts in ([t for t in r if t is not None and t > 0] for r in rounds) if ts]
    if not medians:
        raise ValueError(
            f"batch {point.batch_size} x {point.prompt_len} tokens: no request reported a TPOT "
            "(request metrics off, or every request stopped after one token)"
        )
    seconds = min(medians)
    context = point.prompt_len + max_tokens / 2
    sample = profile_fit.StepSample(
        num_tokens=point.batch_size, num_seqs=point.batch_size, context_len=context, seconds=seconds
    )
    record = {
        "kind": "decode",
        "batch_size": point.batch_size,
        "prompt_tokens": point.prompt_len,
        "context_len": context,
        "seconds": seconds,
        "round_seconds": medians,
        # Below batch_size * max_tokens: some request hit EOS, the batch shrank near the end.
        "output_tokens_per_round": min(output_tokens) if output_tokens else None,
        "complete": bool(output_tokens) and min(output_tokens) == point.batch_size * max_tokens,
    }
    return sample, record


def prefill_sample(
    point: GridPoint, rounds: Sequence[Sequence[float | None]]
) -> tuple[profile_fit.StepSample, dict[str, Any]]:
    """The prefill step sample of one grid point, and its record for the YAML.

    ``rounds`` holds, per round, every request's TTFT. The batch prefills in
    one step (the grid admits only such points), so each TTFT is that step's
    time; a round's is their median, and the fastest round is kept. The step
    processes batch x prompt tokens, each attending to half its prompt on
    average, and reads logits at each prompt's last position. Raises
    ValueError when no request reported a TTFT.
    """
    medians = [statistics.median(ts) for ts in ([t for t in r if t is not None and t > 0] for r in rounds) if ts]
    if not medians:
        raise ValueError(f"batch {point.batch_size} x {point.prompt_len} tokens: no request reported a TTFT")
    seconds = min(medians)
    sample = profile_fit.StepSample(
        num_tokens=point.batch_size * point.prompt_len, num_seqs=point.batch_size,
        context_len=point.prompt_len / 2, seconds=seconds, logits=point.batch_size,
    )
    record = {"kind": "prefill", "batch_size": point.batch_size, "prompt_tokens": point.prompt_len,
              "context_len": point.prompt_len / 2, "seconds": seconds, "round_seconds": medians}
    return sample, record


def draft_sample(
    point: GridPoint, k: int, max_tokens: int, rounds: Sequence[tuple[float, int]]
) -> tuple[profile_fit.DraftSample, dict[str, Any]]:
    """The speculative pass sample of one draft point, and its record for the YAML.

    ``rounds`` holds, per round, the decode seconds summed over requests and
    the drafts vLLM verified in them: one per request and pass, so their
    ratio is the time of one pass (verification and k draft passes). The
    fastest round is kept, as for the plain samples. Raises ValueError when no
    round drafted.
    """
    per_pass = [seconds / drafts for seconds, drafts in rounds if drafts > 0 and seconds > 0]
    if not per_pass:
        raise ValueError(f"draft batch {point.batch_size} x {point.prompt_len} tokens: nothing was drafted")
    seconds = min(per_pass)
    context = point.prompt_len + max_tokens / 2
    sample = profile_fit.DraftSample(batch_size=point.batch_size, k=k, context_len=context, seconds=seconds)
    record = {"batch_size": point.batch_size, "prompt_tokens": point.prompt_len, "k": k,
              "context_len": context, "seconds_per_pass": seconds, "round_seconds_per_pass": per_pass}
    return sample, record


def lookup_sample(
    point: GridPoint, k: int, max_tokens: int, rounds: Sequence[tuple[float, int, int]]
) -> tuple[profile_fit.LookupSample, dict[str, Any]]:
    """The prompt-lookup sample of one draft point, and its record for the YAML.

    ``rounds`` holds, per round, the decode seconds summed over requests, their
    decode passes and the draft tokens vLLM verified in them: a lookup drafts
    only where it matches, so the passes, not the drafts, count the steps. The
    fastest round per pass is kept, with the draft tokens per pass it verified.
    Raises ValueError when no round decoded.
    """
    timed = [(seconds / passes, tokens / passes) for seconds, passes, tokens in rounds if passes > 0 and seconds > 0]
    if not timed:
        raise ValueError(f"lookup batch {point.batch_size} x {point.prompt_len} tokens: no decode pass was timed")
    seconds, drafted = min(timed)
    context = point.prompt_len + max_tokens / 2
    sample = profile_fit.LookupSample(batch_size=point.batch_size, k=k, context_len=context, seconds=seconds,
                                      drafted=min(drafted, float(k)))
    record = {"batch_size": point.batch_size, "prompt_tokens": point.prompt_len, "k": k, "context_len": context,
              "seconds_per_pass": seconds, "drafted_per_pass": sample.drafted,
              "round_seconds_per_pass": [t for t, _ in timed]}
    return sample, record


def fit_lookup(
    records: Sequence[dict[str, Any]], model: profiles.ModelProfile, profile: profiles.HardwareProfile
) -> tuple[float, list[dict[str, Any]]]:
    """Prompt lookup's host work per step from its timed passes (records as :func:`lookup_sample` writes
    them); the records gain their residuals."""
    samples = [profile_fit.LookupSample(r["batch_size"], r["k"], r["context_len"], r["seconds_per_pass"],
                                        r["drafted_per_pass"]) for r in records]
    overhead, residuals = profile_fit.fit_lookup_overhead(samples, target=model, hw=profile)
    return overhead, [dict(r, residual=res) for r, res in zip(records, residuals)]


def with_lookup_overheads(profile: profiles.HardwareProfile, overheads: Mapping[str, float]) -> profiles.HardwareProfile:
    """``profile`` with each lookup method's host work per step among its :attr:`HardwareProfile.head_overheads`,
    after the heads' (whose first is the draft overhead other drafters pay)."""
    kept = tuple((m, s) for m, s in profile.head_overheads if m not in overheads)
    return replace(profile, head_overheads=kept + tuple(overheads.items())) if overheads else profile


def format_lookup_fit(method: str, overhead_s: float, records: Sequence[dict[str, Any]]) -> str:
    """The lookup fit and its per-sample residuals as a text table."""
    lines = [f"host work per {method} step (beyond verifying its drafts): {overhead_s * 1e3:.2f} ms",
             f"{'batch':>5} {'prompt':>6} {'K':>3} {'drafted/pass':>12} {'measured ms/pass':>17} {'residual':>9}"]
    lines += [f"{r['batch_size']:>5} {r['prompt_tokens']:>6} {r['k']:>3} {r['drafted_per_pass']:>12.2f} "
              f"{r['seconds_per_pass'] * 1e3:>17.2f} {r['residual'] * 100:>+8.1f}%" for r in records]
    return "\n".join(lines)


def fit(
    samples: Sequence[profile_fit.StepSample],
    records: Sequence[dict[str, Any]],
    model: profiles.ModelProfile,
    name: str,
    bounds: profile_fit.DeviceBounds | None = None,
    shared_attention: bool = False,
) -> tuple[profiles.HardwareProfile, list[dict[str, Any]]]:
    """Fit the profile (rates capped by ``bounds``, attention at the matmul rate if ``shared_attention``);
    each record gains predicted_seconds and residual (predicted / measured - 1)."""
    profile, residuals = profile_fit.fit_hardware_profile(
        samples, model, name=name, bounds=bounds, shared_attention=shared_attention)
    out = []
    for sample, record, residual in zip(samples, records, residuals):
        out.append(dict(record, predicted_seconds=sample.seconds * (1.0 + residual), residual=residual))
    return profile, out


def profile_document(
    profile: profiles.HardwareProfile,
    records: Sequence[dict[str, Any]],
    *,
    model: dict[str, Any],
    device: str,
    measured_at: str,
    vllm_version: str | None,
    settings: dict[str, Any],
    draft_records: Sequence[dict[str, Any]] = (),
    draft_method: str | None = None,
    head_records: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    bounds: profile_fit.DeviceBounds | None = None,
    warnings: Sequence[str] = (),
    device_memory_bytes: int | None = None,
    lookup_records: Mapping[str, Sequence[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The YAML document: conf/hardware keys, then the evidence behind them
    (the device rates that bounded the fit, and what makes it suspect).

    ``head_records``: every timed head's draft records by method (``draft_records``
    are the first's); ``lookup_records``: each timed lookup method's passes. ``device_memory_bytes``: the GPU's memory (:attr:`specbench.gpu_timing.DeviceProbe.memory_bytes`);
    given, the profile states ``memory_bytes`` (and ``memory_gb``, its GB) and
    vLLM's default ``max_num_batched_tokens`` for the device, so the memory
    model prices a GPU engine (``specbench.analytic.memory.budget``). Without
    it, on a CPU, ``memory_gb`` is the host's memory."""
    residuals = [r["residual"] for r in records]
    doc: dict[str, Any] = {
        "name": profile.name,
        "source": "calibrated",
        "memory_bandwidth_gbps": round(profile.memory_bandwidth / 1e9, 4),
        "peak_tflops": round(profile.peak_flops / 1e12, 6),
        "fixed_overhead_ms": round(profile.fixed_overhead_s * 1e3, 4),
        "per_sequence_overhead_ms": round(profile.per_seq_overhead_s * 1e3, 4),
        "kv_bandwidth_gbps": _rounded_rate(profile.kv_read_bandwidth / 1e9),
        "attention_tflops": _rounded_rate(profile.attention_peak_flops / 1e12),
        "overlap_exponent": profile.overlap_exponent,
    }
    if profile.per_layer_overhead_s:
        doc["per_layer_overhead_ms"] = round(profile.per_layer_overhead_s * 1e3, 5)
    if profile.draft_overhead_s is not None:
        doc["draft_overhead_ms"] = round(profile.draft_overhead_s * 1e3, 4)
    if device_memory_bytes is not None:
        doc["memory_bytes"] = int(device_memory_bytes)
        doc["memory_gb"] = round(device_memory_bytes / 1e9, 1)
        doc["max_num_batched_tokens"] = prediction.default_step_tokens(device)
    elif device.startswith("CPU") and (memory := _host_memory_gb()) is not None:
        doc["memory_gb"] = memory
    doc |= {
        "notes": (
            f"Fitted by python -m specbench.calibrate to {len(records)} plain-decode and prefill step times "
            f"(median TPOT and TTFT, fastest of {settings.get('rounds')} rounds) of {model['name']} ({model['dtype']}) on vLLM {vllm_version}; effective "
            "figures for this engine and model, not datasheet values."
        ),
        "device": device,
        "device_rates": None if bounds is None else {
            "copy_bandwidth_gbps": round(bounds.copy_bandwidth / 1e9, 3),
            "matmul_tflops": round(bounds.matmul_flops / 1e12, 5), "source": bounds.source},
        "fit_warnings": list(warnings),
        "model": model,
        "measured_at": measured_at,
        "vllm_version": vllm_version,
        "settings": settings,
        "rms_residual": (sum(r * r for r in residuals) / len(residuals)) ** 0.5,
        "residuals": residuals,
        "samples": list(records),
    }
    if profile.head_overheads:
        doc["head_draft_overhead_ms"] = {m: round(s * 1e3, 4) for m, s in profile.head_overheads}
    if profile.head_step_overheads:
        doc["head_draft_step_overhead_ms"] = {m: round(s * 1e3, 4) for m, s in profile.head_step_overheads}
    if head_records:
        doc["head_draft_samples"] = {m: list(r) for m, r in head_records.items()}
        doc["notes"] += (f" Each head's draft pass priced from its own timed passes (measured, head_draft_samples): "
                         f"{', '.join(head_records)}.")
    if lookup_records:
        doc["lookup_samples"] = {m: list(r) for m, r in lookup_records.items()}
        doc["notes"] += (f" Host work per step of {', '.join(lookup_records)} priced from its own timed passes "
                         "(measured, lookup_samples).")
    if draft_records:
        doc["draft_samples"] = {"method": draft_method, "samples": list(draft_records)}
    else:
        doc["draft_samples"] = {"method": None, "note": "no EAGLE head to time: draft passes pay fixed_overhead_ms"}
    return doc


def _rounded_rate(value: float) -> float:
    """A rate for the YAML: 6 significant figures, or inf (a cost the fit found too small to see)."""
    return value if math.isinf(value) else float(f"{value:.6g}")


def write_profile(doc: dict[str, Any], path: Path) -> None:
    """Write the YAML atomically (:func:`specbench.results.write_atomic`)."""
    text = yaml.safe_dump(doc, sort_keys=False)
    write_atomic(path, lambda f: f.write(text.encode()))


def format_draft_fit(
    method: str, overhead_s: float, records: Sequence[dict[str, Any]], per_step_s: float | None = None,
) -> str:
    """The draft-pass fit (per pass, and per speculative step where it was fitted at two K or more) and its
    per-sample residuals as a text table."""
    below = ("" if overhead_s >= 0 else
             " (below 0: its passes cost less than the roofline prices its work; each pass is priced that much less)")
    ks = sorted({r["k"] for r in records})
    per_step = ("" if per_step_s is None or len(ks) < 2 else
                f" + {per_step_s * 1e3:.2f} ms per speculative step, whatever K (fitted at K={', '.join(map(str, ks))})")
    lines = [f"draft pass overhead ({method} head): {overhead_s * 1e3:.2f} ms per draft pass{per_step}{below}",
             f"{'batch':>5} {'prompt':>6} {'K':>3} {'measured ms/pass':>17} {'residual':>9}"]
    lines += [f"{r['batch_size']:>5} {r['prompt_tokens']:>6} {r['k']:>3} {r['seconds_per_pass'] * 1e3:>17.2f} "
              f"{r['residual'] * 100:>+8.1f}%" for r in records]
    return "\n".join(lines)


def format_fit(profile: profiles.HardwareProfile, records: Sequence[dict[str, Any]]) -> str:
    """The fit and its per-sample residuals as a text table."""
    lines = [
        f"hardware profile {profile.name!r} (calibrated): "
        f"weights {profile.memory_bandwidth / 1e9:.2f} GB/s, "
        f"matmul peak {profile.peak_flops / 1e12:.4f} TFLOP/s, "
        f"KV reads {profile.kv_read_bandwidth / 1e9:.2f} GB/s, "
        f"attention {profile.attention_peak_flops / 1e12:.4f} TFLOP/s, "
        f"overhead {profile.fixed_overhead_s * 1e3:.2f} ms per step + "
        f"{profile.per_seq_overhead_s * 1e3:.3f} ms per sequence, "
        f"overlap exponent {profile.overlap_exponent:g}",
        f"{'step':>7} {'batch':>5} {'prompt':>6} {'context':>8} {'measured ms':>12} {'model ms':>9} {'residual':>9}",
    ]
    for r in records:
        mark = "" if r.get("complete", True) else "  (some requests stopped early)"
        lines.append(
            f"{r.get('kind', 'decode'):>7} {r['batch_size']:>5} {r['prompt_tokens']:>6} {r['context_len']:>8.0f} "
            f"{r['seconds'] * 1e3:>12.2f} {r['predicted_seconds'] * 1e3:>9.2f} "
            f"{r['residual'] * 100:>+8.1f}%{mark}"
        )
    for kind in sorted({r.get("kind", "decode") for r in records}):
        residuals = [r["residual"] for r in records if r.get("kind", "decode") == kind]
        rms = (sum(x * x for x in residuals) / len(residuals)) ** 0.5
        lines.append(f"rms residual {rms * 100:.1f}% over {len(residuals)} {kind} steps")
    return "\n".join(lines)


def _load() -> str:
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg()) + f" on {os.cpu_count()} cores"
    except OSError:
        return "unknown"


def _host_memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "this-machine"


def _token_stream(cell: Cell) -> list[int]:
    """Natural text to cut prompts from: the built-in summarize articles, tokenized plainly by the tokenizer
    of ``cell``'s model (at its pinned revision)."""
    from transformers import AutoTokenizer  # heavy: imported once the profile and checkpoints are good

    model_cfg = cell.identity["model"]
    tokenizer = AutoTokenizer.from_pretrained(models.resolve(model_cfg["path"],
                                                             revision=cell.revisions().get(model_cfg["path"])))
    prompts, _ = load_prompts({
        "name": "summarize", "source": "builtin", "path": None, "num_prompts": 1, "seed": 0,
        "max_tokens": 1, "max_prompt_tokens": 1, "chat_template": False,
    })
    text = "\n\n".join(p.text for p in prompts)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _compose(overrides: Sequence[str], method: Sequence[str] = ("method=baseline",)) -> Any:
    """The config of a cell of ``method`` (default: the baseline); an override Hydra refuses becomes a ConfigError."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException

    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        try:
            return compose(config_name="config", overrides=[*method, *overrides])
        except HydraException as exc:  # its message names the override and what is allowed
            raise ConfigError(str(exc)) from exc


def argument_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m specbench.calibrate``."""
    parser = argparse.ArgumentParser(
        prog="python -m specbench.calibrate",
        description="Fit this machine's hardware profile for the analytic model from real plain-decode steps.",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the engine/model, e.g. model=...")
    parser.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)))
    parser.add_argument("--prompt-lengths", default=",".join(map(str, DEFAULT_PROMPT_LENGTHS)))
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                        help="output tokens per request (decode steps per sample)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help="passes over the grid; each sample keeps its fastest round")
    parser.add_argument("--max-step-tokens", type=int, default=DEFAULT_MAX_STEP_TOKENS,
                        help="largest batch x prompt tokens measured; the engine's max_num_batched_tokens")
    parser.add_argument("--name", default=None, help="profile name (default: from the device)")
    parser.add_argument("--verbose", action="store_true",
                        help="stream vLLM's log here instead of to the log file beside the profile")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write the profile (default: {prediction.calibrated_path()})")
    parser.add_argument("--device-rates", default=None, metavar="GBPS,TFLOPS",
                        help="the ceilings of the fitted rates: copy bandwidth (GB/s) and matmul rate (TFLOP/s), "
                             "e.g. from a datasheet (default: timed here with torch before the engine starts)")
    parser.add_argument("--heads", default=",".join(DRAFT_METHODS),
                        help="the EAGLE heads whose draft passes are timed (two engines each), or none; a sweep "
                             "of a head left out times it first, as --add-heads does")
    parser.add_argument("--draft-ks", default=",".join(map(str, DRAFT_KS)), metavar="KS",
                        help="the K each head is timed at (an engine each); at one K its cost per pass and per step "
                             "are told apart at that K alone, and the profile is narrowed to it (see --complete)")
    parser.add_argument("--complete", action="store_true",
                        help="time what a calibration narrowed to one sweep's range (--batch-sizes, --prompt-lengths, "
                             "--draft-ks) left out of the default one, refit, and write it into the profile at --out")
    parser.add_argument("--add-heads", default=None, metavar="METHODS",
                        help="time these EAGLE heads (two engines each) and add them to the profile at --out, "
                             "which a calibration with --heads left them out of; nothing else is measured")
    parser.add_argument("--refit", type=Path, default=None, metavar="PROFILE.yaml",
                        help="refit the samples an earlier calibration wrote, without starting an engine")
    return parser


@dataclass(frozen=True)
class Engines:
    """What a calibration runs: its engine overrides and grid, the plain-decoding cell whose engine
    decodes the grid, then each head's cell by method (:func:`_draft_cells`), and why the other
    methods have none ("" when every one has)."""

    overrides: list[str]
    points: list[GridPoint]
    target: Cell
    heads: dict[str, list[Cell]]  # one per K of DRAFT_KS
    skipped: str
    lookups: dict[str, Cell] = field(default_factory=dict)  # by method: :data:`LOOKUP_METHODS` timed

    @property
    def cells(self) -> list[Cell]:
        """Every cell an engine is started for, in the order they start."""
        return [self.target, *(c for cells in self.heads.values() for c in cells), *self.lookups.values()]


def planned_engines(args: argparse.Namespace) -> Engines:
    """The engines the parsed command line (:func:`argument_parser`) starts; ValueError (a
    :class:`~specbench.config.ConfigError` among them) for a bad grid or override."""
    overrides = engine_overrides(args.overrides, args.max_step_tokens)
    points = grid(positive_ints(args.batch_sizes, "--batch-sizes"),
                  positive_ints(args.prompt_lengths, "--prompt-lengths"), args.max_step_tokens)
    target = calibration_cell(overrides, points)
    heads, skipped = _draft_cells(overrides, head_methods(args.heads), draft_ks(args))
    return Engines(overrides, points, target, heads, skipped, _lookup_cells(overrides))


def draft_ks(args: argparse.Namespace) -> list[int]:
    """``--draft-ks``: the distinct K the heads are timed at, ascending; ValueError naming the flag."""
    return sorted(set(positive_ints(args.draft_ks, "--draft-ks")))


def narrowed_to(args: argparse.Namespace, points: Sequence[GridPoint]) -> dict[str, list[int]] | None:
    """What a calibration measured where it measured less than the default one (the settings'
    :data:`NARROWED_TO`): its grid's batch sizes and prompt lengths, and the K its heads were timed at;
    None for a calibration that covers the default grid and :data:`DRAFT_KS`."""
    full = grid(DEFAULT_BATCH_SIZES, DEFAULT_PROMPT_LENGTHS, args.max_step_tokens)
    measured = {(p.batch_size, p.prompt_len) for p in points}
    heads_at = draft_ks(args) if head_methods(args.heads) else list(DRAFT_KS)
    if measured >= {(p.batch_size, p.prompt_len) for p in full} and set(heads_at) >= set(DRAFT_KS):
        return None
    return {"batch_sizes": sorted({p.batch_size for p in points}), "prompt_lengths": sorted({p.prompt_len for p in points}),
            "draft_ks": heads_at}


def head_methods(text: str, flag: str = "--heads") -> list[str]:
    """``--heads`` (or ``flag``): a comma-separated list of :data:`DRAFT_METHODS`, or ``none`` (no head:
    a grid without one, as the demo's may be); ValueError naming the flag otherwise."""
    if text.strip() == "none" and flag == "--heads":
        return []
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in DRAFT_METHODS]
    if unknown or not methods:
        raise ValueError(f"{flag} expects a comma-separated list of {', '.join(DRAFT_METHODS)}"
                         f"{' (or none)' if flag == '--heads' else ''}; got {text!r}")
    return methods


def time_head(
    method: str, cells_at_k: Sequence[Cell], stream: Sequence[int], max_tokens: int, rounds: int,
    log_path: Path | None, model: profiles.ModelProfile, dtype: str, profile: profiles.HardwareProfile,
) -> tuple[float, float, list[dict[str, Any]]]:
    """One head's draft passes timed on an engine per K (``cells_at_k``, :func:`_draft_cells`) and fitted
    against the target's ``profile`` (:func:`fit_head`); the fit is printed. Raises EngineError or ValueError."""
    timed_records = []
    for draft_cell in cells_at_k:
        k = draft_cell.identity["method"]["speculative_config"]["num_speculative_tokens"]
        measured = _measure_draft_passes(draft_cell, k, stream, max_tokens, rounds, log_path)
        timed_records += [draft_sample(p, k, max_tokens, measured[p])[1] for p in DRAFT_POINTS]
    overhead, per_step, records = fit_head(method, cells_at_k[0].identity["method"], timed_records, model, dtype,
                                           profile)
    print(format_draft_fit(method, overhead, records, per_step))
    return overhead, per_step, records


def time_missing(cells: Iterable[Cell], config_hardware: Mapping[str, Any] | None, verbose: bool) -> None:
    """Before a sweep's cells, where the calibrated profile prices them (no ``hardware`` in the config):
    what a calibration narrowed to another sweep's range left out and these cells need
    (:func:`specbench.analytic.prediction.narrowed_gaps` of their :func:`priced_extent`) timed first, the rest
    of the default calibration (:func:`complete`); then the heads of their methods that it left out by choice
    (:func:`specbench.analytic.prediction.heads_left_out`) timed and added (:func:`add_heads`): the sweep's
    report then prices every cell from steps measured over its range and with its head's own cost, never
    silently extrapolated or with another head's. Raises ConfigError, naming the command, where that timing
    fails."""
    cells = list(cells)
    path = prediction.calibrated_path()
    if gaps := prediction.narrowed_gaps(map(priced_extent, cells), config_hardware):
        print(f"{prediction.narrower_than(gaps)}: timing the rest of the default calibration before the cells, as "
              "`python -m specbench.calibrate --complete` does", flush=True)
        if complete(path, verbose) != 0:
            raise ConfigError("the rest of the calibration could not be timed (above); the sweep would be priced "
                              "outside what it measured: `python -m specbench.calibrate --complete` times it")
    if not (missing := prediction.heads_left_out([c.method for c in cells], config_hardware)):
        return
    heads = ",".join(missing)
    print(f"the calibrated profile {path} has no timing of the {heads} head (calibrated with --heads): "
          f"timing it before the cells, as `python -m specbench.calibrate --add-heads {heads}` does", flush=True)
    if add_heads(path, missing, verbose) != 0:
        raise ConfigError(f"the {heads} head could not be timed (above); the sweep would price its draft passes "
                          f"with another head's: `python -m specbench.calibrate --add-heads {heads}` adds it")


def priced_extent(cell: Cell) -> prediction.PricedExtent:
    """What of ``cell`` a calibration must have measured to price it
    (:func:`specbench.analytic.prediction.coverage_gaps`): its batch, its longest prompt
    (:func:`specbench.config.longest_prompt`), the K it drafts at its batch size."""
    return prediction.PricedExtent.of_config(cell.config, longest_prompt(cell.config))


def complete(path: Path, verbose: bool) -> int:
    """``--complete``: what the narrowed calibration at ``path`` (its settings' :data:`NARROWED_TO`) left out of
    the default one, timed as it would have timed it (its overrides, rounds and output length): the default
    grid's other points on the target's engine, then every head it timed at fewer K than :data:`DRAFT_KS`
    again at those (:func:`add_heads`). The target, the heads and the lookups are refitted to all samples
    (as ``--refit`` does) and the profile is no longer narrowed. Returns the exit status."""
    try:
        doc = yaml.safe_load(path.read_text())
        settings = doc.get("settings") or {}
        if not settings.get(NARROWED_TO):
            print(f"profile: {path} (not narrowed: nothing to complete)")
            return 0
        overrides, max_tokens, rounds = list(settings["overrides"]), int(settings["max_tokens"]), int(settings["rounds"])
        points = grid(DEFAULT_BATCH_SIZES, DEFAULT_PROMPT_LENGTHS, int(settings["max_step_tokens"]))
        have = {(r["batch_size"], r["prompt_tokens"]) for r in doc["samples"] if r.get("kind", "decode") == "decode"}
        missing = [p for p in points if (p.batch_size, p.prompt_len) not in have]
        heads = [m for m, records in (doc.get("head_draft_samples") or {}).items()
                 if not {r["k"] for r in records} >= set(DRAFT_KS)]
        cell = calibration_cell(overrides, points)
        if missing:
            fetch_checkpoints([cell])
    except (OSError, KeyError, TypeError, ValueError, hub.HubError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    if missing:
        stream = _token_stream(cell)
        print(f"timing {len(missing)} grid points the calibration left out, {rounds} round(s)")
        try:
            worker = EngineWorker(cell.engine_spec(), log_path=None if verbose else path.with_suffix(".log"))
            try:
                measured = _measure_grid(worker, missing, stream, max_tokens, rounds, _step_line)
            finally:
                worker.close()
            added = [record for _, record in _grid_samples(missing, measured, max_tokens)]
        except (EngineError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        # Decode samples, then prefill ones, each by prompt length then batch size, as a full calibration lists them.
        doc["samples"] = sorted([*doc["samples"], *added], key=lambda r: (
            r.get("kind", "decode") == "prefill", r["prompt_tokens"], r["batch_size"]))
        write_profile(doc, path)
        if (status := _refit(path, path, None)) != 0:
            return status
    if heads and (status := add_heads(path, heads, verbose)) != 0:
        return status
    doc = yaml.safe_load(path.read_text())
    doc["settings"] = {k: v for k, v in (doc.get("settings") or {}).items() if k not in (NARROWED_TO, "refit_from")}
    doc["notes"] = f"{doc.get('notes', '')} Completed to the default grid and K afterwards ({now_iso()}, --complete)."
    write_profile(doc, path)
    print(f"profile: {path} (completed: {len(missing)} grid points, heads {', '.join(heads) or 'none'} at "
          f"K={','.join(map(str, DRAFT_KS))})")
    return 0


def add_heads(path: Path, methods: Sequence[str], verbose: bool) -> int:
    """``--add-heads``: time ``methods``' heads as the calibration at ``path`` would have (its overrides,
    rounds and output length), fit each against its target profile, and write them into it; the target's
    samples, the lookups and the heads it has are kept. Returns the exit status."""
    try:
        doc = yaml.safe_load(path.read_text())
        settings = doc.get("settings") or {}
        overrides, max_tokens, rounds = list(settings["overrides"]), int(settings["max_tokens"]), int(settings["rounds"])
        # The target's fit alone: fit_head prices a head's passes beside its steps, not another head's.
        target = replace(profiles.HardwareProfile.from_mapping(doc), draft_overhead_s=None, head_overheads=(),
                         head_step_overheads=())
        cells, skipped = _draft_cells(overrides, methods)
        if missing := [m for m in methods if m not in cells]:
            raise ValueError(f"cannot time {', '.join(missing)}: {skipped}")
        fetch_checkpoints([c for at_k in cells.values() for c in at_k])
    except (OSError, KeyError, TypeError, ValueError, hub.HubError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    first = next(iter(cells.values()))[0]
    model_cfg, dtype = first.identity["model"], first.identity["engine"]["dtype"]
    model = prediction.model_profile(model_cfg["path"], dtype, model_cfg["name"])
    stream = _token_stream(first)
    for method, cells_at_k in cells.items():
        try:
            overhead, per_step, records = time_head(method, cells_at_k, stream, max_tokens, rounds,
                                                    None if verbose else path.with_suffix(".log"), model, dtype, target)
        except (EngineError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        doc["head_draft_samples"] = dict(doc.get("head_draft_samples") or {}, **{method: records})
        doc["head_draft_overhead_ms"] = dict(doc.get("head_draft_overhead_ms") or {}, **{method: round(overhead * 1e3, 4)})
        step_ms = {k: v for k, v in (doc.get("head_draft_step_overhead_ms") or {}).items() if k != method}
        doc["head_draft_step_overhead_ms"] = step_ms | ({method: round(per_step * 1e3, 4)} if per_step else {})
        if doc.get("draft_overhead_ms") is None or (doc.get("draft_samples") or {}).get("method") == method:
            # The first head timed (or the first one timed again, at more K): what drafters without one pay.
            doc["draft_overhead_ms"] = round(max(overhead, 0.0) * 1e3, 4)
            doc["draft_samples"] = {"method": method, "samples": records}
        settings[HEADS_LEFT_OUT] = [m for m in settings.get(HEADS_LEFT_OUT) or [] if m != method]
        doc["notes"] = f"{doc.get('notes', '')} The {method} head timed afterwards ({now_iso()}, --add-heads)."
    doc["settings"] = settings
    write_profile(doc, path)
    print(f"profile: {path} (heads added: {', '.join(cells)})")
    return 0


def fetch_checkpoints(cells: Sequence[Cell]) -> dict[str, Path]:
    """Every hub checkpoint the cells' engines load, in the cache before any engine starts
    (:func:`specbench.hub.fetch_all`): with the tokenizer files vLLM loads for the target and any
    heterogeneous-vocabulary draft, at the model config's pinned revisions, as a sweep fetches them.
    Raises :class:`specbench.hub.HubError`."""
    return hub.fetch_all([pair for cell in cells for pair in cell.checkpoints()],
                         {reference for cell in cells for reference in cell.tokenizer_checkpoints()},
                         {reference: pin for cell in cells for reference, pin in cell.revisions().items()})


def main(argv: list[str] | None = None) -> int:
    """Measure, fit, print and store; returns the exit status."""
    args = argument_parser().parse_args(argv)
    try:
        given_rates = None if args.device_rates is None else _device_rates(args.device_rates)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.refit is not None:
        return _refit(args.refit, args.out or args.refit, given_rates)
    if args.add_heads is not None:
        try:
            methods = head_methods(args.add_heads, "--add-heads")
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return add_heads(args.out or prediction.calibrated_path(), methods, args.verbose)
    if args.complete:
        return complete(args.out or prediction.calibrated_path(), args.verbose)

    try:
        planned = planned_engines(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    overrides, points, cell, draft_cells = planned.overrides, planned.points, planned.target, planned.heads
    try:
        # The heads whose draft passes are timed after the target's steps load theirs with the target's.
        fetch_checkpoints(planned.cells)
    except hub.HubError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model_cfg = cell.identity["model"]
    dtype = cell.identity["engine"]["dtype"]
    model = prediction.model_profile(model_cfg["path"], dtype, model_cfg["name"])
    stream = _token_stream(cell)
    longest = max(p.prompt_len for p in points) + args.max_tokens
    if longest > cell.identity["engine"]["max_model_len"]:
        print(f"error: prompt + output of {longest} tokens exceeds engine.max_model_len", file=sys.stderr)
        return 2

    out = args.out or prediction.calibrated_path()
    engine_log = out.with_suffix(".log")
    # In a child that has exited before the engine starts: this process never opens the device.
    probe = gpu_timing.probe_device(dtype, tries=0 if given_rates else DEVICE_RATE_TRIES)
    bounds = given_rates or device_bounds(probe, dtype)
    print(f"device rates ({bounds.source}): copy {bounds.copy_bandwidth / 1e9:.1f} GB/s, "
          f"matmul {bounds.matmul_flops / 1e12:.4f} TFLOP/s: no fitted rate may exceed them by more than "
          f"{bounds.slack:.0%}")
    if not args.verbose:
        print(f"engine log: {engine_log}")
    print(f"calibrating with {len(points)} samples of {model_cfg['name']} ({dtype}), "
          f"{args.max_tokens} tokens each, {args.rounds} rounds; load average {_load()}")
    measured_at = now_iso()
    try:
        worker = EngineWorker(cell.engine_spec(), log_path=None if args.verbose else engine_log)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            measured = _measure_grid(worker, points, stream, args.max_tokens, args.rounds, _step_line)
        finally:
            worker.close()  # raises where the engine's processes or memory do not go: the draft engine needs them
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"load average after: {_load()}")
    try:
        pairs = _grid_samples(points, measured, args.max_tokens)
        profile, records = fit([s for s, _ in pairs], [r for _, r in pairs], model,
                               args.name or _slug(worker.info.machine), bounds,
                               shared_attention=probe.device == "cuda")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_fit(profile, records))
    head_records: dict[str, list[dict[str, Any]]] = {}
    overheads: dict[str, float] = {}
    step_overheads: dict[str, float] = {}
    for method, cells_at_k in draft_cells.items():
        try:
            overheads[method], step_overheads[method], head_records[method] = time_head(
                method, cells_at_k, stream, args.max_tokens, args.rounds, None if args.verbose else engine_log,
                model, dtype, profile)
        except (EngineError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    profile = with_head_overheads(profile, overheads, step_overheads)
    print(format_heads_timed(overheads, planned.skipped, step_overheads))
    lookup_overheads: dict[str, float] = {}
    lookup_records: dict[str, list[dict[str, Any]]] = {}
    for method, lookup_cell in planned.lookups.items():
        try:
            timed = _measure_lookup_passes(lookup_cell, stream, args.max_tokens, args.rounds,
                                           None if args.verbose else engine_log)
            lookup_overheads[method], lookup_records[method] = fit_lookup(
                [lookup_sample(p, DRAFT_K, args.max_tokens, timed[p])[1] for p in DRAFT_POINTS], model, profile)
        except (EngineError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(format_lookup_fit(method, lookup_overheads[method], lookup_records[method]))
    profile = with_lookup_overheads(profile, lookup_overheads)
    draft_method = next(iter(head_records), None)
    draft_records = head_records.get(draft_method, []) if draft_method else []
    warnings = profile_fit.fit_warnings(profile, [r["residual"] for r in records], bounds, _labels(records))
    print(format_warnings(warnings))
    doc = profile_document(
        profile, records,
        model={"name": model_cfg["name"], "path": model_cfg["path"], "dtype": dtype},
        device=worker.info.machine, measured_at=measured_at,
        vllm_version=worker.info.vllm_version,
        settings={"max_tokens": args.max_tokens, "rounds": args.rounds,
                  "max_step_tokens": args.max_step_tokens, "overrides": overrides,
                  # A sweep of a head left out by choice times it first (time_missing), as --add-heads does
                  # (prediction.heads_left_out): it would be priced with another head's cost per pass.
                  HEADS_LEFT_OUT: [m for m in DRAFT_METHODS if m not in head_methods(args.heads)],
                  # A sweep outside what a narrowed calibration measured has the rest timed first (time_missing).
                  **({NARROWED_TO: narrowed} if (narrowed := narrowed_to(args, points)) else {})},
        draft_records=draft_records, draft_method=draft_method, head_records=head_records,
        bounds=bounds, warnings=warnings, device_memory_bytes=probe.memory_bytes, lookup_records=lookup_records,
    )
    write_profile(doc, out)
    print(f"profile: {out}")
    return 0


def format_warnings(warnings: Sequence[str]) -> str:
    """The fit's warnings, one line each, or a line saying there are none."""
    if not warnings:
        return "fit: every rate below its device bound, every residual within 10%"
    return "\n".join(f"WARNING: {w}" for w in warnings)


def _labels(records: Sequence[dict[str, Any]]) -> list[str]:
    return [f"{r.get('kind', 'decode')} batch {r['batch_size']} x {r['prompt_tokens']} tokens" for r in records]


# Tries at the device rates; each keeps its best, since other work on the machine only ever slows them.
DEVICE_RATE_TRIES = 3


def measure_device_rates(dtype: str, *, copy_bytes: int | None = None,
                         matmul_size: int | None = None) -> profile_fit.DeviceBounds:
    """This machine's copy bandwidth and matmul rate at ``dtype``, timed with torch in a child process
    (:func:`specbench.gpu_timing.probe_device`; sizes as :func:`specbench.gpu_timing.device_rates`):
    the best of :data:`DEVICE_RATE_TRIES` tries."""
    return device_bounds(gpu_timing.probe_device(dtype, tries=DEVICE_RATE_TRIES, copy_bytes=copy_bytes,
                                                 matmul_size=matmul_size), dtype)


def device_bounds(probe: gpu_timing.DeviceProbe, dtype: str) -> profile_fit.DeviceBounds:
    """The fit's bounds from a probe that timed the device's rates; ValueError if it did not."""
    if probe.copy_bandwidth is None or probe.matmul_flops is None:
        raise ValueError("the device probe did not time the device's rates")
    return profile_fit.DeviceBounds(
        copy_bandwidth=probe.copy_bandwidth, matmul_flops=probe.matmul_flops,
        source=f"measured here with torch ({probe.device}, {dtype}, {now_iso()})")


def _device_rates(text: str) -> profile_fit.DeviceBounds:
    parts = text.split(",")
    try:
        bandwidth, flops = (float(v) for v in parts)
    except ValueError:
        raise ValueError(f"--device-rates must be GBPS,TFLOPS (two positive numbers); got {text!r}") from None
    if bandwidth <= 0 or flops <= 0:
        raise ValueError(f"--device-rates must be GBPS,TFLOPS (two positive numbers); got {text!r}")
    return profile_fit.DeviceBounds(bandwidth * 1e9, flops * 1e12, source="given with --device-rates")


def samples_from_document(doc: dict[str, Any]) -> tuple[list[profile_fit.StepSample], list[dict[str, Any]]]:
    """The step samples and their records that an earlier calibration wrote (its ``samples`` key)."""
    records = doc.get("samples")
    if not isinstance(records, list) or not records or not isinstance(records[0], dict):
        raise ValueError("the profile has no 'samples' records to refit (written by an older calibrate?)")
    samples = []
    for r in records:
        if r.get("kind", "decode") == "prefill":
            samples.append(profile_fit.StepSample(r["batch_size"] * r["prompt_tokens"], r["batch_size"],
                                                  r["context_len"], r["seconds"], logits=r["batch_size"]))
        else:
            samples.append(profile_fit.StepSample(r["batch_size"], r["batch_size"], r["context_len"], r["seconds"]))
    # The earlier fit's predictions go; fit() adds today's.
    return samples, [{k: v for k, v in r.items() if k not in ("predicted_seconds", "residual")} for r in records]


def _refit(path: Path, out: Path, given: profile_fit.DeviceBounds | None) -> int:
    """Refit an earlier calibration's samples with today's step model; write the profile to ``out``."""
    try:
        doc = yaml.safe_load(path.read_text())
        samples, records = samples_from_document(doc)
        rates = doc.get("device_rates")
        bounds = given or (profile_fit.DeviceBounds(rates["copy_bandwidth_gbps"] * 1e9, rates["matmul_tflops"] * 1e12,
                                                    source=rates["source"])
                           if rates else measure_device_rates(doc["model"]["dtype"]))
        model = prediction.model_profile(doc["model"]["path"], doc["model"]["dtype"], doc["model"]["name"])
        profile, records = fit(samples, records, model, doc["name"], bounds,
                               shared_attention=not str(doc.get("device", "")).startswith("CPU"))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 1
    print(format_fit(profile, records))
    draft = doc.get("draft_samples") or {}
    # Every head an earlier calibration timed (one written before each head had its own: its draft_samples).
    timed = doc.get("head_draft_samples") or ({draft["method"]: draft["samples"]} if draft.get("samples") else {})
    draft_cells, _ = _draft_cells(list((doc.get("settings") or {}).get("overrides") or []))
    head_records: dict[str, list[dict[str, Any]]] = {}
    overheads: dict[str, float] = {}
    step_overheads: dict[str, float] = {}
    for method, written in timed.items():
        identity = draft_cells[method][0].identity["method"] if method in draft_cells else {"name": method}
        overheads[method], step_overheads[method], head_records[method] = fit_head(
            method, identity, written, model, doc["model"]["dtype"], profile)
        print(format_draft_fit(method, overheads[method], head_records[method], step_overheads[method]))
    profile = with_head_overheads(profile, overheads, step_overheads)
    lookup_overheads: dict[str, float] = {}
    lookup_records: dict[str, list[dict[str, Any]]] = {}
    for method, written in (doc.get("lookup_samples") or {}).items():
        lookup_overheads[method], lookup_records[method] = fit_lookup(written, model, profile)
        print(format_lookup_fit(method, lookup_overheads[method], lookup_records[method]))
    profile = with_lookup_overheads(profile, lookup_overheads)
    draft_records = head_records.get(draft.get("method"), []) if draft.get("method") else []
    warnings = profile_fit.fit_warnings(profile, [r["residual"] for r in records], bounds, _labels(records))
    print(format_warnings(warnings))
    write_profile(profile_document(
        profile, records, model=doc["model"], device=doc.get("device", ""), measured_at=doc.get("measured_at", ""),
        vllm_version=doc.get("vllm_version"), settings=dict(doc.get("settings") or {}, refit_from=str(path)),
        draft_records=draft_records, draft_method=draft.get("method"),
        head_records=head_records if doc.get("head_draft_samples") else None, bounds=bounds, warnings=warnings,
        device_memory_bytes=doc.get("memory_bytes"), lookup_records=lookup_records), out)
    print(f"profile: {out}")
    return 0


def _draft_cells(
    overrides: Sequence[str], methods: Sequence[str] = DRAFT_METHODS, ks: Sequence[int] = DRAFT_KS,
) -> tuple[dict[str, list[Cell]], str]:
    """The cells whose heads the draft passes are timed with, by method in :data:`DRAFT_METHODS` order,
    one per K of ``ks`` (``--draft-ks``, default :data:`DRAFT_KS`), and why each other method has none
    ("" when every one has): a method not among ``methods`` (``--heads``) is left untimed."""
    cells, reasons = {}, []
    for method in DRAFT_METHODS:
        if method not in methods:
            reasons.append(f"{method}: left out by --heads")
            continue
        try:
            cells[method] = [with_graphs_for(cell_from_config(_compose(
                overrides, (f"method={method}", f"num_speculative_tokens={k}"))), DRAFT_POINTS) for k in ks]
        except ValueError as exc:
            reasons.append(f"{method}: {str(exc).splitlines()[-1].strip()}")
    return cells, "; ".join(reasons)


def _lookup_cells(overrides: Sequence[str]) -> dict[str, Cell]:
    """The cells whose engines time :data:`LOOKUP_METHODS` at K = :data:`DRAFT_K`, by method; a method the
    config cannot run is left out (its steps are then priced without host work, as before it was timed)."""
    cells = {}
    for method in LOOKUP_METHODS:
        try:
            cells[method] = with_graphs_for(cell_from_config(_compose(
                overrides, (f"method={method}", f"num_speculative_tokens={DRAFT_K}"))), DRAFT_POINTS)
        except ValueError:
            continue
    return cells


def fit_head(
    method: str, identity: Mapping[str, Any], records: Sequence[dict[str, Any]], model: profiles.ModelProfile,
    dtype: str, profile: profiles.HardwareProfile,
) -> tuple[float, float, list[dict[str, Any]]]:
    """One head's draft cost per pass and per speculative step from its timed passes (records as
    :func:`draft_sample` writes them), priced with its own shapes (``identity``: the cell's method config,
    which names its checkpoint); the records gain their residuals.

    Passes timed at two K or more separate the two
    (:func:`specbench.analytic.profile_fit.fit_draft_costs`); passes at one K (a calibration written before
    heads were timed at :data:`DRAFT_KS`) give the cost per pass alone and 0 per step, as they always did.
    Signed (:func:`specbench.analytic.profile_fit.fit_draft_overhead`): a head whose passes cost less than
    the roofline prices its work gets that correction, below 0, and is priced at its measured passes;
    floored at 0, the EAGLE-1 head's passes were priced 10-17% above what they measured on a CPU."""
    head = prediction.drafter_profile(dict(identity), model, dtype)
    samples = [profile_fit.DraftSample(r["batch_size"], r["k"], r["context_len"], r["seconds_per_pass"])
               for r in records]
    if len({s.k for s in samples}) > 1:
        overhead, per_step, residuals = profile_fit.fit_draft_costs(
            samples, method=method, target=model, head=head, hw=profile)
    else:
        per_step = 0.0
        overhead, residuals = profile_fit.fit_draft_overhead(
            samples, method=method, target=model, head=head, hw=profile, signed=True)
    return overhead, per_step, [dict(r, residual=res) for r, res in zip(records, residuals)]


def with_head_overheads(
    profile: profiles.HardwareProfile, overheads: Mapping[str, float], step_overheads: Mapping[str, float] | None = None,
) -> profiles.HardwareProfile:
    """``profile`` with each timed head's draft-pass overhead (:attr:`HardwareProfile.head_overheads`)
    and its cost per speculative step where it has one other than 0 (:attr:`HardwareProfile.head_step_overheads`);
    the first per-pass one, floored at 0, is also its ``draft_overhead_s``, which drafters without a timed head pay
    (a head's negative correction is its own roofline's, no fixed cost of another drafter's pass).
    Unchanged when none."""
    if not overheads:
        return profile
    per_step = tuple((m, s) for m, s in (step_overheads or {}).items() if s != 0.0)
    return replace(profile, draft_overhead_s=max(next(iter(overheads.values())), 0.0),
                   head_overheads=tuple(overheads.items()), head_step_overheads=per_step)


def format_heads_timed(
    overheads: Mapping[str, float], skipped: str, step_overheads: Mapping[str, float] | None = None,
) -> str:
    """Which drafters are priced from their own head's passes (each head's cost per pass, and per step
    where ``step_overheads`` has one), and what the others pay."""
    if not overheads:
        return f"draft passes: not timed ({skipped}); each is charged the step's fixed overhead"
    first = next(iter(overheads))
    per_step = step_overheads or {}
    costs = ", ".join(f"{m} {o * 1e3:.2f} ms per pass" + (f" + {per_step[m] * 1e3:.2f} ms per step" if m in per_step else "")
                      for m, o in overheads.items())
    line = (f"draft passes priced from their own head's (measured): {costs}; "
            f"other drafters pay {first}'s {max(overheads[first], 0.0) * 1e3:.2f} ms a pass")
    return line + (f" (not timed: {skipped})" if skipped else "")


def _measure_draft_passes(
    cell: Any, k: int, stream: Sequence[int], max_tokens: int, rounds: int, log_path: Path | None
) -> dict[GridPoint, list[tuple[float, int]]]:
    """Decode :data:`DRAFT_POINTS` on an engine with the cell's head (drafting ``k``), ``rounds`` times each:
    per point and round, the decode seconds and the drafts verified in them."""

    print(f"timing draft passes of the {cell.method} head at K={k}")
    measured = _measure_on_own_engine(cell, stream, max_tokens, rounds, log_path, _draft_line)
    return {p: [(m.decode_s, m.counters.drafts) for m in ms] for p, ms in measured.items()}


def _measure_lookup_passes(
    cell: Any, stream: Sequence[int], max_tokens: int, rounds: int, log_path: Path | None
) -> dict[GridPoint, list[tuple[float, int, int]]]:
    """Decode :data:`DRAFT_POINTS` on an engine of the cell's lookup method, ``rounds`` times each: per point
    and round, the decode seconds, the decode passes and the draft tokens verified in them."""
    print(f"timing {cell.method} steps at K={DRAFT_K}")
    measured = _measure_on_own_engine(cell, stream, max_tokens, rounds, log_path, _lookup_line)
    return {p: [(m.decode_s, sum(m.request_decode_passes), m.counters.draft_tokens) for m in ms]
            for p, ms in measured.items()}


def _measure_on_own_engine(
    cell: Any, stream: Sequence[int], max_tokens: int, rounds: int, log_path: Path | None,
    line: Callable[[Any], str],
) -> dict[GridPoint, list[Any]]:
    """:data:`DRAFT_POINTS` measured ``rounds`` times on an engine started for ``cell`` alone, closed after."""
    worker = EngineWorker(cell.engine_spec(), log_path=log_path)
    try:
        return _measure_grid(worker, DRAFT_POINTS, stream, max_tokens, rounds, line)
    finally:
        worker.close()


def _grid_samples(points: Sequence[GridPoint], measured: Mapping[GridPoint, Any], max_tokens: int) -> list[Any]:
    """Each grid point's decode sample, then each one's prefill sample, as (sample, record) pairs, in the order a
    calibration lists them; ValueError where a point's measurements cannot make one."""
    pairs = [step_sample(p, max_tokens, [m.tpot_s for m in measured[p]],
                         [t for m in measured[p] for t in m.rep_output_tokens]) for p in points]
    return pairs + [prefill_sample(p, [m.ttft_s for m in measured[p]]) for p in points]


def _measure_grid(
    worker: Any, points: Sequence[GridPoint], stream: Sequence[int], max_tokens: int, rounds: int,
    describe: Callable[[Any], str],
) -> dict[GridPoint, list[Any]]:
    """Every point's :class:`~specbench.measure.Measurement` in each of ``rounds`` passes over the grid.

    The first batch of the first round is warmed up; each measurement prints
    one line, ``describe`` saying what it measured.
    """

    measured: dict[GridPoint, list[Any]] = {p: [] for p in points}
    for round_index in range(rounds):
        for i, point in enumerate(points):
            plan = CellPlan(
                prompts=synthetic_prompts(stream, point.prompt_len, point.batch_size),
                batch_size=point.batch_size, max_tokens=max_tokens,
                repetitions=1, warmup=round_index == 0 and i == 0,
            )
            m = worker.measure(plan)
            measured[point].append(m)
            print(f"  round {round_index + 1}: batch {point.batch_size:>3} x {point.prompt_len:>5} "
                  f"tokens: {describe(m)}", flush=True)
    return measured


def _step_line(m: Any) -> str:
    step = statistics.median(m.tpot_s) * 1e3 if m.tpot_s else float("nan")
    prefill = statistics.median(m.ttft_s) * 1e3 if m.ttft_s else float("nan")
    return f"{step:.2f} ms per decode step, {prefill:.1f} ms prefill"


def _lookup_line(m: Any) -> str:
    passes = sum(m.request_decode_passes)
    per_pass = m.decode_s / passes * 1e3 if passes else float("nan")
    drafted = m.counters.draft_tokens / passes if passes else float("nan")
    return f"{per_pass:.2f} ms per decode pass, {drafted:.2f} draft tokens verified per pass"


def _draft_line(m: Any) -> str:
    per_pass = m.decode_s / m.counters.drafts * 1e3 if m.counters.drafts else float("nan")
    return f"{per_pass:.2f} ms per speculative pass"


if __name__ == "__main__":
    sys.exit(main())
