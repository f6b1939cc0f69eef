"""Small, pure statistics for summarising timed repetitions and independent engine runs.

Two kinds of spread are summarised here:

- within one engine, repeated timings of the same cell (:func:`summarize`:
  median with a distribution-free order-statistic interval whose exact
  coverage is stated, robust to the odd slow repetition);
- between independent engine runs, the paired speedup ratios, one per run
  (:func:`speedup_interval`: a Student t interval on the log ratios, centred
  on their mean like the point estimate, because ratios are multiplicative
  and engine runs are few).

An interval is never reported with zero width for want of data: with one
value there is no interval (None), not the point twice. Everything here is
deterministic: the t quantile is computed exactly for integer degrees of
freedom and the order-statistic coverage is an exact binomial sum, so the
module needs neither scipy nor pandas.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "NO_INTERVAL",
    "EngineRunSpread",
    "EngineRunSummary",
    "SpeedupInterval",
    "Summary",
    "WithinNoise",
    "engine_run_interval",
    "fit_alpha",
    "latency_percentiles",
    "median_interval",
    "percentile",
    "pooled_engine_run_spread",
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
    for the handful of engine runs a benchmark makes.

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
class EngineRunSpread:
    """Engine-to-engine spread of log speedups, pooled over a sweep's cells.

    ``sd`` estimates the standard deviation of one engine run's log ratio (a
    baseline engine against a speculative one) around its cell's mean; ``df``
    its degrees of freedom (see :func:`pooled_engine_run_spread`). ``df == 0``
    means no cell had two runs: the spread is unknown.
    """

    sd: float
    df: int


def pooled_engine_run_spread(
    ratios_by_cell: Sequence[Sequence[float]], groups: Sequence[Hashable] | None = None
) -> EngineRunSpread:
    """Pool the engine-to-engine variance of log ratios over every cell with two or more engine runs.

    A cell's engine runs differ because each uses fresh engines on a machine
    whose state drifts; that variation is a property of the machine and the
    engine, not of the cell, so it is estimated from all cells together.

    The model: one engine run's log ratio is ln r_cr = m_c + u_r - v_cr, with
    u_r the baseline engine's deviation in run r (shared by every cell that
    divides by that baseline: ``groups`` names each cell's baseline) and v_cr
    the speculative engine's own. Both are fresh engines of one machine, so
    they are taken to vary alike: Var u = Var v = s^2, and one run's log ratio
    varies by 2 s^2. Within a baseline's group of C cells measured in the same
    R engine runs, the two-way residuals (cell x run interaction) see only the
    v's: their sum of squares estimates (C-1)(R-1) s^2 free of the shared
    baseline, and the run means' spread estimates (R-1)(C+1) s^2. Scaled to
    the variance of one run's ratio, 2 SS_interaction + 2/(C+1) SS_runs has
    expectation C(R-1) 2 s^2, so the pooled sd has C(R-1) degrees of freedom
    per group: six cells of one baseline in two engine runs give 5 + 1 = 6
    instead of the 1 a baseline counted as one cell gives (t = 2.45, not
    12.7). A group alone (C = 1) is the plain sample variance of its runs.

    A group whose cells were measured in different numbers of engine runs is
    pooled conservatively: residuals around each cell's mean, and only the
    largest cell's n - 1 degrees of freedom, as if its cells were one.
    Without ``groups`` every cell is its own group.
    """
    labels: Sequence[Hashable] = groups if groups is not None else list(range(len(ratios_by_cell)))
    if len(labels) != len(ratios_by_cell):
        raise ValueError(f"{len(labels)} group labels for {len(ratios_by_cell)} cells")
    by_group: dict[Hashable, list[np.ndarray]] = {}
    for ratios, label in zip(ratios_by_cell, labels):
        if len(ratios) >= 2:
            logs = _finite_array([math.log(r) for r in _positive(ratios)], "ratios")
            by_group.setdefault(label, []).append(logs)
    squares, df = 0.0, 0
    for cells in by_group.values():
        if len({c.size for c in cells}) == 1:
            table = np.vstack(cells)  # cells x engine runs
            count = table.shape[0]
            run_means, cell_means = table.mean(axis=0), table.mean(axis=1, keepdims=True)
            interaction = table - cell_means - run_means + table.mean()
            runs = count * float(np.sum((run_means - table.mean()) ** 2))
            squares += 2.0 * float(np.sum(interaction**2)) + 2.0 / (count + 1) * runs
            df += count * (table.shape[1] - 1)
        else:
            squares += sum(float(np.sum((c - c.mean()) ** 2)) for c in cells) * max(c.size - 1 for c in cells) / sum(
                c.size - 1 for c in cells)
            df += max(c.size - 1 for c in cells)
    return EngineRunSpread(sd=math.sqrt(squares / df) if df else 0.0, df=df)


@dataclass(frozen=True)
class WithinNoise:
    """Within-engine noise of a speedup from one engine run: the repetitions' spread on both sides.

    ``se`` is the relative standard error of the ratio (baseline and cell
    combined: sqrt(cv_b^2 / n_b + cv_s^2 / n_s)); ``df`` its degrees of
    freedom, (n_b - 1) + (n_s - 1).
    """

    se: float
    df: int


@dataclass(frozen=True)
class SpeedupInterval:
    """A cell's speedup: point estimate, confidence interval, and rerun interval.

    The interval ends are None when there is nothing to build an interval
    from (one engine run of one repetition); ``method`` then says so.
    """

    point: float
    ci_low: float | None
    ci_high: float | None
    rerun_low: float | None
    rerun_high: float | None
    method: str
    engine_runs_disagree: bool


NO_INTERVAL = "none: one engine run of one repetition"


def speedup_interval(
    ratios: Sequence[float],
    spread: EngineRunSpread,
    within: WithinNoise | None,
    *,
    confidence: float = 0.95,
) -> SpeedupInterval:
    """Interval estimates for one cell's speedup from its per-run ratios.

    Point estimate: the geometric mean of the per-run ratios, exp(m) with m
    the mean log ratio; the intervals are built on the log scale around the
    same m, so the point always lies inside its own interval:

    - with a pooled spread (``spread.df > 0``): the confidence interval for
      the expected speedup is ``exp(m +- t_df * s / sqrt(n))``; the rerun
      interval, where an identical rerun of n engine runs is expected to land, is
      ``exp(m +- t_df * s * sqrt(2 / n))``. Method ``pooled-t-log-<conf>``.
    - without (every cell had one engine run): only the within-engine noise of the
      repetitions is known; ``exp(m +- t_df * within.se)`` with the
      repetitions' df, and sqrt(2) wider for a rerun. Method
      ``within-only-t-<conf>``: it understates engine-to-engine variation.
    - with neither (one engine run of one repetition on each side): no interval
      (None ends, method :data:`NO_INTERVAL`), never a zero-width one.

    ``engine_runs_disagree`` is True when two engine runs of the cell differ by more than
    the pooled spread allows at this confidence (``|ln r_i - ln r_j| >
    t_df * s * sqrt(2)``), i.e. something beyond ordinary engine-to-engine
    variation happened in one of them.
    """
    _check_confidence(confidence)
    logs = _finite_array([math.log(r) for r in _positive(ratios)], "ratios")
    if logs.size == 0:
        raise ValueError("ratios must not be empty")
    center = float(logs.mean())
    point = math.exp(center)
    tail = (1.0 + confidence) / 2.0
    tag = _confidence_tag(confidence)
    disagree = False
    if spread.df > 0:
        t = student_t_quantile(tail, spread.df)
        ci_half = t * spread.sd / math.sqrt(logs.size)
        rerun_half = t * spread.sd * math.sqrt(2.0 / logs.size)
        disagree = logs.size > 1 and float(logs.max() - logs.min()) > t * spread.sd * math.sqrt(2.0)
        method = f"pooled-t-log-{tag}"
    elif within is not None and within.df > 0 and within.se > 0.0:
        ci_half = student_t_quantile(tail, within.df) * within.se
        rerun_half = ci_half * math.sqrt(2.0)
        method = f"within-only-t-{tag}"
    else:
        return SpeedupInterval(point, None, None, None, None, NO_INTERVAL, False)
    return SpeedupInterval(
        point=point,
        ci_low=math.exp(center - ci_half),
        ci_high=math.exp(center + ci_half),
        rerun_low=math.exp(center - rerun_half),
        rerun_high=math.exp(center + rerun_half),
        method=method,
        engine_runs_disagree=disagree,
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


def _probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a finite number in [0, 1], got {value!r}")
    return float(value)


def fit_alpha(rates: Sequence[float]) -> float:
    """Per-token acceptance alpha whose geometric prefix model best fits rates.

    Under independent acceptance, 0-based position i is accepted with
    unconditional probability alpha^(i+1). The fit minimises
    L(alpha) = sum_i (alpha^(i+1) - rates[i])^2 over alpha in [0, 1]. L need
    not be unimodal for arbitrary rates, so a 1001-point grid picks the best
    bracket, then bisection on dL/dalpha = 2 sum_i (i+1) alpha^i (alpha^(i+1) -
    rates[i]) inside it locates the minimum to floating-point precision.
    Dimensionless, in [0, 1].
    """
    checked = [_probability(f"rates[{i}]", r) for i, r in enumerate(rates)]
    if not checked:
        raise ValueError("rates must not be empty")

    def loss(alpha: float) -> float:
        return sum((alpha ** (i + 1) - r) ** 2 for i, r in enumerate(checked))

    def slope(alpha: float) -> float:
        return sum((i + 1) * alpha**i * (alpha ** (i + 1) - r) for i, r in enumerate(checked))

    grid = [j / 1000 for j in range(1001)]
    j = min(range(len(grid)), key=lambda j: loss(grid[j]))
    low, high = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    if slope(low) >= 0.0:
        return low
    if slope(high) <= 0.0:
        return high
    while high - low > 1e-15:
        mid = (low + high) / 2
        if slope(mid) < 0.0:
            low = mid
        else:
            high = mid
    return (low + high) / 2
