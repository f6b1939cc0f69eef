"""Serving under load: the ``load.*`` keys, their checks, and a serving cell's arrival schedule.

A cell with ``load.request_rate`` set is a *serving cell*: instead of
submitting fixed batches to the offline engine, the engine worker sends the
workload's requests to vLLM's async engine on a seeded arrival schedule
(:mod:`specbench.engine.serving`), and the batch is whatever the load makes
it. Arrivals follow ``vllm bench serve``: gamma-distributed gaps with
``shape = burstiness`` and ``scale = 1 / (rate * burstiness)`` (Poisson at
burstiness 1), all at once at rate ``inf``. Every cell with the same seed and
load keys draws the same schedule, so a speculative cell and its baseline
meet the same offered load. This module is pure Python: no vLLM.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from omegaconf import MISSING


@dataclass
class SloSchema:
    """Types of ``load.slo.*``: per-request targets a request must meet to count towards goodput (ms; null: none)."""

    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    e2e_ms: Optional[float] = None


@dataclass
class LoadSchema:
    """Types of ``load.*`` (conf/config.yaml holds the defaults and what each means)."""

    request_rate: Optional[float] = None
    burstiness: float = MISSING
    max_concurrency: Optional[int] = None
    num_requests: int = MISSING
    warmup_requests: int = MISSING
    slo: SloSchema = MISSING


# Methods whose drafter needs the offline engine: controlled acceptance decodes each batch
# plainly first and hands the outputs to its proposer inside the engine's own process.
OFFLINE_ONLY_METHODS = {"controlled": "it replays a plain pass of each batch, which needs fixed batches"}


def identity(plain: Mapping[str, Any]) -> dict[str, Any]:
    """The load keys that join a serving cell's identity; {} for an offline cell (its id stays as it was)."""
    load = plain.get("load") or {}
    if load.get("request_rate") is None:
        return {}
    return {"load": {
        "request_rate": float(load["request_rate"]),
        "burstiness": float(load["burstiness"]),
        "max_concurrency": load.get("max_concurrency"),
        "num_requests": load["num_requests"],
        "warmup_requests": load["warmup_requests"],
        "slo": {k: v for k, v in (load.get("slo") or {}).items() if v is not None},
    }}


def id_part(load: Mapping[str, Any] | None) -> str:
    """The serving part of a cell id (``-rate2``, ``-rate2-c4``, ``-rateinf``); '' for an offline cell."""
    if not load or load.get("request_rate") is None:
        return ""
    concurrency = f"-c{load['max_concurrency']}" if load.get("max_concurrency") is not None else ""
    return f"-rate{load['request_rate']:g}{concurrency}"


def validate(plain: Mapping[str, Any]) -> list[str]:
    """Every problem with a cell's ``load.*`` keys and what a serving cell cannot be combined with.

    Nothing to check for an offline cell (``load.request_rate`` null).
    """
    load = plain.get("load") or {}
    rate = load.get("request_rate")
    if rate is None:
        return []
    errors = []
    if not isinstance(rate, (int, float)) or math.isnan(rate) or rate <= 0:
        errors.append(f"load.request_rate={rate!r} must be > 0 requests per second (inf: all at once)")
    burstiness = load.get("burstiness")
    if not isinstance(burstiness, (int, float)) or not burstiness > 0:
        errors.append(f"load.burstiness={burstiness!r} must be > 0 (1: Poisson arrivals; inf: even gaps)")
    concurrency = load.get("max_concurrency")
    if concurrency is not None and not (isinstance(concurrency, int) and concurrency >= 1):
        errors.append(f"load.max_concurrency={concurrency!r} must be null or an integer >= 1")
    requests, warmup = load.get("num_requests"), load.get("warmup_requests")
    if not (isinstance(warmup, int) and warmup >= 0):
        errors.append(f"load.warmup_requests={warmup!r} must be an integer >= 0")
    elif not (isinstance(requests, int) and requests >= warmup + 2):
        errors.append(f"load.num_requests={requests!r} is too few for load.warmup_requests={warmup}: "
                      f"at least {warmup + 2} (two measured requests after the warm-up)")
    for key, value in (load.get("slo") or {}).items():
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            errors.append(f"load.slo.{key}={value!r} must be null or > 0 (milliseconds)")
    method = (plain.get("method") or {}).get("name")
    if method in OFFLINE_ONLY_METHODS:
        errors.append(f"method={method} cannot serve under load (load.request_rate is set): "
                      f"{OFFLINE_ONLY_METHODS[method]}")
    if plain.get("temperature"):
        errors.append(f"temperature={plain['temperature']:g} with load.request_rate: serving cells decode greedily "
                      "(their outputs are checked token for token against the baseline's); set temperature=0")
    if plain.get("batch_size") != 1:
        errors.append(f"batch_size={plain.get('batch_size')!r} with load.request_rate: a serving cell's batch is "
                      "what the arrivals make it; leave batch_size at 1")
    engine = plain.get("engine") or {}
    if isinstance(concurrency, int) and isinstance(engine.get("max_num_seqs"), int) \
            and concurrency > engine["max_num_seqs"]:
        errors.append(f"load.max_concurrency={concurrency} exceeds engine.max_num_seqs={engine['max_num_seqs']}")
    return errors


def arrival_times(rate: float, burstiness: float, count: int, seed: int) -> list[float]:
    """When each of ``count`` requests is sent, in seconds from the first (which is sent at 0).

    Gaps are gamma-distributed as ``vllm bench serve`` draws them (shape
    ``burstiness``, scale ``1 / (rate * burstiness)``: mean ``1 / rate``);
    burstiness ``inf`` gives even gaps, rate ``inf`` sends all at once. The
    gaps come from a generator seeded with ``seed`` alone, so every cell with
    the same seed and load meets the same schedule.
    """
    if math.isinf(rate):
        return [0.0] * count
    draw = random.Random(seed)
    times, now = [], 0.0
    for i in range(count):
        if i:
            now += 1.0 / rate if math.isinf(burstiness) else draw.gammavariate(burstiness, 1.0 / (rate * burstiness))
        times.append(now)
    return times


@dataclass(frozen=True)
class ServingPlan:
    """What a serving cell sends: its requests, when, how many at most in flight, which are warm-up.

    ``prompts[i]`` is sent ``arrivals_s[i]`` seconds after the first; the
    first ``warmup_requests`` are sent and served but left out of every figure.
    """

    prompts: tuple[tuple[int, ...], ...]
    arrivals_s: tuple[float, ...]
    max_tokens: int
    max_concurrency: int | None
    warmup_requests: int

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.arrivals_s):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.arrivals_s)} arrival times")
        if not 0 <= self.warmup_requests < len(self.prompts):
            raise ValueError(f"warmup_requests={self.warmup_requests} leaves no request of {len(self.prompts)}")

    @property
    def fingerprint(self) -> str:
        """sha256 of the exact requests and their schedule (prompts in order, arrivals, max_tokens)."""
        canonical = json.dumps({"max_tokens": self.max_tokens, "prompts": self.prompts,
                                "arrivals_s": [round(t, 9) for t in self.arrivals_s]}, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def serving_plan(load: Mapping[str, Any], prompts: list[tuple[int, ...]], max_tokens: int, seed: int) -> ServingPlan:
    """A serving cell's plan: ``load.num_requests`` requests cycling through the prompts, on its schedule."""
    count = load["num_requests"]
    return ServingPlan(
        prompts=tuple(prompts[i % len(prompts)] for i in range(count)),
        arrivals_s=tuple(arrival_times(float(load["request_rate"]), float(load["burstiness"]), count, seed)),
        max_tokens=max_tokens,
        max_concurrency=load.get("max_concurrency"),
        warmup_requests=load["warmup_requests"],
    )


@dataclass(frozen=True)
class ServedRequest:
    """One request as the client saw it, times in seconds from the schedule's start.

    ``chunk_s[i]`` is when the i-th streamed chunk came and ``chunk_tokens[i]``
    how many tokens it carried (with speculation one chunk can carry several).
    ``queue_s`` is the engine's queueing delay (queued to first scheduled; None:
    not reported). ``drafts``, ``accepted_tokens`` and ``last_accepted`` are
    the request's own speculative counts (None without speculation).
    """

    sent_s: float
    chunk_s: tuple[float, ...]
    chunk_tokens: tuple[int, ...]
    queue_s: float | None
    token_ids: tuple[int, ...]
    drafts: int | None = None
    accepted_tokens: int | None = None
    accepted_histogram: tuple[int, ...] = ()
    last_accepted: int | None = None


@dataclass(frozen=True)
class EngineStep:
    """What vLLM's scheduler reported for one engine step (read by a stat logger; seconds from the
    schedule's start): requests running and waiting, and the step's drafted tokens per position."""

    at_s: float
    running: int
    waiting: int
    draft_tokens: int = 0
    drafted_per_pos: tuple[int, ...] = ()


@dataclass(frozen=True)
class ServingMeasurement:
    """What a serving cell measured: every request sent (warm-up included, in plan order) and every engine step."""

    requests: tuple[ServedRequest, ...]
    steps: tuple[EngineStep, ...]
    warmup_requests: int
