"""Is the saturation test honest? Simulated engines through the project's own serving code.

Prints figures; asserts nothing (``tests/test_serving.py`` guards the same claims with fewer draws).

    .venv/bin/python tests/benchmarks/serving_sim.py [DRAWS]

**Saturation.** An engine of unlimited capacity never queues: every request takes the same E2E
whatever else is in flight. Its arrivals are the project's own (:func:`specbench.load.serving_plan`:
the warm-up a burst, the measured requests on a seeded gamma schedule), sent as
:func:`specbench.load.replay` sends them (the measured schedule's clock starts once the warm-up
has completed), and each run is read by :func:`specbench.results.serving.cell_columns`, the code
that fills the ``saturated`` column. At 3, 8, 16, 48 and 64 requests in flight (rate x E2E), with
16 requests (2 warm-up, a CPU probe) and 220 (20 warm-up, ``serving_4090``), it prints the share of
draws flagged saturated: the target is 5% or less in each. The same with an E2E that varies from
request to request (log-normal, coefficient of variation 0.5, still never queueing), and, for the
test's power, a FIFO engine that serves at a share of the offered rate (it falls behind) and
should be flagged.

**Capacity.** A server whose requests never queue but slow with the load: each request's E2E is
log-normal (coefficient of variation 0.3) around a median that grows linearly with the offered rate,
so the share of requests within an E2E target at each rate, and the rate where it crosses 90% (the
server's capacity at E2E p90 <= 4 s), are known exactly. :func:`specbench.analytic.capacity.search`
searches it with the default settings (probes of 100 requests or 30 s, lengthened while
unresolved, the bracket's ends measured three times more), each probe read by
:func:`specbench.analytic.capacity.probe_of`; it prints how often the reported interval covers the
true capacity over 200 searches (the target: 90% or more) and the intervals' median width.

**Capacity over concurrency.** The same search along ``capacity.axis=concurrency``: a closed loop
(every request ready at once, each completion letting the next one go, as :func:`specbench.load.replay`
sends it under ``load.max_concurrency``) against a server whose E2E is log-normal (coefficient of
variation 0.3) around a median that grows linearly with the requests it is given to keep in flight, so
the most it keeps in flight with 90% of requests within the E2E target is known exactly (21). It prints
how often the interval covers it over 200 searches (the target: 90% or more).

Each run's time is the simulated clock's, not the machine's: nothing here is timed.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Callable, Sequence

import numpy as np

from specbench import load
from specbench.analytic import capacity
from specbench.load import ServedRequest, ServingMeasurement
from specbench.results import serving

E2E_S = 2.0  # a GPU-sized request: seconds, so that rate x E2E reaches tens of requests in flight
TOKENS = 8
IN_FLIGHT = (3, 8, 16, 48, 64)
SIZES = ((16, 2), (220, 20))  # (requests, warm-up): a CPU probe's and serving_4090's

# A request's E2E given its send time and the completions so far: returns its completion time.
Engine = Callable[[float, np.random.Generator, list[float]], float]


def unlimited(e2e_s: float, cv: float = 0.0) -> Engine:
    """An engine that never queues: each request's E2E is ``e2e_s`` (log-normal with coefficient of
    variation ``cv`` around it), whatever else is in flight."""
    sigma = math.sqrt(math.log1p(cv * cv))

    def serve(sent: float, rng: np.random.Generator, done: list[float]) -> float:
        return sent + (e2e_s * float(rng.lognormal(-sigma * sigma / 2, sigma)) if cv else e2e_s)

    return serve


def fifo(e2e_s: float, capacity: float) -> Engine:
    """An engine that serves ``capacity`` requests a second at most, first come first served: a request
    completes ``e2e_s`` after its send or ``1 / capacity`` after the one before it, whichever is later."""
    def serve(sent: float, rng: np.random.Generator, done: list[float]) -> float:
        return max(sent + e2e_s, (done[-1] if done else 0.0) + 1.0 / capacity)

    return serve


def request(sent: float, completed: float, ttft_share: float = 0.1, tokens: int = TOKENS) -> ServedRequest:
    """A request streamed one token a chunk: its first token a share of its E2E in, the rest even to its end."""
    first = sent + ttft_share * (completed - sent)
    chunks = tuple(np.linspace(first, completed, tokens))
    return ServedRequest(sent, chunks, (1,) * tokens, None, tuple(range(tokens)))


def run(engine: Engine, keys: dict, seed: int) -> ServingMeasurement:
    """One serving run of ``engine`` on the plan ``keys`` draw ``seed`` gives, sent as :func:`load.replay`
    sends it: the warm-up burst first, the measured schedule's clock started once the burst completed."""
    plan = load.serving_plan(keys, [(1,)], TOKENS, seed, 0)
    rng = np.random.default_rng(seed)
    done: list[float] = []
    requests = []
    for i in range(plan.warmup_requests):
        done.append(engine(0.0, rng, done))
        requests.append(request(0.0, done[-1]))
    offset = max(done, default=0.0)
    due = [*plan.arrivals_s[:plan.warmup_requests], *(offset + t for t in plan.arrivals_s[plan.warmup_requests:])]
    for t in due[plan.warmup_requests:]:
        done.append(engine(t, rng, done))
        requests.append(request(t, done[-1]))
    return ServingMeasurement(tuple(requests), (), plan.warmup_requests, tuple(due))


def run_closed(engine: Engine, keys: dict, seed: int) -> ServingMeasurement:
    """One closed-loop run (``keys``: rate inf under ``max_concurrency``) sent as :func:`load.replay` sends
    it: each request, warm-up first, goes out when one of the cap's slots frees; the measured requests
    start once every warm-up request has completed."""
    plan = load.serving_plan(keys, [(1,)], TOKENS, seed, 0)
    assert plan.max_concurrency is not None
    rng = np.random.default_rng(seed)
    done: list[float] = []
    requests = []
    offset = 0.0
    for first, last in ((0, plan.warmup_requests), (plan.warmup_requests, len(plan.arrivals_s))):
        slots = [offset] * plan.max_concurrency  # when each slot next frees, as a heap
        for i in range(first, last):
            sent = max(offset + plan.arrivals_s[i], heapq.heappop(slots))
            done.append(engine(sent, rng, done))
            heapq.heappush(slots, done[-1])
            requests.append(request(sent, done[-1]))
        offset = max(done, default=0.0)
    due = (*plan.arrivals_s[:plan.warmup_requests],
           *(max(done[:plan.warmup_requests], default=0.0) + t for t in plan.arrivals_s[plan.warmup_requests:]))
    return ServingMeasurement(tuple(requests), (), plan.warmup_requests, tuple(due))


def flagged_share(engine: Engine, rate: float, requests: int, warmup: int, draws: int) -> float:
    """The share of ``draws`` seeded runs at ``rate`` that ``cell_columns`` calls saturated."""
    keys = {"request_rate": rate, "burstiness": 1.0, "max_concurrency": None, "num_requests": requests,
            "warmup_requests": warmup}
    return sum(serving.cell_columns(run(engine, keys, seed), keys)["saturated"] for seed in range(draws)) / draws


def saturation_table(draws: int, in_flight: Sequence[int] = IN_FLIGHT) -> list[tuple[str, int, int, float]]:
    """(engine, requests, in flight, share flagged) for every case the module names."""
    rows = []
    for name, engine in (("unlimited, fixed E2E", unlimited(E2E_S)),
                         ("unlimited, E2E cv 0.5", unlimited(E2E_S, 0.5))):
        for requests, warmup in SIZES:
            for n in in_flight:
                rows.append((name, requests, n, flagged_share(engine, n / E2E_S, requests, warmup, draws)))
    for share in (0.7, 0.5):
        for requests, warmup in SIZES:
            for n in in_flight:
                rate = n / E2E_S
                rows.append((f"FIFO at {share:g}x the rate", requests, n,
                             flagged_share(fifo(E2E_S, share * rate), rate, requests, warmup, draws)))
    return rows


# The capacity server: median E2E = SLOW_E2E_S x (1 + rate / SLOW_RATE), coefficient of variation SLOW_CV.
SLOW_E2E_S, SLOW_RATE, SLOW_CV = 1.0, 2.0, 0.3
E2E_TARGET_MS = 4000.0
SETTINGS = capacity.Settings.of({"min_rate": 0.5, "max_rate": 16.0, "max_probes": 6, "requests_per_probe": 100,
                                 "warmup": 4, "percentile": 90.0, "tolerance": 0.1, "min_probe_s": 30.0,
                                 "max_extensions": 3, "confirmations": 3})


def true_capacity(target: float = SETTINGS.target, scale: float = SLOW_RATE) -> float:
    """The rate at which the capacity server's share of requests within :data:`E2E_TARGET_MS` is ``target``
    (with ``scale`` :data:`CONCURRENCY_SCALE`: the concurrency cap at which the closed-loop server's is)."""
    sigma = math.sqrt(math.log1p(SLOW_CV * SLOW_CV))
    z = float(np.sqrt(2.0) * _erfinv(2.0 * target - 1.0))
    # E2E = m x exp(sigma N - sigma^2 / 2): within T with probability Phi((ln(T / m) + sigma^2 / 2) / sigma).
    median = (E2E_TARGET_MS / 1000.0) * math.exp(sigma * sigma / 2.0 - sigma * z)
    return scale * (median / SLOW_E2E_S - 1.0)


def _erfinv(y: float) -> float:
    """The inverse error function, by bisection on math.erf (enough digits for a rate)."""
    low, high = -6.0, 6.0
    for _ in range(100):
        middle = (low + high) / 2.0
        low, high = (middle, high) if math.erf(middle) < y else (low, middle)
    return (low + high) / 2.0


def capacity_search(index: int, settings: capacity.Settings = SETTINGS) -> capacity.Capacity:
    """One search of the capacity server, its arrival draws and E2E noise seeded by ``index`` and each probe's draw."""
    targets = {"e2e_ms": E2E_TARGET_MS}

    def probe(rate: float, draw: int) -> capacity.Probe:
        keys = {"request_rate": rate, "burstiness": 1.0, "max_concurrency": None,
                "num_requests": settings.requests(rate), "warmup_requests": settings.warmup}
        engine = unlimited(SLOW_E2E_S * (1.0 + rate / SLOW_RATE), SLOW_CV)
        return capacity.probe_of(run(engine, keys, index * 1000 + draw), keys, targets, settings.percentile, draw=draw)

    return capacity.search(probe, settings)


# The closed-loop server: median E2E = SLOW_E2E_S x (1 + cap / CONCURRENCY_SCALE), coefficient of variation
# SLOW_CV; its share within E2E_TARGET_MS crosses 90% at 21.5 requests in flight, so its capacity is 21.
CONCURRENCY_SCALE = 11.5
CONCURRENCY_SETTINGS = capacity.Settings.of({
    "min_rate": 0.5, "max_rate": 16.0, "max_probes": 6, "requests_per_probe": 100, "warmup": 4,
    "percentile": 90.0, "tolerance": 0.1, "min_probe_s": 30.0, "max_extensions": 3, "confirmations": 3,
    "axis": "concurrency", "min_concurrency": 1, "max_concurrency": 64})


def true_concurrency(target: float = CONCURRENCY_SETTINGS.target) -> int:
    """The closed-loop server's capacity: the most requests in flight at which its share within
    :data:`E2E_TARGET_MS` is still at least ``target``."""
    return math.floor(true_capacity(target, CONCURRENCY_SCALE))


def concurrency_search(index: int, settings: capacity.Settings = CONCURRENCY_SETTINGS) -> capacity.Capacity:
    """One search of the closed-loop server along the concurrency axis, seeded by ``index`` and each probe's draw."""
    targets = {"e2e_ms": E2E_TARGET_MS}

    def probe(cap: float, draw: int) -> capacity.Probe:
        keys = {"request_rate": math.inf, "burstiness": 1.0, "max_concurrency": int(cap),
                "num_requests": settings.requests(cap), "warmup_requests": settings.warmup}
        engine = unlimited(SLOW_E2E_S * (1.0 + cap / CONCURRENCY_SCALE), SLOW_CV)
        return capacity.probe_of(run_closed(engine, keys, index * 1000 + draw), keys, targets, settings.percentile,
                                 draw=draw, axis=settings.axis)

    return capacity.search(probe, settings)


def coverage(searches: int, settings: capacity.Settings = SETTINGS) -> tuple[float, float, float]:
    """(share of searches whose interval covers the true capacity, median relative width, median probes);
    along the axis ``settings`` names (the rate server, or the closed-loop one)."""
    if settings.axis == capacity.CONCURRENCY:
        truth: float = true_concurrency(settings.target)
        found = [concurrency_search(i, settings) for i in range(searches)]
    else:
        truth = true_capacity(settings.target)
        found = [capacity_search(i, settings) for i in range(searches)]
    widths = [c.high / c.low - 1.0 for c in found if c.low > 0 and math.isfinite(c.high)]
    return (sum(c.covers(truth) for c in found) / searches, float(np.median(widths)) if widths else math.nan,
            float(np.median([len(c.probes) for c in found])))


def main(argv: Sequence[str]) -> int:
    """Print the saturation table and the capacity search's coverage."""
    draws = int(argv[0]) if argv else 1000
    searches = int(argv[1]) if len(argv) > 1 else 200
    covered, width, probes = coverage(searches)
    print(f"capacity server (true capacity {true_capacity():.3f} req/s at E2E p90 <= {E2E_TARGET_MS:g} ms): "
          f"the interval covers it in {covered:.1%} of {searches} searches; median width {width:.1%} of its "
          f"lower end; median {probes:g} probes a search")
    covered, width, probes = coverage(searches, CONCURRENCY_SETTINGS)
    print(f"closed-loop server (true capacity {true_concurrency()} concurrent requests at E2E p90 <= "
          f"{E2E_TARGET_MS:g} ms; its share crosses 90% at {true_capacity(scale=CONCURRENCY_SCALE):.2f}): the "
          f"interval covers it in {covered:.1%} of {searches} searches; median width {width:.1%} of its lower end; "
          f"median {probes:g} probes a search")
    print(f"share of {draws} draws flagged saturated (E2E {E2E_S:g} s; in flight = rate x E2E)")
    print(f"{'engine':<24} {'requests':>8}  " + "  ".join(f"{n:>5}" for n in IN_FLIGHT))
    rows = saturation_table(draws)
    for i in range(0, len(rows), len(IN_FLIGHT)):
        chunk = rows[i:i + len(IN_FLIGHT)]
        print(f"{chunk[0][0]:<24} {chunk[0][1]:>8}  " + "  ".join(f"{r[3]:>5.1%}" for r in chunk))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
