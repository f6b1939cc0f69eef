"""Small, pure statistics for summarising timed repetitions and independent passes.

Two kinds of spread are summarised here:

- within one engine, repeated timings of the same cell (:func:`summarize`:
  median with a percentile-bootstrap interval, robust to the odd slow
  repetition);
- between independent passes, the paired speedup ratios, one per pass
  (:func:`ratio_summary`: a Student t interval on the log ratios, because
  ratios are multiplicative and passes are few).

Everything here is deterministic: the bootstrap draws from a seeded
``numpy.random.default_rng``, and the t quantile is computed exactly for
integer degrees of freedom, so the module needs neither scipy nor pandas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

__all__ = [
    "PassSpread",
    "SpeedupInterval",
    "Summary",
    "bootstrap_median_ci",
    "latency_percentiles",
    "percentile",
    "pooled_pass_spread",
    "repeated_ngram_share",
    "speedup_interval",
    "student_t_quantile",
    "summarize",
]


@dataclass(frozen=True)
class Summary:
    """A point estimate with its confidence interval and spread.

    Attributes:
        median: median of the values (numpy's median: the mean of the two
            middle values when their count is even).
        ci_low: lower end of the confidence interval.
        ci_high: upper end of the confidence interval.
        cv: coefficient of variation, sample standard deviation (ddof=1)
            divided by the mean; None with fewer than 2 values or a zero mean.
        n: number of values summarised.
        method: short tag naming how the interval was made, e.g.
            ``"bootstrap-percentile-95"``, ``"t-log-95"``,
            ``"t-log-95+within"`` or ``"single"`` (one value, zero width).
    """

    median: float
    ci_low: float
    ci_high: float
    cv: float | None
    n: int
    method: str


def _finite_array(values: Sequence[float], name: str) -> np.ndarray:
    """Return values as a 1-D float array, rejecting NaN and infinities.

    A NaN timing is a broken measurement; letting it through would turn
    every summary into NaN far from where the fault happened.
    """
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite, got {array.tolist()}")
    return array


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")


def _confidence_tag(confidence: float) -> str:
    # "%g" turns 0.95 into "95" and 0.975 into "97.5", hiding float noise.
    return f"{confidence * 100:g}"


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


def bootstrap_median_ci(
    values: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Return a percentile-bootstrap confidence interval for the median.

    Draws ``resamples`` samples of size n from values with replacement
    (``numpy.random.default_rng(seed)``), takes the median of each, and
    returns the ``(1 - confidence)/2`` and ``(1 + confidence)/2`` percentiles
    of those medians (linear interpolation, as in :func:`percentile`). The
    result is the same for the same values, seed and numpy version. One value
    gives (v, v); identical values give a zero-width interval.

    Memory is O(resamples x n): meant for repetitions (tens of values), not
    for raw per-request latencies.

    Raises:
        ValueError: on empty input, non-finite values, confidence outside
            (0, 1) or resamples < 1.
    """
    _check_confidence(confidence)
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    array = _finite_array(values, "values")
    if array.size == 0:
        raise ValueError("values must not be empty")
    if array.size == 1:
        return float(array[0]), float(array[0])
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, array.size, size=(resamples, array.size))
    medians = np.median(array[indices], axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.percentile(medians, [100.0 * tail, 100.0 * (1.0 - tail)])
    return float(low), float(high)


def summarize(values: Sequence[float], *, confidence: float = 0.95, seed: int = 0) -> Summary:
    """Summarise timed repetitions: median, bootstrap CI of the median, CV.

    The interval is :func:`bootstrap_median_ci` with 10,000 resamples and the
    given seed; method is ``"bootstrap-percentile-<confidence %>"``. A single
    value gives a zero-width interval at that value, cv None and method
    ``"single"``. cv is the sample standard deviation (ddof=1) over the mean,
    None with fewer than 2 values or a zero mean.

    Raises:
        ValueError: on empty input, non-finite values or confidence outside
            (0, 1).
    """
    _check_confidence(confidence)
    array = _finite_array(values, "values")
    if array.size == 0:
        raise ValueError("values must not be empty")
    median = float(np.median(array))
    if array.size == 1:
        return Summary(median=median, ci_low=median, ci_high=median, cv=None, n=1, method="single")
    low, high = bootstrap_median_ci(array.tolist(), confidence=confidence, seed=seed)
    return Summary(
        median=median,
        ci_low=low,
        ci_high=high,
        cv=_cv(array),
        n=int(array.size),
        method=f"bootstrap-percentile-{_confidence_tag(confidence)}",
    )


def _student_t_two_sided(t: float, df: int) -> float:
    """Return P(|T| < t) for T ~ Student t with integer df >= 1 and t >= 0.

    Exact finite series (Abramowitz and Stegun 26.7.3 and 26.7.4) in
    theta = atan(t / sqrt(df)); no numerical integration, so no error beyond
    float rounding.
    """
    theta = math.atan(t / math.sqrt(df))
    sin_theta, cos_theta = math.sin(theta), math.cos(theta)
    cos_sq = cos_theta * cos_theta
    if df % 2 == 1:
        # Odd df: (2/pi) [theta + sin cos (1 + 2/3 cos^2 + 2.4/(3.5) cos^4 + ...)],
        # the series running to cos^(df-2); it is empty for df = 1 (Cauchy).
        series = 0.0
        if df > 1:
            term = cos_theta
            series = term
            for k in range(3, df - 1, 2):
                term *= cos_sq * (k - 1) / k
                series += term
        return 2.0 / math.pi * (theta + sin_theta * series)
    # Even df: sin (1 + 1/2 cos^2 + 1.3/(2.4) cos^4 + ...), up to cos^(df-2).
    term = 1.0
    series = 1.0
    for k in range(2, df - 1, 2):
        term *= cos_sq * (k - 1) / k
        series += term
    return sin_theta * series


def student_t_quantile(p: float, df: int) -> float:
    """Return the p-quantile of Student's t distribution with df degrees of freedom.

    Inverts the exact CDF (see ``_student_t_two_sided``) by bisection to a
    relative tolerance of about 1e-13, using the symmetry t_p = -t_(1-p).
    Examples at p = 0.975: df=1 -> 12.7062, df=2 -> 4.3027, df=4 -> 2.7764,
    df=9 -> 2.2622, df=30 -> 2.0423. Cost grows linearly in df, which is fine
    for the handful of passes a benchmark makes.

    Raises:
        ValueError: if p is not strictly between 0 and 1 or df is not an
            integer >= 1.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
    if isinstance(df, bool) or not isinstance(df, (int, np.integer)) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    df = int(df)
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    target = 2.0 * p - 1.0
    low, high = 0.0, 1.0
    while _student_t_two_sided(high, df) < target:
        low, high = high, 2.0 * high
    while high - low > 1e-13 * high:
        middle = 0.5 * (low + high)
        if _student_t_two_sided(middle, df) < target:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


@dataclass(frozen=True)
class PassSpread:
    """Engine-to-engine spread of log speedups, pooled over a sweep's cells.

    ``sd`` is the pooled standard deviation of one pass's log ratio around
    its cell's mean; ``df`` its degrees of freedom (passes minus one, summed
    over cells). ``df == 0`` means no cell had two passes: the spread is
    unknown.
    """

    sd: float
    df: int


def pooled_pass_spread(ratios_by_cell: Sequence[Sequence[float]]) -> PassSpread:
    """Pool the between-pass variance of log ratios over every cell with two or more passes.

    A cell's passes differ because each uses fresh engines on a machine whose
    state drifts; that variation is a property of the machine and engine,
    not of the cell, so it is estimated from all cells together:
    s^2 = sum_cells sum_passes (ln r - mean_cell ln r)^2 / sum_cells (n - 1).
    With two passes per cell, one cell alone gives one degree of freedom and
    a uselessly wide t interval; a sweep of 20 cells gives 20.
    """
    squares, df = 0.0, 0
    for ratios in ratios_by_cell:
        if len(ratios) < 2:
            continue
        logs = _finite_array([math.log(r) for r in _positive(ratios)], "ratios")
        squares += float(np.sum((logs - logs.mean()) ** 2))
        df += logs.size - 1
    return PassSpread(sd=math.sqrt(squares / df) if df else 0.0, df=df)


@dataclass(frozen=True)
class SpeedupInterval:
    """A cell's speedup: point estimate, confidence interval, and rerun interval."""

    median: float
    ci_low: float
    ci_high: float
    rerun_low: float
    rerun_high: float
    method: str
    passes_disagree: bool


def speedup_interval(
    ratios: Sequence[float],
    spread: PassSpread,
    within_se: float | None,
    *,
    confidence: float = 0.95,
) -> SpeedupInterval:
    """Interval estimates for one cell's speedup from its per-pass ratios.

    Point estimate: the median of the per-pass ratios. Intervals are built on
    the log scale around the mean log ratio (the geometric mean) of the n passes:

    - with a pooled spread (``spread.df > 0``): the confidence interval for
      the expected speedup is ``exp(m +- t_df * s / sqrt(n))``; the rerun
      interval, where an identical rerun of n passes is expected to land, is
      ``exp(m +- t_df * s * sqrt(2 / n))``. Method ``pooled-t-log-<conf>``.
    - without (every cell had one pass): only the within-engine noise of the
      repetitions is known; ``within_se`` (relative standard error of each
      side's median) gives ``exp(m +- z * sqrt(2) * within_se)`` for both.
      Method ``within-only-<conf>``: it understates engine-to-engine variation.

    ``passes_disagree`` is True when two passes of the cell differ by more than
    the pooled spread allows at this confidence (``|ln r_i - ln r_j| >
    t_df * s * sqrt(2)``), i.e. something beyond ordinary engine-to-engine
    variation happened in one of them.
    """
    _check_confidence(confidence)
    logs = _finite_array([math.log(r) for r in _positive(ratios)], "ratios")
    if logs.size == 0:
        raise ValueError("ratios must not be empty")
    center = float(logs.mean())
    tail = (1.0 + confidence) / 2.0
    tag = _confidence_tag(confidence)
    disagree = False
    if spread.df > 0:
        t = student_t_quantile(tail, spread.df)
        ci_half = t * spread.sd / math.sqrt(logs.size)
        rerun_half = t * spread.sd * math.sqrt(2.0 / logs.size)
        disagree = logs.size > 1 and float(logs.max() - logs.min()) > t * spread.sd * math.sqrt(2.0)
        method = f"pooled-t-log-{tag}"
    else:
        z = NormalDist().inv_cdf(tail)
        ci_half = rerun_half = z * math.sqrt(2.0) * (within_se or 0.0)
        method = f"within-only-{tag}"
    return SpeedupInterval(
        median=float(np.median(np.exp(logs))),
        ci_low=math.exp(center - ci_half),
        ci_high=math.exp(center + ci_half),
        rerun_low=math.exp(center - rerun_half),
        rerun_high=math.exp(center + rerun_half),
        method=method,
        passes_disagree=disagree,
    )


def _positive(ratios: Sequence[float]) -> Sequence[float]:
    if any(r <= 0 for r in ratios):
        raise ValueError(f"ratios must be positive, got {list(ratios)}")
    return ratios


def repeated_ngram_share(token_ids: Sequence[int], n: int = 4) -> float:
    """Share of an output's n-grams that already occurred earlier in the same output.

    Near 0 for ordinary text; near 1 for an output caught in a loop (small
    models under greedy decoding repeat one sentence to max_tokens). Loops
    matter to speculation: prompt lookup drafts them perfectly, so a few
    looping requests can carry a workload's pooled acceptance length.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = [tuple(token_ids[i : i + n]) for i in range(len(token_ids) - n + 1)]
    if not grams:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for gram in grams:
        repeated += gram in seen
        seen.add(gram)
    return repeated / len(grams)
