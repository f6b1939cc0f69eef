"""Summaries of one timing (wall time, tokens/s, latency): within one engine, its repetitions' median with a
distribution-free order-statistic interval whose exact coverage is stated (:func:`summarize`); across engine runs,
each run counted once (:func:`engine_run_interval`); and latency percentiles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specbench.stats._inputs import _check_confidence, _confidence_tag, _finite_array
from specbench.stats.distributions import student_t_quantile


@dataclass(frozen=True)
class Summary:
    """A point estimate with its confidence interval and spread.

    Attributes:
        median: median of the values (numpy's median: the mean of the two
            middle values when their count is even).
        ci_low: lower end of the interval for the median; None with one value.
        ci_high: upper end of the interval for the median; None with one value.
        cv: coefficient of variation, sample standard deviation (ddof=1)
            divided by the mean; None with fewer than 2 values or a zero mean.
        n: number of values summarised.
        coverage: the interval's exact coverage (:func:`median_interval`),
            which falls short of the confidence asked for when there are too
            few values; None without an interval.
        method: ``"order-statistic-<coverage %>"``, or ``"none"`` (one value).
    """

    median: float
    ci_low: float | None
    ci_high: float | None
    cv: float | None
    n: int
    coverage: float | None
    method: str


def _cv(array: np.ndarray) -> float | None:
    if array.size < 2:
        return None
    mean = float(np.mean(array))
    if mean == 0.0:
        return None
    return float(np.std(array, ddof=1)) / mean


def percentile(values: Sequence[float], q: float) -> float | None:
    """Return the q-th percentile of values, or None when values is empty.

    Uses linear interpolation between the closest ranks (numpy's default
    ``"linear"`` method, Hyndman and Fan type 7): with the values sorted as
    x[0..n-1], the result is x[i] + f (x[i+1] - x[i]) where i + f =
    q/100 (n-1). So q=0 gives the minimum, q=100 the maximum, and a single
    value is every percentile of itself.

    Raises:
        ValueError: if q lies outside [0, 100] (or is NaN), or a value is
            not finite.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must lie in [0, 100], got {q}")
    array = _finite_array(values, "values")
    if array.size == 0:
        return None
    return float(np.percentile(array, q))


def latency_percentiles(values: Sequence[float], prefix: str) -> dict[str, float | None]:
    """Return the 50th, 90th and 99th percentiles of values under prefixed keys.

    Keys are ``f"{prefix}_p50"``, ``f"{prefix}_p90"`` and ``f"{prefix}_p99"``;
    each value is :func:`percentile` of values at that q, so all three are
    None when values is empty.
    """
    return {f"{prefix}_p{q}": percentile(values, q) for q in (50, 90, 99)}


def median_interval(values: Sequence[float], *, confidence: float = 0.95) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median, from order statistics, with its exact coverage.

    With the n values sorted as x(1) <= ... <= x(n), the interval
    [x(j), x(n+1-j)] holds the true median with probability
    1 - 2 P(Bin(n, 1/2) < j) for any continuous distribution of the values.
    The narrowest such interval whose coverage reaches ``confidence`` is
    returned as ``(low, high, coverage)``. Few values cannot reach a high
    confidence: the widest interval, [min, max], covers the median only with
    probability 1 - 2^(1-n) (75% for n = 3, 93.75% for n = 5), and that is
    the coverage returned then, so a caller labels it honestly instead of
    calling it 95% (a percentile bootstrap of a median of 3 gives that same
    [min, max] and calls it 95%). None for fewer than two values: one value
    has no interval.

    Raises:
        ValueError: on non-finite values or confidence outside (0, 1).
    """
    _check_confidence(confidence)
    array = np.sort(_finite_array(values, "values"))
    n = int(array.size)
    if n < 2:
        return None
    # below[j] = P(Bin(n, 1/2) < j), built up exactly in integers.
    j, below, coverage = 1, math.comb(n, 0), 1.0 - 2.0 * math.comb(n, 0) / 2**n
    while j + 1 <= n // 2:
        wider = 1.0 - 2.0 * (below + math.comb(n, j)) / 2**n
        if wider < confidence:
            break
        below += math.comb(n, j)
        j, coverage = j + 1, wider
    return float(array[j - 1]), float(array[n - j]), coverage


def summarize(values: Sequence[float], *, confidence: float = 0.95) -> Summary:
    """Summarise timed repetitions: median, order-statistic interval of the median, CV.

    The interval is :func:`median_interval` at ``confidence``; its exact
    coverage is kept in ``coverage`` and named in ``method``
    (``"order-statistic-75"`` for three repetitions). A single value gives
    no interval (``ci_low`` and ``ci_high`` None, method ``"none"``): a
    zero-width interval would claim a precision nobody measured. cv is the
    sample standard deviation (ddof=1) over the mean, None with fewer than 2
    values or a zero mean.

    Raises:
        ValueError: on empty input, non-finite values or confidence outside
            (0, 1).
    """
    _check_confidence(confidence)
    array = _finite_array(values, "values")
    if array.size == 0:
        raise ValueError("values must not be empty")
    median = float(np.median(array))
    interval = median_interval(array.tolist(), confidence=confidence)
    if interval is None:
        return Summary(median=median, ci_low=None, ci_high=None, cv=None, n=1, coverage=None, method="none")
    low, high, coverage = interval
    return Summary(
        median=median,
        ci_low=low,
        ci_high=high,
        cv=_cv(array),
        n=int(array.size),
        coverage=coverage,
        method=f"order-statistic-{_confidence_tag(round(coverage, 3))}",
    )


@dataclass(frozen=True)
class EngineRunSummary:
    """A timing measured in one or more engine runs: point estimate and interval.

    Attributes:
        point: with several engine runs, the geometric mean of the runs'
            medians; with one, the median of its repetitions.
        ci_low: lower end of the interval; None when there is none.
        ci_high: upper end of the interval; None when there is none.
        coverage: the confidence the interval is built for (several engine
            runs), or the order-statistic interval's exact coverage (one
            engine run, :func:`median_interval`); None without an interval.
        method: ``"clustered-t-log-<conf>"``, ``"order-statistic-<coverage %>"``
            (one engine run), or a tag starting with ``"none"``.
    """

    point: float
    ci_low: float | None
    ci_high: float | None
    coverage: float | None
    method: str


def engine_run_interval(values_by_run: Sequence[Sequence[float]], *, confidence: float = 0.95) -> EngineRunSummary:
    """Centre and interval of a positive timing (wall time, tokens/s) from the repetitions of each engine run.

    Repetitions of one engine run share its engine and the machine's state
    while it ran, so they are one cluster, not independent draws: pooled as
    if independent, two engine runs of three repetitions get the [min, max]
    of six values, labelled 96.9%, which covers the true median far less
    often once engines differ from start to start (about 62% when engines
    spread by 10% and repetitions by 2%). So each engine run counts once, as
    for the speedup (:func:`speedup_interval`): its median (robust to the odd
    slow repetition) is one observation, and with n engine runs whose log
    medians have mean m and standard deviation s the interval is
    ``exp(m +- t_(n-1) s / sqrt(n))`` around the point exp(m), the geometric
    mean of the medians. That makes the merged timings agree with the
    merged speedup, the geometric mean of the per-run ratios: a baseline's
    point over a cell's is the speedup when their engine runs pair up.

    One engine run: only its repetitions are known; the interval is their
    order-statistic interval (:func:`summarize`) with its exact coverage, and
    it says nothing about engine-to-engine variation. Several engine runs
    with identical medians: no interval (a zero-width one would claim a
    precision nobody measured).

    Raises:
        ValueError: without a value, with an empty engine run, or on values
            that are not finite and positive.
    """
    _check_confidence(confidence)
    if not values_by_run or any(len(values) == 0 for values in values_by_run):
        raise ValueError(f"every engine run needs a value, got {[len(v) for v in values_by_run]}")
    if len(values_by_run) == 1:
        single = summarize(values_by_run[0], confidence=confidence)
        return EngineRunSummary(single.median, single.ci_low, single.ci_high, single.coverage, single.method)
    medians = [float(np.median(_finite_array(values, "values"))) for values in values_by_run]
    if any(m <= 0 for m in medians):
        raise ValueError(f"timings must be positive, got medians {medians}")
    logs = np.log(medians)
    center = float(logs.mean())
    spread = float(np.std(logs, ddof=1))
    if spread == 0.0:
        return EngineRunSummary(math.exp(center), None, None, None, "none: engine runs agree exactly")
    half = student_t_quantile((1.0 + confidence) / 2.0, logs.size - 1) * spread / math.sqrt(logs.size)
    return EngineRunSummary(
        point=math.exp(center),
        ci_low=math.exp(center - half),
        ci_high=math.exp(center + half),
        coverage=confidence,
        method=f"clustered-t-log-{_confidence_tag(confidence)}",
    )
