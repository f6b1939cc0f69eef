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

Each run's time is the simulated clock's, not the machine's: nothing here is timed.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence

import numpy as np

from specbench import load
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


def main(argv: Sequence[str]) -> int:
    """Print the saturation table."""
    draws = int(argv[0]) if argv else 1000
    print(f"share of {draws} draws flagged saturated (E2E {E2E_S:g} s; in flight = rate x E2E)")
    print(f"{'engine':<24} {'requests':>8}  " + "  ".join(f"{n:>5}" for n in IN_FLIGHT))
    rows = saturation_table(draws)
    for i in range(0, len(rows), len(IN_FLIGHT)):
        chunk = rows[i:i + len(IN_FLIGHT)]
        print(f"{chunk[0][0]:<24} {chunk[0][1]:>8}  " + "  ".join(f"{r[3]:>5.1%}" for r in chunk))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
