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
import dataclasses
import hashlib
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Mapping, Optional, TypeVar

import numpy as np
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
    # Request shapes, as vllm bench serve's (:func:`request_shape_problems`); null: as the workload has them.
    output_len: Any = None  # null, an integer, or "dataset" (each record's own output_tokens)
    input_len: Optional[int] = None
    range_ratio: float = 0.0
    ramp_up_strategy: Optional[str] = None
    ramp_up_start_rps: Optional[float] = None
    ramp_up_end_rps: Optional[float] = None


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
        # Request shapes only where set: other cells keep their identity.
        **shape_identity(load),
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
    return f"-rate{load['request_rate']:g}{concurrency}{burst}{server}{shape_id_part(load)}"


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
    errors += request_shape_problems(plain)
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
    # Each request's own max_tokens (load.output_len, drawn per request); empty: max_tokens for every one.
    output_lens: tuple[int, ...] = ()

    def max_tokens_of(self, index: int) -> int:
        """Request ``index``'s output length: its own where the plan draws them, else ``max_tokens``."""
        return self.output_lens[index] if self.output_lens else self.max_tokens

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.arrivals_s):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.arrivals_s)} arrival times")
        if not 0 <= self.warmup_requests < len(self.prompts):
            raise ValueError(f"warmup_requests={self.warmup_requests} leaves no request of {len(self.prompts)}")

    @property
    def fingerprint(self) -> str:
        """sha256 of the exact requests and their schedule (prompts in order, arrivals, max_tokens, ignore_eos,
        each request's own output length where drawn)."""
        canonical = json.dumps({"max_tokens": self.max_tokens, "prompts": self.prompts,
                                "arrivals_s": [round(t, 9) for t in self.arrivals_s]}
                               | ({"ignore_eos": True} if self.ignore_eos else {})
                               | ({"output_lens": list(self.output_lens)} if self.output_lens else {}),
                               separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def serving_plan(
    load: Mapping[str, Any], prompts: list[tuple[int, ...]], max_tokens: int, seed: int, engine_run: int,
    output_tokens: Sequence[int | None] = (),
) -> ServingPlan:
    """A serving cell's plan in one engine run: ``load.num_requests`` requests cycling through the prompts
    (each prompt once where there are as many as requests: :func:`with_unique_prompts`; the warm-up then
    takes the first prompts and the measured requests the rest).

    The ``load.warmup_requests`` first are due at once (a burst that :func:`replay` serves to completion
    before the measured schedule starts); the measured requests follow the engine run's schedule
    (:func:`arrival_seed`), drawn for them alone, so that they offer the rate named over their own span;
    under ``load.ramp_up_strategy`` they climb from one rate to another (:func:`ramp_up_arrival_times`).
    ``load.output_len`` and ``load.input_len`` then shape each request (:func:`with_request_shapes`;
    ``output_tokens``: each prompt's own output length from its record, for ``load.output_len=dataset``).
    """
    count, warmup = load["num_requests"], load["warmup_requests"]
    arrivals = arrival_seed(seed, engine_run)
    if load.get("ramp_up_strategy") is not None:
        measured = ramp_up_arrival_times(load["ramp_up_strategy"], float(load["ramp_up_start_rps"]),
                                         float(load["ramp_up_end_rps"]), float(load["burstiness"]),
                                         count - warmup, arrivals)
    else:
        measured = arrival_times(float(load["request_rate"]), float(load["burstiness"]), count - warmup, arrivals)
    return with_request_shapes(load, ServingPlan(
        prompts=tuple(prompts[i % len(prompts)] for i in range(count)),
        arrivals_s=(0.0,) * warmup + tuple(measured),
        max_tokens=max_tokens,
        max_concurrency=load.get("max_concurrency"),
        warmup_requests=warmup,
        ignore_eos=bool(load.get("ignore_eos", False)),
        arrival_seed=arrivals,
    ), seed, engine_run, output_tokens)


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


# --- request shapes: per-request lengths and a ramp-up, as vllm bench serve offers them ---------------------

# vllm bench serve's --ramp-up-strategy choices (vllm/benchmarks/serve.py, _get_current_request_rate).
RAMP_UP_STRATEGIES = ("linear", "exponential")

# load.output_len's value for each record's own output length (the workload's jsonl output_tokens field).
FROM_DATASET = "dataset"


def length_range(length: int, ratio: float) -> tuple[int, int]:
    """The lengths drawn around ``length``: the integers in ``[floor(length x (1 - ratio)), ceil(length x
    (1 + ratio))]``, as vLLM's ``get_sampling_params`` (``--random-range-ratio``), the lower end at least 1."""
    low = max(1, math.floor(length * (1.0 - ratio)))
    return low, max(low, math.ceil(length * (1.0 + ratio)))


def shape_seed(kind: str, seed: int, engine_run: int) -> int:
    """The seed of one engine run's drawn lengths of ``kind`` ("inputs" or "outputs"): the cell's ``seed``
    and ``engine_run`` alone, as :func:`arrival_seed`, so a speculative cell and its baseline draw the same
    lengths and each engine run (each capacity probe) draws its own."""
    digest = hashlib.sha256(f"{kind}:{seed}:{engine_run}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def drawn_lengths(length: int, ratio: float, count: int, seed: int) -> tuple[int, ...]:
    """``count`` lengths drawn uniformly from :func:`length_range` with a generator seeded by ``seed``
    alone (numpy's ``integers``, as vLLM draws them); every one ``length`` at ratio 0."""
    low, high = length_range(length, ratio)
    return tuple(int(n) for n in np.random.default_rng(seed).integers(low, high + 1, size=count))


def fitted_prompts(prompts: Sequence[tuple[int, ...]], lengths: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Request ``i``'s prompt cut to ``lengths[i]`` tokens: real text at a drawn length. Its own prompt
    where that is long enough, else the next one in the plan's order that is (the choice is selected, not
    padded), else the longest whole; the prompt keeps its first tokens."""
    longest = max(prompts, key=len)
    fitted = []
    for i, length in enumerate(lengths):
        chosen = next((prompts[(i + j) % len(prompts)] for j in range(len(prompts))
                       if len(prompts[(i + j) % len(prompts)]) >= length), longest)
        fitted.append(chosen[:length])
    return tuple(fitted)


def ramp_up_rates(strategy: str, start_rps: float, end_rps: float, count: int) -> list[float]:
    """The rate each of ``count`` requests is drawn at, as vLLM's ``_get_current_request_rate``: request
    ``i`` at progress ``i / (count - 1)`` from ``start_rps`` to ``end_rps``, linearly or geometrically."""
    rates = []
    for i in range(count):
        progress = i / max(count - 1, 1)
        rates.append(start_rps + (end_rps - start_rps) * progress if strategy == "linear"
                     else start_rps * (end_rps / start_rps) ** progress)
    return rates


def ramp_up_arrival_times(strategy: str, start_rps: float, end_rps: float, burstiness: float, count: int,
                          seed: int) -> list[float]:
    """When each of ``count`` requests is sent under a ramp-up (``vllm bench serve --ramp-up-strategy``):
    each waits a gamma gap after the one before it (shape ``burstiness``, scale ``1 / (rate_i x
    burstiness)``; ``1 / rate_i`` at burstiness inf) at its own rate (:func:`ramp_up_rates`), and, as vLLM
    does under a ramp, the times are not rescaled: the ramp's rates are the offered load."""
    draw = random.Random(seed)
    times, now = [], 0.0
    for rate in ramp_up_rates(strategy, start_rps, end_rps, count):
        now += 1.0 / rate if math.isinf(burstiness) else draw.gammavariate(burstiness, 1.0 / (rate * burstiness))
        times.append(now)
    return times


def with_request_shapes(load: Mapping[str, Any], plan: ServingPlan, seed: int, engine_run: int,
                        output_tokens: Sequence[int | None] = ()) -> ServingPlan:
    """``plan`` with the lengths ``load`` asks for: every request's prompt cut to a drawn
    ``load.input_len`` (:func:`fitted_prompts`), its output to a drawn ``load.output_len``
    (``range_ratio`` spreading both); unchanged where neither is set.

    ``load.output_len=dataset`` takes each request's output length from its prompt's record
    (``output_tokens``, aligned with the prompts the plan cycles), capped at the plan's ``max_tokens``
    (``workload.max_tokens``, which the engine's memory is sized for); a record without one takes
    ``max_tokens``."""
    ratio = float(load.get("range_ratio") or 0.0)
    prompts, outputs = plan.prompts, plan.output_lens
    if load.get("input_len") is not None:
        prompts = fitted_prompts(plan.prompts, drawn_lengths(int(load["input_len"]), ratio, len(plan.prompts),
                                                             shape_seed("inputs", seed, engine_run)))
    if load.get("output_len") == FROM_DATASET:
        own = [output_tokens[i % len(output_tokens)] if output_tokens else None for i in range(len(plan.prompts))]
        outputs = tuple(plan.max_tokens if n is None else min(n, plan.max_tokens) for n in own)
    elif load.get("output_len") is not None:
        outputs = drawn_lengths(int(load["output_len"]), ratio, len(plan.prompts),
                                shape_seed("outputs", seed, engine_run))
    return dataclasses.replace(plan, prompts=prompts, output_lens=outputs)


def shape_identity(load: Mapping[str, Any]) -> dict[str, Any]:
    """The request-shape keys a serving cell's identity takes: those set, and the range ratio beside a
    length; {} where none is (the cell keeps the identity it had)."""
    keys: dict[str, Any] = {key: load[key] if load[key] == FROM_DATASET else int(load[key])
                            for key in ("input_len", "output_len") if load.get(key) is not None}
    if keys:
        keys["range_ratio"] = float(load.get("range_ratio") or 0.0)
    if load.get("ramp_up_strategy") is not None:
        keys |= {"ramp_up_strategy": load["ramp_up_strategy"], "ramp_up_start_rps": float(load["ramp_up_start_rps"]),
                 "ramp_up_end_rps": float(load["ramp_up_end_rps"])}
    return keys


def shape_id_part(load: Mapping[str, Any]) -> str:
    """The request shapes' part of a cell id: ``-in512``, ``-out128`` (``-outdataset``), ``-rr0.5`` (a range
    ratio beside a length), ``-ramplinear1to8``; '' where none is set."""
    keys = shape_identity(load)
    part = "".join(f"-{tag}{keys[key]}" for key, tag in (("input_len", "in"), ("output_len", "out")) if key in keys)
    if keys.get("range_ratio"):
        part += f"-rr{keys['range_ratio']:g}"
    if "ramp_up_strategy" in keys:
        part += f"-ramp{keys['ramp_up_strategy']}{keys['ramp_up_start_rps']:g}to{keys['ramp_up_end_rps']:g}"
    return part


def request_shape_problems(plain: Mapping[str, Any]) -> list[str]:
    """Every problem with the request-shape keys (``load.output_len``, ``input_len``, ``range_ratio``, the
    ``ramp_up_*``), one line each naming the key, its value and what is allowed."""
    load = plain.get("load") or {}
    workload = plain.get("workload") or {}
    errors = []
    ratio = load.get("range_ratio", 0.0)
    ratio_ok = isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0.0 <= ratio < 1.0
    if not ratio_ok:
        errors.append(f"load.range_ratio={ratio!r} must be in [0, 1): lengths are drawn uniformly from "
                      "[L x (1 - r), L x (1 + r)] (vllm bench serve's --random-range-ratio)")
    for key, bound_key in (("output_len", "max_tokens"), ("input_len", "max_prompt_tokens")):
        value = load.get(key)
        if value is None:
            continue
        if key == "output_len" and value == FROM_DATASET:
            if workload.get("source") != "jsonl":
                errors.append(f"load.output_len=dataset reads each record's output_tokens field (as vllm bench "
                              f"serve's custom dataset), which only a jsonl workload has; "
                              f"workload.source={workload.get('source')}")
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            errors.append(f"load.{key}={value!r} must be null or an integer >= 1 (tokens)"
                          + (" or dataset (each record's output_tokens)" if key == "output_len" else ""))
            continue
        bound = workload.get(bound_key)
        if ratio_ok and isinstance(bound, int) and length_range(value, ratio)[1] > bound:
            errors.append(f"load.{key}={value} with load.range_ratio={ratio:g} draws up to "
                          f"{length_range(value, ratio)[1]} tokens, above workload.{bound_key}={bound}: "
                          f"lower it or raise workload.{bound_key}")
    if ratio_ok and ratio and load.get("output_len") in (None, FROM_DATASET) and load.get("input_len") is None:
        errors.append(f"load.range_ratio={ratio:g} spreads no length: set load.output_len or load.input_len")
    strategy = load.get("ramp_up_strategy")
    start, end = load.get("ramp_up_start_rps"), load.get("ramp_up_end_rps")
    if strategy is None:
        errors += [f"load.{key}={value!r} needs load.ramp_up_strategy (linear or exponential)"
                   for key, value in (("ramp_up_start_rps", start), ("ramp_up_end_rps", end)) if value is not None]
        return errors
    if strategy not in RAMP_UP_STRATEGIES:
        return errors + [f"load.ramp_up_strategy={strategy!r} must be null, linear or exponential"]

    def rps(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf

    if not rps(start):
        errors.append(f"load.ramp_up_start_rps={start!r} must be a finite rate > 0 with "
                      f"load.ramp_up_strategy={strategy} (requests/s)")
    elif not (rps(end) and end >= start):
        errors.append(f"load.ramp_up_end_rps={end!r} must be a finite rate >= load.ramp_up_start_rps={start:g}")
    rate = load.get("request_rate")
    if not (isinstance(rate, (int, float)) and math.isinf(rate)):
        errors.append(f"load.request_rate={rate!r} with load.ramp_up_strategy={strategy}: the ramp sets the "
                      "rate; set load.request_rate=inf (as vllm bench serve does)")
    if load.get("max_concurrency") is not None:
        errors.append(f"load.max_concurrency={load['max_concurrency']!r} with load.ramp_up_strategy={strategy}: "
                      "a cap at load.request_rate=inf is a closed loop; leave load.max_concurrency null")
    return errors
