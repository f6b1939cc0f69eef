"""Serving cells' figures: per request, per cell, and against the baseline at the same offered load.

Definitions follow ``vllm bench serve``: TTFT is send to first token, TPOT
``(e2e - ttft) / (output tokens - 1)`` (requests of one token have none), ITL
the gaps between streamed chunks pooled over requests, E2E send to last
token. The warm-up requests are left out of every figure.

The load and what the engine made of it are read over the *send span*: the
measured requests' first send to their last (:func:`window`), not up to the
last token, so the drain after the last arrival (the last request's E2E, most
of a short light-load run) weighs on no rate. ``vllm bench serve`` divides
by its whole run, schedule start to last token; over its thousand requests
the drain is a sliver, over a few it is not. The offered rate is the one the
schedule realised over the measured requests (:func:`specbench.load.realised_rate`:
the arrivals after the first over the span), the achieved rate the measured
requests completed inside the span shifted by their median E2E, over its
length (:func:`completions`): below saturation completions follow the
arrivals one E2E later and the two agree; past it completions come at the
engine's own pace. The warm-up requests are served to completion before the
measured ones start (:func:`specbench.load.replay`). Goodput is, as in vLLM,
the achieved rate times the share of measured requests meeting every SLO
(``slo_attainment``).

A cell is *saturated* (:func:`saturation`) when its completions fall behind
the realised offered rate, or the engine's queue grows across the send span
(vLLM's waiting count, or each request's TTFT against when it was sent), each
significant at 5%. Saturated rates are named and left out of the verdicts.

Across engine runs (read from the sweep's plan, never a directory listing),
each speedup is the geometric mean of the per-run ratios, with the interval of
:func:`specbench.stats.intervals.speedup_interval` over the engine-to-engine spread pooled
across the sweep's serving cells *of the same regime* (below or at
saturation); two engine runs of a cell that disagree beyond that spread flag
it. One rule says whether a configuration pays at a rate, the offline
verdicts' (:func:`specbench.stats.intervals.clears` on the E2E p50 speedup: its 95%
interval's lower end above 1, or its point estimate where there is no
interval), recorded per cell as ``serving_pays``; the verdict, the highest
rate at which it still pays, is :func:`specbench.analytic.verdicts.serving_verdict`'s.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specbench.load import (
    USAGE_CONTEXT,
    LoadShape,
    ServedRequest,
    ServingMeasurement,
    ServingPlan,
    is_closed_loop,
    realised_rate,
)
from specbench.measure import GeneratedRequest, Measurement, SpecCounters
from specbench.results.files import CellFiles
from specbench.results.judging import FAMILY_ALPHA, disagreement_tests
from specbench.results.schema import ResultsError, engine_groups, engine_instance, read_rows
from specbench.stats import distributions, intervals, spreads, timings

# The client's queue (since schema 15): each measured request's wait from its scheduled arrival to its
# send (a slot under load.max_concurrency, or the event loop's lateness), and its E2E counted from the
# arrival, the latency a user who arrived then would see. Percentiles over the measured requests.
ARRIVAL_COLUMNS = ("wait_to_send_s_p50", "wait_to_send_s_p90", "e2e_from_arrival_s_p50", "e2e_from_arrival_s_p90")
# Per cell: the load it met and what it achieved (cells/<id>.parquet and results.parquet; also the
# running batch at every step of the window, running_batch_t_s and running_batch).
CELL_COLUMNS = (
    "load_request_rate", "load_burstiness", "load_max_concurrency", "load_warmup_requests",
    "offered_rate_realised", "served_requests", "serving_window_s", "achieved_request_rate",
    "achieved_output_tokens_per_s", "goodput", "slo_met_requests", "slo_attainment",
    "itl_s_p50", "itl_s_p90", "itl_s_p99", "queue_s_p50", "queue_s_p90", "queue_s_p99", "queue_s_mean",
    "tpot_s_request_mean", "tpot_s_std", "queue_growth_per_s", "ttft_slope",
    "running_batch_mean", "running_batch_p90", "running_batch_max",
    *ARRIVAL_COLUMNS, "server_metrics_acceptance",
)
# Through the server, acceptance read a second way: 1 + accepted / drafts from vLLM's /metrics counters
# differenced over the measured requests' lifetime (first measured send to last measured token), beside
# the requests' own counts from their final usage chunks. Both count the same engine steps, so a gap
# beyond the second decimal means a step of another request fell inside the window or a counter lagged.
METRICS_TOLERANCE = 0.005
# The speedups against the baseline at the same offered load (results.parquet only), each with its interval.
SPEEDUPS = {
    "tpot_p50": ("tpot_s_p50", False),
    "e2e_p50": ("e2e_s_p50", False),
    "e2e_p90": ("e2e_s_p90", False),
    "goodput": ("goodput", True),  # higher is better: the cell's over the baseline's
}
# The figure whose speedup decides whether a configuration pays at a rate: what a user waits for.
PAYS_ON = "e2e_p50"
# Completions below this share of the realised offered rate: the engine no longer keeps up. The two
# queue-growth tests are held to the same share: a FIFO queue fed at rate a and served at rate c < a
# grows by a - c requests a second, and the n-th request, sent at n / a, waits n / c - n / a, a TTFT
# that climbs a / c - 1 seconds per second of arrivals.
SATURATED_SHARE = 0.85
# Each of the three readings must also be significant at this level (one-sided): a run is called
# saturated on evidence, not on a point estimate that the arrival noise of a few requests can tip.
SATURATION_ALPHA = 0.05
# Shuffles of the requests' E2Es behind the completions test's p-value (seeded: a cell's columns are
# a function of its measurement).
SHUFFLES = 400
# Regimes of the pooled spread: one interval's noise at light load says little about the noise past saturation.
REGIMES = {False: "below saturation", True: "at saturation"}


def _measured(m: ServingMeasurement) -> list[ServedRequest]:
    return list(m.requests[m.warmup_requests:])


def _arrivals(m: ServingMeasurement) -> list[float]:
    """The measured requests' scheduled arrivals (their sends where the schedule was not recorded)."""
    if len(m.arrivals_s) == len(m.requests):
        return list(m.arrivals_s[m.warmup_requests:])
    return [r.sent_s for r in _measured(m)]


def arrival_waits(m: ServingMeasurement) -> list[tuple[float, float | None]]:
    """Each measured request's wait from its scheduled arrival to its send, and its E2E from the arrival
    (None where it streamed nothing); empty where the schedule was not recorded."""
    if len(m.arrivals_s) != len(m.requests):
        return []
    return [(r.sent_s - due, r.chunk_s[-1] - due if r.chunk_s else None)
            for due, r in zip(m.arrivals_s[m.warmup_requests:], _measured(m))]


def _percentiles(values: Sequence[float], name: str) -> dict[str, float | None]:
    """p50 and p90 of ``values`` as ``<name>_p50``, ``<name>_p90`` (None, None when empty)."""
    known = [v for v in values if v is not None]
    if not known:
        return {f"{name}_p50": None, f"{name}_p90": None}
    return {f"{name}_p{q}": float(np.percentile(known, q)) for q in (50, 90)}


def request_latencies(request: ServedRequest) -> tuple[float | None, float | None, float | None, list[float]]:
    """One request's TTFT, TPOT, E2E latency and inter-chunk gaps (None where it streamed no token)."""
    if not request.chunk_s:
        return None, None, None, []
    ttft = request.chunk_s[0] - request.sent_s
    e2e = request.chunk_s[-1] - request.sent_s
    tokens = len(request.token_ids)
    tpot = (e2e - ttft) / (tokens - 1) if tokens > 1 else None
    return ttft, tpot, e2e, list(np.diff(request.chunk_s))


def window(m: ServingMeasurement) -> tuple[float, float]:
    """The measured window: the send span, first measured send to last (seconds from the schedule's start).

    Where every measured request went out at once (rate ``inf``) there is no span: the window then
    runs to the last measured token, the only duration such a burst has.
    """
    measured = _measured(m)
    start = min(r.sent_s for r in measured)
    end = max(r.sent_s for r in measured)
    if end <= start:
        end = max((r.chunk_s[-1] for r in measured if r.chunk_s), default=start)
    return start, end


def meets_slo(request: ServedRequest, slo: Mapping[str, float | None]) -> bool:
    """Whether a request meets every target set in ``slo`` (``ttft_ms``, ``tpot_ms``, ``e2e_ms``)."""
    ttft, tpot, e2e, _ = request_latencies(request)
    checks = {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e}
    for key, target in slo.items():
        if target is None:
            continue
        value = checks[key]
        if key == "tpot_ms" and value is None:
            continue  # one token: no TPOT, as vllm bench serve leaves it out
        if value is None or value * 1000.0 > target:
            return False
    return True


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float | None, float | None]:
    """Wilson's score interval for a share of ``successes`` in ``n`` (None, None for n = 0).

    It treats the requests as independent draws; under load they share the queue, so it is the
    interval of a well-mixed run, narrower than a rerun's where a burst sinks many requests at once.
    """
    if n <= 0:
        return None, None
    z = statistics.NormalDist().inv_cdf((1.0 + confidence) / 2.0)
    share = successes / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def running_batch(m: ServingMeasurement) -> tuple[list[float], list[int]]:
    """The engine steps over the window: when each was reported and how many requests it ran.

    A step reports as it ends, so the first step reported after the window closes ran through the
    window's tail: it is kept, its time clipped to the window's end (on a slow machine one step can
    outlast a short send span, which would otherwise hold no step at all).
    """
    start, end = window(m)
    inside = [s for s in m.steps if start <= s.at_s <= end]
    after = next((s for s in m.steps if s.at_s > end), None)
    times, running = [s.at_s for s in inside], [s.running for s in inside]
    if after is not None:
        times.append(end)
        running.append(after.running)
    return times, running


def time_weighted(times: Sequence[float], values: Sequence[int], start: float) -> tuple[float | None, float | None]:
    """Mean and 90th percentile over time of what each engine step ran: the running batch as Little's law
    counts it, not per step (steps are not equally long; a long prefill step weighs its seconds).

    vLLM reports a step's scheduler state when the step ends, so ``values[i]`` held from the report
    before it (``start`` for the first) to ``times[i]``.
    """
    if not values:
        return None, None
    durations = np.diff(np.concatenate([[min(start, times[0])], np.asarray(times, dtype=float)]))
    if durations.sum() <= 0:
        return float(np.mean(values)), float(np.percentile(values, 90))
    order = np.argsort(values, kind="stable")
    sorted_values = np.asarray(values, dtype=float)[order]
    cumulative = np.cumsum(durations[order]) / durations.sum()
    p90 = float(sorted_values[np.searchsorted(cumulative, 0.9)])
    return float(np.average(values, weights=durations)), p90


def trend(x: Sequence[float], y: Sequence[float], alpha: float = SATURATION_ALPHA) -> tuple[float, float] | None:
    """Least-squares slope of y on x and the lower end of its one-sided ``1 - alpha`` interval (Student's t
    on n - 2 degrees of freedom); None with fewer than three points or no spread in x.

    A trend is judged by that lower end, so that a slope the noise of a few points could make is not
    read as a growing queue. (Successive engine steps are correlated, which makes the interval of the
    waiting queue's slope narrower than it should be; its threshold, a share of the offered rate, is
    what guards it.)
    """
    if len(x) < 3 or max(x) - min(x) <= 0:
        return None
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    slope, intercept = np.polyfit(xs, ys, 1)
    residual = ys - (slope * xs + intercept)
    error = math.sqrt(float(residual @ residual) / (len(xs) - 2) / float(((xs - xs.mean()) ** 2).sum()))
    # Past a thousand degrees of freedom t is the normal to four digits, and its quantile's cost grows with df.
    return float(slope), float(slope) - distributions.student_t_quantile(1.0 - alpha, min(len(xs) - 2, 1000)) * error


def completions(m: ServingMeasurement, shuffles: int = SHUFFLES) -> tuple[float | None, float | None, float]:
    """The measured requests' completion rate over the send span shifted by their median E2E; the
    one-sided p-value of so few completions were each request's E2E unrelated to when it was sent; and
    the shift (seconds).

    A request sent in the span completes one E2E later: below saturation, the completions inside
    ``(first send + median E2E, last send + median E2E]`` are the arrivals inside the span, whatever the
    E2E, so the rate matches the offered one (over the unshifted span it would miss every request
    still in flight as the span closes, about rate x E2E of them, once the warm-up no longer fills the
    engine as the span opens). Past saturation each request waits longer than the one before, the late
    ones complete past the shifted window, and the rate reads the engine's own. Near the window's edges
    a request with an E2E far from the median falls out of it, so the count is compared with the same
    count over the requests' E2Es shuffled among them (what the run would show if latency did not grow
    with time): the p-value is the share of shuffles with as few completions. Where every measured
    request went out at once the window runs to the last token (:func:`window`), unshifted, with no
    p-value. (None, None, 0) with fewer than two measured requests that completed, or no window.
    """
    sent, e2e = [], []
    for r in _measured(m):
        if r.chunk_s:
            sent.append(r.sent_s)
            e2e.append(r.chunk_s[-1] - r.sent_s)
    start, end = window(m)
    if len(sent) < 2 or end <= start:
        return None, None, 0.0
    sends, latencies = np.asarray(sent), np.asarray(e2e)
    if max(r.sent_s for r in _measured(m)) <= start:  # all at once: the window is the burst's own
        return int(((sends + latencies) <= end).sum()) / (end - start), None, 0.0
    shift = float(np.median(latencies))
    low, high = start + shift, end + shift

    def inside(done: np.ndarray) -> np.ndarray:
        return ((done > low) & (done <= high)).sum(axis=-1)

    observed = int(inside(sends + latencies))
    shuffled = np.random.default_rng(0).permuted(np.tile(latencies, (shuffles, 1)), axis=1)
    as_few = int((inside(sends + shuffled) <= observed).sum())
    return observed / (end - start), (1 + as_few) / (1 + shuffles), shift


def saturation(offered: float | None, achieved: float | None, queue_growth: tuple[float, float] | None,
               ttft_slope: tuple[float, float] | None, closed_loop: bool = False,
               completions_p: float | None = None, alpha: float = SATURATION_ALPHA) -> str | None:
    """Why a serving run is saturated, in words; None when it keeps up with its load.

    Three readings, each held to :data:`SATURATED_SHARE` and each significant at ``alpha``:
    completions (:func:`completions`) slower than that share of the realised offered rate, with a
    p-value (``completions_p``) below ``alpha``; vLLM's waiting queue growing by more than the rest of
    it (``queue_growth``: requests a second, and the lower end of its interval, :func:`trend`); each
    request's TTFT climbing with when it was sent by more than ``1 / SATURATED_SHARE - 1`` seconds a
    second (``ttft_slope``, likewise). A trend is judged by its interval's lower end. All at once (an
    infinite offered rate) is saturated by construction: every request but the first queues. A closed
    loop (``closed_loop``: rate ``inf`` under ``load.max_concurrency``) is not: its requests wait for a
    slot on the client's side, where ``wait_to_send_s_*`` shows it, and it is read by the same three
    tests against what its slots let through (``offered``: its sends after the first burst), never
    against the infinite rate it names.
    """
    if offered is not None and math.isinf(offered) and not closed_loop:
        return "every request sent at once"
    reasons = []
    # A closed loop whose measured requests all fit its slots went out at once: no rate to fall behind.
    offered = offered if offered is not None and math.isfinite(offered) else None
    if offered and achieved is not None and achieved < SATURATED_SHARE * offered \
            and (completions_p is None or completions_p < alpha):
        significance = f", p = {completions_p:.3f}" if completions_p is not None else ""
        reasons.append(f"completions {achieved:.2f} req/s behind the {offered:.2f} req/s offered{significance}")
    if offered and queue_growth is not None and queue_growth[1] > (1.0 - SATURATED_SHARE) * offered:
        reasons.append(f"vLLM's waiting queue grew {queue_growth[0]:.2f} requests/s (at least {queue_growth[1]:.2f})")
    if ttft_slope is not None and ttft_slope[1] > 1.0 / SATURATED_SHARE - 1.0:
        reasons.append(f"TTFT grew {ttft_slope[0]:.2f} s per s of arrivals (at least {ttft_slope[1]:.2f})")
    return "; ".join(reasons) or None


def closed_loop_sends(m: ServingMeasurement, max_concurrency: int) -> list[float]:
    """A closed loop's sends after its first burst: the measured requests' sends, sorted, from the last
    of the first ``max_concurrency`` on. The burst that fills the slots at the start goes out at once
    whatever the engine does; only the sends after it, each let go by a completion, pace the loop."""
    sends = sorted(r.sent_s for r in _measured(m))
    return sends[max(0, min(max_concurrency, len(sends)) - 1):]


def cell_columns(m: ServingMeasurement, load: Mapping[str, Any], plan: ServingPlan | None = None) -> dict[str, Any]:
    """A serving cell's own columns (:data:`CELL_COLUMNS`, the saturation test, the arrival seed, the
    running-batch series) for one engine run."""
    measured = _measured(m)
    start, end = window(m)
    span = end - start
    closed = is_closed_loop(load.get("request_rate"), load.get("max_concurrency"))
    # A closed loop's offered load is what its slots let through after the burst that fills them (its
    # sends), not its schedule (all at 0).
    offered = realised_rate(closed_loop_sends(m, int(load["max_concurrency"])) if closed else _arrivals(m))
    achieved, achieved_p, shift = completions(m)
    itl = [gap for r in measured for gap in request_latencies(r)[3]]
    queues = [r.queue_s for r in measured if r.queue_s is not None]
    tpots = [t for t in (request_latencies(r)[1] for r in measured) if t is not None]
    slo = {k: v for k, v in (load.get("slo") or {}).items() if v is not None}
    met = sum(meets_slo(r, slo) for r in measured) if slo else None
    attainment = met / len(measured) if met is not None else None
    low, high = wilson(met, len(measured)) if met is not None else (None, None)
    times, running = running_batch(m)
    mean, p90 = time_weighted(times, running, start)
    inside = [s for s in m.steps if start <= s.at_s <= end]
    queue_growth = trend([s.at_s for s in inside], [s.waiting for s in inside])
    sent = [(r.sent_s, request_latencies(r)[0]) for r in measured]
    ttft_slope = trend([s for s, t in sent if t is not None], [t for _, t in sent if t is not None])
    # The tokens streamed over the window the completions are counted in: the engine's output rate under the load.
    tokens = sum(n for r in m.requests for t, n in zip(r.chunk_s, r.chunk_tokens)
                 if start + shift <= t <= end + shift)
    reason = saturation(offered, achieved, queue_growth, ttft_slope, closed_loop=closed, completions_p=achieved_p)
    waits = arrival_waits(m)
    server_acceptance, server_note = metrics_cross_check(m)
    return {
        "load_request_rate": float(load["request_rate"]),
        "load_burstiness": float(load["burstiness"]),
        "load_max_concurrency": load.get("max_concurrency"),
        "load_warmup_requests": m.warmup_requests,
        "load_ignore_eos": bool(load.get("ignore_eos", False)),
        "arrival_seed": plan.arrival_seed if plan is not None else None,
        "engine_usage_context": USAGE_CONTEXT,
        "load_via": load.get("via", "inprocess"),
        "server_metrics_acceptance": server_acceptance,
        "server_metrics_note": server_note,
        "offered_rate_realised": offered,
        "served_requests": len(measured),
        "serving_window_s": span,
        "achieved_request_rate": achieved,
        "achieved_output_tokens_per_s": tokens / span if span > 0 else None,
        "slo_met_requests": met,
        "slo_attainment": attainment,
        "slo_attainment_ci_low": low,
        "slo_attainment_ci_high": high,
        "goodput": attainment * achieved if attainment is not None and achieved is not None else None,
        **timings.latency_percentiles(itl, "itl_s"),
        **timings.latency_percentiles(queues, "queue_s"),
        "queue_s_mean": statistics.fmean(queues) if queues else None,
        "tpot_s_request_mean": statistics.fmean(tpots) if tpots else None,
        "tpot_s_std": statistics.pstdev(tpots) if tpots else None,
        "queue_growth_per_s": queue_growth[0] if queue_growth else None,
        "ttft_slope": ttft_slope[0] if ttft_slope else None,
        "saturated": reason is not None,
        "saturation_reason": reason,
        "running_batch_mean": mean,
        "running_batch_p90": p90,
        "running_batch_max": max(running) if running else None,
        "running_batch_t_s": [t - start for t in times],
        "running_batch": running,
        # A closed loop's requests all "arrive" at 0: their waits and E2E from it grow with the requests
        # sent, not with anything the system did, so a closed loop leaves them empty.
        **_percentiles([] if closed else [w for w, _ in waits], "wait_to_send_s"),
        **_percentiles([] if closed else [e for _, e in waits if e is not None], "e2e_from_arrival_s"),
    }


def metrics_cross_check(m: ServingMeasurement) -> tuple[float | None, str | None]:
    """The server's ``/metrics`` acceptance over the measured requests (``m.server_counters``), and a note
    where it disagrees with their own counts beyond :data:`METRICS_TOLERANCE`; (None, None) in process,
    without speculation, or where nothing drafted in the window."""
    window = m.server_counters
    if window is None or window.drafts <= 0:
        return None, None
    server = 1.0 + window.accepted_tokens / window.drafts
    measured = _measured(m)
    if any(r.drafts is None for r in measured):
        return server, None  # the window is the cell's acceptance itself (as_measurement): nothing to check
    drafts, accepted = sum(r.drafts or 0 for r in measured), sum(r.accepted_tokens or 0 for r in measured)
    own = 1.0 + accepted / drafts if drafts else None
    if own is not None and abs(own - server) <= METRICS_TOLERANCE:
        return server, None
    return server, (f"the server's /metrics over the measured requests read acceptance {server:.3f} "
                    f"({window.accepted_tokens} accepted in {window.drafts} drafts), their own usage chunks "
                    + (f"{own:.3f} ({accepted} in {drafts})" if own is not None else "no drafts"))


def as_measurement(m: ServingMeasurement, plan: ServingPlan) -> Measurement:
    """The serving cell as the offline columns read it: one "repetition" that is the measured window.

    Latencies are the client's (:func:`request_latencies`). Acceptance counts the measured requests
    alone, drafts, drafted tokens and accepted tokens each from the request's own speculative counts
    (an engine step's counts would mix in the warm-up's and the requests in flight around the window);
    where a request came without its own (a server that sent none), the engine's counters over the measured
    requests' lifetime (``m.counters``).
    Token ids cover every request sent, warm-up included, so the exactness check covers them all.
    """
    measured = _measured(m)
    start, end = window(m)
    generated = [GeneratedRequest(r.token_ids, *_ttft_e2e_tpot(r), drafts=r.drafts, accepted_tokens=r.accepted_tokens,
                                  last_accepted=r.last_accepted) for r in measured]
    width = max((len(r.accepted_histogram) - 1 for r in measured), default=0)
    accepted_per_pos = tuple(sum(sum(r.accepted_histogram[j] for j in range(p + 1, len(r.accepted_histogram)))
                                 for r in measured) for p in range(width))
    truncated_per_pos: tuple[int, ...] = ()
    for g in generated:
        cut = g.truncated_per_position()
        truncated_per_pos = tuple(
            (truncated_per_pos[i] if i < len(truncated_per_pos) else 0) + (cut[i] if i < len(cut) else 0)
            for i in range(max(len(truncated_per_pos), len(cut))))
    drafted = [0] * max((max(r.drafted_per_step, default=0) for r in measured), default=0)
    for r in measured:
        for n in r.drafted_per_step:
            for i in range(n):
                drafted[i] += 1
    counters = m.counters if m.counters is not None else SpecCounters(
        drafts=sum(g.drafts or 0 for g in generated),
        draft_tokens=sum(r.draft_tokens or 0 for r in measured),
        accepted_tokens=sum(g.accepted_tokens or 0 for g in generated),
        accepted_per_pos=accepted_per_pos,
        drafted_per_pos=tuple(drafted),
    )
    steps = [s for s in m.steps if start <= s.at_s <= end]
    with_tpot = [g for g in generated if g.tpot_s is not None]
    return Measurement(
        rep_wall_s=[end - start],
        rep_output_tokens=[sum(len(r.token_ids) for r in measured)],
        prompt_tokens=sum(len(p) for p in plan.prompts[m.warmup_requests:]),
        token_ids=[r.token_ids for r in m.requests],
        outputs_stable=True,
        counters=counters,
        ttft_s=[g.ttft_s for g in generated if g.ttft_s is not None],
        tpot_s=[g.tpot_s for g in with_tpot],
        e2e_s=[g.e2e_s for g in generated if g.e2e_s is not None],
        request_acceptance=[g.acceptance_length for g in generated],
        request_decode_passes=[g.decode_passes for g in generated],
        decode_s=sum(g.tpot_s * (len(g.token_ids) - 1) for g in with_tpot),
        decode_tokens=sum(len(g.token_ids) - 1 for g in with_tpot),
        truncated_accepted=sum(g.truncated_accepted for g in generated),
        truncated_per_pos=truncated_per_pos,
        reached_concurrency=max((s.running for s in steps), default=None),
    )


def _ttft_e2e_tpot(request: ServedRequest) -> tuple[float | None, float | None, float | None]:
    ttft, tpot, e2e, _ = request_latencies(request)
    return ttft, e2e, tpot


def is_serving_row(row: Mapping[str, Any]) -> bool:
    """Whether a results row is a serving cell's."""
    return row.get("load_request_rate") is not None


def load_shape(row: Mapping[str, Any]) -> LoadShape:
    """A serving row's load shape (:class:`specbench.load.LoadShape`) from its load columns; a column that is
    null (a row stored before it, or a failed cell) reads as the default: no cap, Poisson, in process."""
    cap, burstiness, via = row.get("load_max_concurrency"), row.get("load_burstiness"), row.get("load_via")
    known = [v is not None and not (isinstance(v, float) and math.isnan(v)) for v in (cap, burstiness, via)]
    return LoadShape(int(cap) if known[0] else None, float(burstiness) if known[1] else 1.0,
                     str(via) if known[2] else "inprocess")


def with_serving_comparison(
    rows: list[dict[str, Any]], cells_dir: Path, cell_ids: Iterable[str],
) -> list[dict[str, Any]]:
    """Merged rows with every serving cell's figures over its engine runs and its speedups against its baseline.

    ``cell_ids``: the engine runs the sweep planned (its plan.json), the only cell files read. Per-cell
    figures are medians over the engine runs (the running-batch series is engine run 0's); SLO
    attainment pools the engine runs' requests, with Wilson's interval; a cell is saturated where any
    engine run of it was, and a speculative cell where its baseline was. Speedups compare each engine
    run with its own baseline engine run, then combine as in :mod:`specbench.stats`, the spread pooled
    per regime (:data:`REGIMES`); a cell whose engine runs disagree on the E2E p50 speedup beyond the
    other cells' spread is flagged. A run with zero goodput on either side leaves the cell's goodput
    speedup empty, named in ``serving_goodput_note``. A cell pays at its rate by :func:`pays`.
    Offline rows are returned unchanged.
    """
    serving = [r for r in rows if is_serving_row(r)]
    if not serving:
        return rows
    runs = _cell_runs(cells_dir, cell_ids)
    for row in serving:
        _combine_runs(row, runs.get(row["config_hash"], []))
    by_cell = {r["cell_id"]: r for r in serving}
    for row in serving:
        base = by_cell.get(row.get("baseline_cell_id") or "")
        if row.get("method") != "baseline" and base is not None and base.get("saturated"):
            row["saturated"] = True
            row["saturation_reason"] = "; ".join(
                filter(None, [row.get("saturation_reason"), f"baseline: {base.get('saturation_reason')}"]))
    by_id = {r["cell_id"]: r for group in runs.values() for r in group}
    # Per speedup, per cell: engine run (its baseline's engine instance) -> ratio, and the cell's engine instances.
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    engines: dict[str, list[str]] = {}
    for row in serving:
        if row.get("method") == "baseline":
            continue
        zero = []
        for name in SPEEDUPS:
            per_run: dict[str, float] = {}
            for run in runs.get(row["config_hash"], []):
                base = by_id.get(run.get("baseline_cell_id") or "")
                ratio = run_speedup(base, run, name)
                if ratio is not None and base is not None:
                    per_run[engine_instance(base)] = ratio
                    engines.setdefault(row["cell_id"], []).append(engine_instance(run))
                elif name == "goodput" and (side := _zero_goodput(base, run)):
                    zero.append(f"engine run {run.get('engine_run') or 0}: {side}")
            if name == "goodput" and zero:
                row["serving_goodput_note"] = "goodput 0 in " + ", ".join(zero) + ": no goodput speedup"
                continue
            if per_run:
                ratios.setdefault(name, {})[row["cell_id"]] = per_run
    tests = disagreement_tests(r for r in rows if not is_serving_row(r)) + sum(
        len(per_run) > 1 for per_run in ratios.get(PAYS_ON, {}).values())
    for name, cells in ratios.items():
        for cell_id, per_run in cells.items():
            row = by_cell[cell_id]
            regime = bool(row.get("saturated"))
            peers = [c for c in cells if bool(by_cell[c].get("saturated")) == regime]
            spread, pool = _spread(cells, engines, peers), REGIMES[regime]
            if not spread.df:
                spread, pool = _spread(cells, engines, list(cells)), "every rate (too few engine runs per regime)"
            others = _spread(cells, engines, [c for c in peers if c != cell_id])
            # The "engine runs disagree" family is one over the sweep, offline cells and serving alike.
            interval = intervals.speedup_interval(list(per_run.values()), spread, None, cells=max(tests, 1),
                                              others=others if others.df else None, flag_alpha=FAMILY_ALPHA)
            row[f"serving_speedup_{name}"] = interval.point
            row[f"serving_speedup_{name}_ci_low"] = interval.ci_low
            row[f"serving_speedup_{name}_ci_high"] = interval.ci_high
            if name == PAYS_ON:
                row["serving_speedup_ci_method"] = f"{interval.method}, spread pooled {pool}"
                if interval.engine_runs_disagree:
                    row["flag_reasons"] = list(row.get("flag_reasons") or []) + [
                        "serving engine runs disagree on the E2E p50 speedup: "
                        + ", ".join(f"{r:.2f}x" for r in per_run.values())
                        + f" (beyond the other serving cells' engine-to-engine spread {pool}, "
                        f"at {FAMILY_ALPHA:g} Bonferroni over {tests} cells)"]
                    row["flagged"] = True
    for row in serving:
        if row.get(f"serving_speedup_{PAYS_ON}") is not None:
            row["serving_pays"] = pays(row)
    return rows


def _combine_runs(row: dict[str, Any], mine: list[dict[str, Any]]) -> None:
    """A merged serving row's own figures from its engine runs (see :func:`with_serving_comparison`)."""
    for column in CELL_COLUMNS:
        known = [r[column] for r in mine if r.get(column) is not None]
        if known and isinstance(known[0], (int, float)) and not isinstance(known[0], bool):
            row[column] = statistics.median(known)
    if not mine:
        return
    row["running_batch_t_s"], row["running_batch"] = mine[0].get("running_batch_t_s"), mine[0].get("running_batch")
    # One seed per engine run: the merged row's single arrival_seed would be engine run 0's alone.
    row["arrival_seed"], row["arrival_seeds"] = None, [r.get("arrival_seed") for r in mine]
    row["offered_rate_realised_per_engine_run"] = [r.get("offered_rate_realised") for r in mine]
    counted = [r for r in mine if r.get("slo_met_requests") is not None and r.get("served_requests")]
    if counted:
        met, n = sum(r["slo_met_requests"] for r in counted), sum(r["served_requests"] for r in counted)
        row["slo_met_requests"], row["slo_attainment"] = met, met / n
        row["slo_attainment_ci_low"], row["slo_attainment_ci_high"] = wilson(met, n)
    saturated = [(r.get("engine_run") or 0, r.get("saturation_reason")) for r in mine if r.get("saturated")]
    row["saturated"] = bool(saturated)
    row["saturation_reason"] = "; ".join(f"engine run {run}: {why}" for run, why in saturated) or None
    notes = [(r.get("engine_run") or 0, r.get("server_metrics_note")) for r in mine if r.get("server_metrics_note")]
    row["server_metrics_note"] = "; ".join(f"engine run {run}: {note}" for run, note in notes) or None


def _spread(cells: Mapping[str, Mapping[str, float]], engines: Mapping[str, Sequence[str]],
            chosen: Sequence[str]) -> spreads.EngineRunSpread:
    """The engine-to-engine spread pooled over the ``chosen`` cells' per-run ratios (each keyed by its
    baseline's engine instance): one engine serves every rate of its configuration in an engine run, so
    its cells repeat its deviations, and cells whose baselines shared an instance share its deviation."""
    return spreads.engine_run_spread([cells[c] for c in chosen],
                                   engines=[tuple(dict.fromkeys(engines[c])) for c in chosen],
                                   baselines=engine_groups([list(cells[c]) for c in chosen]))


def _zero_goodput(base: Mapping[str, Any] | None, cell: Mapping[str, Any]) -> str | None:
    """Which side of one engine run's comparison had no request meeting the SLOs; None if neither."""
    if base is None or base.get("status") != "ok" or cell.get("status") != "ok":
        return None
    sides = [side for side, row in (("baseline", base), ("speculative", cell)) if row.get("goodput") == 0]
    return " and ".join(sides) or None


def run_speedup(base: Mapping[str, Any] | None, cell: Mapping[str, Any], name: str) -> float | None:
    """One engine run's speedup ``name`` (a key of :data:`SPEEDUPS`) against its baseline at the same
    load; None where either side failed or lacks the figure (a zero goodput: see :func:`_zero_goodput`)."""
    if base is None or base.get("status") != "ok" or cell.get("status") != "ok":
        return None
    column, higher_better = SPEEDUPS[name]
    b, c = base.get(column), cell.get(column)
    if not b or not c or not (math.isfinite(b) and math.isfinite(c)):
        return None
    return c / b if higher_better else b / c


def _cell_runs(cells_dir: Path, cell_ids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """The planned serving cells' files (each engine run's), grouped by config hash; a file another
    sweep left in the directory is not read."""
    found: dict[str, list[dict[str, Any]]] = {}
    for cell_id in cell_ids:
        path = CellFiles(cells_dir, cell_id).row
        if not path.exists():
            continue
        try:
            row = read_rows(path)[0]
        except (ResultsError, IndexError):
            continue
        if is_serving_row(row):
            found.setdefault(row.get("config_hash") or row["cell_id"], []).append(row)
    for group in found.values():
        group.sort(key=lambda r: r.get("engine_run") or 0)
    return found


def pays(row: Mapping[str, Any]) -> bool:
    """Whether a serving cell pays at its rate: the one rule of the verdicts, on the E2E p50 speedup."""
    return intervals.clears(row[f"serving_speedup_{PAYS_ON}"], row.get(f"serving_speedup_{PAYS_ON}_ci_low"),
                        row.get(f"serving_speedup_{PAYS_ON}_ci_high"))


def offline_beside_serving(offline: Sequence[Mapping[str, Any]], served: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each speculative serving cell beside the offline cell of its configuration and workload at the batch
    size nearest (on a log scale) to the mean running batch its load induced, with the model's figure for each.

    The offline figure is the decode speedup (the ratio of TPOTs, which the batch size decides), held
    against the serving TPOT p50 speedup; None where no offline cell of that configuration was measured.
    """
    table = []
    for row in served:
        batch = row.get("running_batch_mean")
        if row.get("method") == "baseline" or row.get(f"serving_speedup_{PAYS_ON}") is None or not batch:
            continue
        peers = [o for o in offline if o.get("method_label") == row.get("method_label")
                 and o.get("workload") == row.get("workload") and o.get("decode_speedup") is not None]
        peer = min(peers, key=lambda o: abs(math.log(o["batch_size"] / batch)), default=None)
        table.append({
            "workload": row.get("workload"), "config": row.get("method_label"),
            "request_rate": row.get("load_request_rate"), "running_batch_mean": batch,
            "serving_tpot_speedup": row.get("serving_speedup_tpot_p50"),
            "serving_predicted": row.get("serving_predicted_speedup"),
            "offline_batch": peer and peer["batch_size"],
            "offline_decode_speedup": peer and peer["decode_speedup"],
            "offline_predicted": peer and peer.get("predicted_decode_speedup"),
            # A flagged or mismatched serving cell stays in the table but out of any verdict drawn from it.
            "left_out": bool(row.get("flagged")) or row.get("exactness") == "mismatch",
        })
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m specbench.results.serving OFFLINE SERVING``: the offline speedup at the batch size each
    rate induced beside the serving speedup at that rate, and what the model predicts for both."""
    import argparse

    import pandas as pd

    from specbench.results.schema import ResultsError, results_path

    parser = argparse.ArgumentParser(prog="python -m specbench.results.serving", description=main.__doc__)
    parser.add_argument("offline", help="an offline sweep directory (or its results.parquet)")
    parser.add_argument("serving", help="a serving sweep directory (or its results.parquet)")
    args = parser.parse_args(argv)
    try:
        offline_rows, served_rows = read_rows(results_path(args.offline)), read_rows(results_path(args.serving))
    except ResultsError as exc:  # a damaged file, another program's, or none: one line naming it
        print(f"error: {exc}", file=sys.stderr)
        return 2
    offline = [r for r in offline_rows if not is_serving_row(r) and r.get("status") == "ok"]
    served = [r for r in served_rows if is_serving_row(r) and r.get("status") == "ok"]
    table = offline_beside_serving(offline, served)
    if not table:
        print("no speculative serving cell compared with its baseline", file=sys.stderr)
        return 1
    print(pd.DataFrame(table).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
