"""Serving under load: the ``load.*`` keys, their checks, and a serving cell's arrival schedule.

A cell with ``load.request_rate`` set is a *serving cell*: instead of
submitting fixed batches to the offline engine, the engine worker sends the
workload's requests to vLLM's async engine on a seeded arrival schedule
(:mod:`specbench.engine.serving`), and the batch is whatever the load makes
it. Arrivals follow ``vllm bench serve``'s ``get_request``: gamma-distributed
gaps with ``shape = burstiness`` and ``scale = 1 / (rate * burstiness)``
(Poisson at burstiness 1), the schedule then stretched so that its last
request goes out at ``N / rate``; all at once at rate ``inf``. Each engine run
draws its own schedule from :func:`arrival_seed` (the cell's seed and engine
run), so a speculative cell and its baseline in one engine run meet the same
offered load, and the spread across engine runs holds the arrival process's
own noise. ``load.via=server`` sends the same schedule over HTTP to a ``vllm serve``
process of the cell's own (:mod:`specbench.engine.server`). This module is pure Python: no vLLM.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Mapping, Optional, TypeVar

from omegaconf import MISSING

from specbench.measure import SpecCounters


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
    ignore_eos: bool = False
    via: str = "inprocess"
    cycle_prompts: bool = False
    slo: SloSchema = MISSING


# vLLM's usage context for a serving engine (vllm.usage.usage_lib.UsageContext): vllm serve's. AsyncLLM's own
# default, ENGINE_CONTEXT, has no entry in EngineArgs.get_batch_defaults and falls back to the scheduler's
# generic defaults (2048 tokens a step), where vllm serve takes 8192 on an H100/H200 and 16384 from 160 GiB.
USAGE_CONTEXT = "OPENAI_API_SERVER"

# How a serving cell reaches its engine (``load.via``): vLLM's AsyncLLM inside the engine worker (no HTTP),
# or a ``vllm serve`` process of its own driven over HTTP from the worker (specbench.engine.server).
VIA = ("inprocess", "server")

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
        "ignore_eos": bool(load.get("ignore_eos", False)),
        "slo": {k: v for k, v in (load.get("slo") or {}).items() if v is not None},
        # Through the server only: an in-process cell keeps the identity it had before load.via existed.
        **({"via": "server"} if load.get("via") == "server" else {}),
    }}


def id_part(load: Mapping[str, Any] | None) -> str:
    """The serving part of a cell id (``-rate2``, ``-rate2-c4``, ``-rateinf-c8``, ``-rate2-burst0.5``,
    ``-rate2-server`` through the server); '' for an offline cell. Burstiness shows only away from
    Poisson (1), and the server only when asked for, so other cells keep the ids they had."""
    if not load or load.get("request_rate") is None:
        return ""
    concurrency = f"-c{load['max_concurrency']}" if load.get("max_concurrency") is not None else ""
    burstiness = float(load.get("burstiness", 1.0))
    burst = f"-burst{burstiness:g}" if burstiness != 1.0 else ""
    server = "-server" if load.get("via") == "server" else ""
    return f"-rate{load['request_rate']:g}{concurrency}{burst}{server}"


def with_unique_prompts(plain: dict[str, Any]) -> dict[str, Any]:
    """A serving cell's config whose workload holds a prompt for each of its requests: an integer
    ``workload.num_prompts`` below ``load.num_requests`` raised to it, unless ``load.cycle_prompts`` asks
    for the workload's prompts to repeat (:func:`serving_plan` cycles them). Offline cells, cycling cells,
    and ``num_prompts: all`` come back unchanged.

    A repeated prompt's prefill comes whole from the prefix cache, so a schedule that cycles its prompts
    reads a TTFT no server meeting new prompts would; and the warm-up requests' prompts would come round
    again among the measured ones.
    """
    load, workload = plain.get("load") or {}, plain.get("workload") or {}
    prompts, requests = workload.get("num_prompts"), load.get("num_requests")
    if load.get("request_rate") is None or load.get("cycle_prompts") or not isinstance(prompts, int) \
            or not isinstance(requests, int) or requests <= prompts:
        return plain
    return dict(plain, workload=dict(workload, num_prompts=requests))


def is_closed_loop(rate: float | None, max_concurrency: int | None) -> bool:
    """Whether a load is a closed loop (GuideLLM's ``concurrent`` profile): every request ready at once
    (rate ``inf``) and ``max_concurrency`` of them in flight, each completion letting the next one go.

    Its offered load is what the slots let through, not a rate named in advance: it cannot fall behind
    a schedule, and its queue is the client's (each request's wait for a slot).
    """
    return rate is not None and math.isinf(float(rate)) and max_concurrency is not None


@dataclass(frozen=True)
class LoadShape:
    """How requests arrive, but for their rate: the concurrency cap, the burstiness of the gaps, and
    the path they take (``load.via``: in process, or through ``vllm serve`` over HTTP).

    A point of load is a rate in a shape (rate x concurrency x burstiness); verdicts walk the rates
    of one shape, and a closed loop (rate ``inf`` under a cap) is a shape of its own at each cap.
    The two paths measure different latencies (docs/serving.md), so they never share a curve.
    """

    max_concurrency: int | None
    burstiness: float = 1.0
    via: str = "inprocess"

    def text(self) -> str:
        """``"c8"``, ``"burstiness 0.5"``, ``"c4, burstiness 0.5, via server"``; '' for the default
        (no cap, Poisson, in process)."""
        parts = ([f"c{self.max_concurrency}"] if self.max_concurrency is not None else []) + (
            [f"burstiness {self.burstiness:g}"] if self.burstiness != 1.0 else []) + (
            [f"via {self.via}"] if self.via != "inprocess" else [])
        return ", ".join(parts)


_Served = TypeVar("_Served")


async def replay(arrivals_s: Sequence[float], max_concurrency: int | None, start: float,
                 send: Callable[[int], Awaitable[_Served]], warmup: int = 0) -> tuple[list[_Served], tuple[float, ...]]:
    """Send request ``i`` at ``start + arrivals_s[i]`` (``time.perf_counter``'s clock), the client's side of a
    serving cell wherever the engine runs; under ``max_concurrency`` each first waits for a free slot, as
    ``vllm bench serve``'s ``--max-concurrency``.

    The first ``warmup`` requests go first, on their own (a plan has them all due at 0: a burst), and
    every one of them completes before the measured schedule's clock starts, as ``vllm bench serve``'s
    ``--num-warmups``: the measured requests then meet an engine that is warm and empty, not the tail
    of the warm-up's queue. Returns the results in request order and when each request was due, in
    seconds from ``start`` (the measured ones shifted by the time the warm-up took).
    """
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(index: int, due: float) -> _Served:
        await asyncio.sleep(max(0.0, start + due - time.perf_counter()))
        if slots is None:
            return await send(index)
        async with slots:
            return await send(index)

    warm = list(await asyncio.gather(*(one(i, arrivals_s[i]) for i in range(warmup))))
    offset = time.perf_counter() - start if warmup else 0.0
    due = (*arrivals_s[:warmup], *(offset + t for t in arrivals_s[warmup:]))
    measured = await asyncio.gather(*(one(i, due[i]) for i in range(warmup, len(arrivals_s))))
    return warm + list(measured), tuple(due)


def warmup_problems(requests_key: str, requests: Any, warmup_key: str, warmup: Any) -> list[str]:
    """A run of ``requests`` whose first ``warmup`` are left out: both keys named, two measured requests at least."""
    if not (isinstance(warmup, int) and warmup >= 0):
        return [f"{warmup_key}={warmup!r} must be an integer >= 0"]
    if not (isinstance(requests, int) and requests >= warmup + 2):
        return [f"{requests_key}={requests!r} is too few for {warmup_key}={warmup}: "
                f"at least {warmup + 2} (two measured requests after the warm-up)"]
    return []


def validate(plain: Mapping[str, Any]) -> list[str]:
    """Every problem with a cell's ``load.*`` keys and what a serving cell cannot be combined with.

    An offline cell (``load.request_rate`` null) has its values checked, and must not ask for the server.
    """
    load = plain.get("load") or {}
    rate = load.get("request_rate")
    via = load.get("via", "inprocess")
    if via not in VIA:
        return [f"load.via={via!r} must be one of {', '.join(VIA)} (inprocess: vLLM's async engine in the "
                "engine worker; server: a vllm serve process driven over HTTP)"]
    if not load:
        return []  # a config from before load.* existed: an offline cell
    # Each value against its range whether or not a rate makes it matter: a bad one left in an offline
    # command line would go unseen until the rate is added (and specbench.capacity adds it).
    errors = []
    burstiness = load.get("burstiness")
    if not isinstance(burstiness, (int, float)) or not burstiness > 0:
        errors.append(f"load.burstiness={burstiness!r} must be > 0 (1: Poisson arrivals; inf: even gaps)")
    concurrency = load.get("max_concurrency")
    if concurrency is not None and not (isinstance(concurrency, int) and concurrency >= 1):
        errors.append(f"load.max_concurrency={concurrency!r} must be null or an integer >= 1")
    errors += warmup_problems("load.num_requests", load.get("num_requests"),
                              "load.warmup_requests", load.get("warmup_requests"))
    if not isinstance(load.get("ignore_eos", False), bool):
        errors.append(f"load.ignore_eos={load.get('ignore_eos')!r} must be true or false")
    if not isinstance(load.get("cycle_prompts", False), bool):
        errors.append(f"load.cycle_prompts={load.get('cycle_prompts')!r} must be true or false")
    for key, value in (load.get("slo") or {}).items():
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            errors.append(f"load.slo.{key}={value!r} must be null or > 0 (milliseconds)")
    if rate is None:
        if via == "server":
            errors.append("load.via=server needs a serving cell: set load.request_rate (offline cells run the "
                          "offline engine in process)")
        return errors
    if not isinstance(rate, (int, float)) or math.isnan(rate) or rate <= 0:
        errors.append(f"load.request_rate={rate!r} must be > 0 requests per second (inf: all at once)")
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


def arrival_seed(seed: int, engine_run: int) -> int:
    """The seed of one engine run's arrival schedule: the cell's ``seed`` and ``engine_run``, nothing else.

    A speculative cell and its baseline share both, so they meet the same schedule in each engine run;
    each engine run draws another, so the interval across engine runs carries the arrival noise.
    """
    digest = hashlib.sha256(f"arrivals:{seed}:{engine_run}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def arrival_times(rate: float, burstiness: float, count: int, seed: int) -> list[float]:
    """When each of ``count`` requests is sent, in seconds from the schedule's start.

    As ``vllm bench serve``'s ``get_request`` (vllm/benchmarks/serve.py, no ramp-up): each request
    waits a gamma-distributed gap after the one before it (the first after the start; shape
    ``burstiness``, scale ``1 / (rate * burstiness)``: mean ``1 / rate``), and the cumulative times
    are then scaled so that the last request goes out at exactly ``count / rate``: the offered load
    over the whole schedule is the rate named, and the arrival noise is in how the requests spread
    inside it. Burstiness ``inf`` gives even gaps, rate ``inf`` sends all at once. The gaps come
    from a generator seeded with ``seed`` alone.
    """
    if math.isinf(rate):
        return [0.0] * count
    draw = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        now += 1.0 / rate if math.isinf(burstiness) else draw.gammavariate(burstiness, 1.0 / (rate * burstiness))
        times.append(now)
    if times and times[-1] > 0:
        scale = (count / rate) / times[-1]
        times = [t * scale for t in times]
    return times


def realised_rate(times: list[float] | tuple[float, ...]) -> float | None:
    """The offered rate a stretch of sends realised: gaps over the span from the first send to the last
    (``len - 1`` over ``last - first``); inf when they all go at once, None for fewer than two."""
    if len(times) < 2:
        return None
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else math.inf


@dataclass(frozen=True)
class ServingPlan:
    """What a serving cell sends: its requests, when, how many at most in flight, which are warm-up.

    ``prompts[i]`` is due ``arrivals_s[i]`` seconds after the schedule's start; the first
    ``warmup_requests`` (due at once) are sent and served before the measured ones start
    (:func:`replay`) and left out of every figure.
    """

    prompts: tuple[tuple[int, ...], ...]
    arrivals_s: tuple[float, ...]
    max_tokens: int
    max_concurrency: int | None
    warmup_requests: int
    ignore_eos: bool = False
    arrival_seed: int | None = None

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.arrivals_s):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.arrivals_s)} arrival times")
        if not 0 <= self.warmup_requests < len(self.prompts):
            raise ValueError(f"warmup_requests={self.warmup_requests} leaves no request of {len(self.prompts)}")

    @property
    def fingerprint(self) -> str:
        """sha256 of the exact requests and their schedule (prompts in order, arrivals, max_tokens, ignore_eos)."""
        canonical = json.dumps({"max_tokens": self.max_tokens, "prompts": self.prompts,
                                "arrivals_s": [round(t, 9) for t in self.arrivals_s]}
                               | ({"ignore_eos": True} if self.ignore_eos else {}), separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def serving_plan(
    load: Mapping[str, Any], prompts: list[tuple[int, ...]], max_tokens: int, seed: int, engine_run: int,
) -> ServingPlan:
    """A serving cell's plan in one engine run: ``load.num_requests`` requests cycling through the prompts
    (each prompt once where there are as many as requests: :func:`with_unique_prompts`; the warm-up then
    takes the first prompts and the measured requests the rest).

    The ``load.warmup_requests`` first are due at once (a burst that :func:`replay` serves to completion
    before the measured schedule starts); the measured requests follow the engine run's schedule
    (:func:`arrival_seed`), drawn for them alone, so that they offer the rate named over their own span.
    """
    count, warmup = load["num_requests"], load["warmup_requests"]
    arrivals = arrival_seed(seed, engine_run)
    measured = arrival_times(float(load["request_rate"]), float(load["burstiness"]), count - warmup, arrivals)
    return ServingPlan(
        prompts=tuple(prompts[i % len(prompts)] for i in range(count)),
        arrivals_s=(0.0,) * warmup + tuple(measured),
        max_tokens=max_tokens,
        max_concurrency=load.get("max_concurrency"),
        warmup_requests=warmup,
        ignore_eos=bool(load.get("ignore_eos", False)),
        arrival_seed=arrivals,
    )


@dataclass(frozen=True)
class ServedRequest:
    """One request as the client saw it, times in seconds from the schedule's start.

    ``chunk_s[i]`` is when the i-th streamed chunk came and ``chunk_tokens[i]``
    how many tokens it carried (with speculation one chunk can carry several).
    ``queue_s`` is the engine's queueing delay (queued to first scheduled; None:
    not reported). ``drafts``, ``draft_tokens``, ``accepted_tokens`` and
    ``last_accepted`` are the request's own speculative counts (None without
    speculation); ``drafted_per_step`` the tokens drafted at each of its
    verification steps (empty where vLLM did not report them).
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
    draft_tokens: int | None = None
    drafted_per_step: tuple[int, ...] = ()


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
    """What a serving cell measured: every request sent (warm-up included, in plan order) and every engine step.

    ``arrivals_s``: the schedule the requests were due on (the plan's; empty: unknown), what the
    offered load is read from, apart from when a request actually went out (``sent_s``, later under
    ``max_concurrency``). ``counters``: the engine's speculative counters over the measured
    requests' lifetime, from the first measured send to the last token, where the requests carry no
    counts of their own (through the server, from its ``/metrics``); None: the requests' own counts.
    ``server_counters``: through the server with speculation, its ``/metrics`` counters over the same
    stretch whatever the requests carried, the cross-check of their own counts; None in process.
    """

    requests: tuple[ServedRequest, ...]
    steps: tuple[EngineStep, ...]
    warmup_requests: int
    arrivals_s: tuple[float, ...] = ()
    counters: SpecCounters | None = None
    server_counters: SpecCounters | None = None
