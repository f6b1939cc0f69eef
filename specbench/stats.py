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

import functools
import math
import numbers
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

__all__ = [
    "GROWTH_ALPHA",
    "POOL_MIN_DF",
    "NO_INTERVAL",
    "RUN_TERM_LEVEL",
    "EngineRunSpread",
    "EngineRunSummary",
    "ShiftedBaseline",
    "StratumSpreads",
    "SpeedupInterval",
    "Summary",
    "WithinNoise",
    "chi_square_quantile",
    "clears",
    "engine_run_interval",
    "engine_run_spread",
    "fit_alpha",
    "is_interval",
    "latency_percentiles",
    "lower_end",
    "median_interval",
    "lone_references",
    "median_variance_factor",
    "percentile",
    "repeated_ngram_share",
    "run_term_bound",
    "shift_testable",
    "shifted_baselines",
    "speedup_interval",
    "stratum_spreads",
    "student_t_quantile",
    "student_t_quantile_real",
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


def student_t_quantile_real(p: float, df: float) -> float:
    """The p-quantile of Student's t for real df >= 1 (Satterthwaite's degrees of freedom are not integers).

    Exact (:func:`student_t_quantile`) at integer df; between two integers,
    interpolated linearly in 1/df, the classical rule for t tables. The
    quantile is convex in 1/df, so this errs wide: t(0.975, 1.5) = 7.10
    against an exact 6.02, t(0.975, 1.81) = 5.19 against 4.77, t(0.975, 2.5)
    = 3.63 against 3.58 (still far from flooring to 1 df, 12.7).

    Raises:
        ValueError: if p is not strictly between 0 and 1 or df is not a finite number >= 1.
    """
    if isinstance(df, bool) or not isinstance(df, numbers.Real) or not math.isfinite(df) or df < 1:
        raise ValueError(f"df must be a finite number >= 1, got {df!r}")
    low = math.floor(df)
    if df == low:
        return student_t_quantile(p, int(low))
    weight = (1.0 / df - 1.0 / (low + 1)) / (1.0 / low - 1.0 / (low + 1))
    return weight * student_t_quantile(p, low) + (1.0 - weight) * student_t_quantile(p, low + 1)


@dataclass(frozen=True)
class EngineRunSpread:
    """Engine-to-engine spread of log speedups, pooled over a sweep's cells.

    ``sd`` estimates the standard deviation of one engine run's log ratio (a
    baseline engine against a speculative one) around its cell's mean; ``df``
    its degrees of freedom, counted in independent engines (see
    :func:`engine_run_spread`). ``df == 0`` means no cell had two runs: the
    spread is unknown. ``baseline_sd`` and ``engine_sd`` split the spread
    into the baseline engine's own deviation and a speculative engine's,
    where the design separates them (two or more speculative engines per
    baseline engine); None elsewhere.
    """

    sd: float
    df: float
    baseline_sd: float | None = None
    engine_sd: float | None = None


@dataclass(frozen=True)
class _MeanSquare:
    value: float
    df: int


def engine_run_spread(
    ratios_by_cell: Sequence[Mapping[Hashable, float]],
    engines: Sequence[Hashable],
    baselines: Sequence[Hashable],
) -> EngineRunSpread:
    """The spread of one engine run's log speedup, with degrees of freedom counted in independent engines.

    ``ratios_by_cell``: each cell's speedup per engine run (engine run -> ratio; the
    merge names a run by its baseline's engine instance, the same key for every cell
    measured on it, :func:`specbench.results.schema.engine_instance`); ``engines``:
    each cell's speculative engine (the merge: its engine instances); ``baselines``:
    its baseline engine (the merge: the cells that shared a baseline engine instance). One engine serves every workload, batch size and temperature of its
    configuration in an engine run, so those cells do not draw new engine
    deviations: they repeat the same ones.

    The model, per baseline engine: ln r_cr = m_c + u_r - v_er + e_cr, with u_r
    the baseline engine's deviation in engine run r (shared by all its cells),
    v_er the deviation of speculative engine e (shared by that engine's cells)
    and e_cr what is the cell's own (its repetitions, its workload). Nothing
    assumes the baseline engine varies as a speculative one does: on a
    shared machine one baseline engine ran 33% slower than its twin while every
    speculative engine stayed within 3%. From the residuals around each cell's
    mean, three mean squares (R engine runs, E speculative engines, C_e cells each):

    - MS_cell, within an engine run of one engine: e only, sum (C_e-1)(R-1) df;
    - MS_engine, engines x runs interaction of the engine means: v + e/C, (E-1)(R-1) df;
    - MS_run, the run means over engines, times E: E u + v + e/C, R-1 df.

    One engine run's log ratio varies by Var u + Var v + Var e =
    MS_run / E + (1 - 1/E) MS_engine + (1 - mean 1/C_e) MS_cell, a sum of mean
    squares with positive weights whose degrees of freedom are Satterthwaite's,
    (sum w_i M_i)^2 / sum (w_i M_i)^2 / df_i, a real number between the fewest
    of any term and their sum (:func:`student_t_quantile_real` takes it). When the baseline's deviation dominates the df
    fall towards R - 1, the baseline engine's own; with one speculative engine
    they are R - 1 (its cells share every deviation). The baseline engine's deviation is one draw per engine
    run that every configuration's ratio shares, so MS_run alone measures it, on R - 1 df however many cells
    there are; Satterthwaite's df, computed from the observed mean squares, count many df exactly when MS_run
    came out small by chance, which is when the interval is too narrow (2 engine runs, the baseline engine
    dominating: about 11% of 95% intervals missed). So on one df they count MS_run at its upper bound
    (:func:`run_term_bound`); the variance itself is not changed. Four configurations x 2
    workloads x 3 batch sizes in 2 engine runs give at most 1 + 3 + 20 = 24,
    and about 2 when the engines, not the cells, vary. (Counting the 24 cells
    as independent claimed 24 and intervals about 26% too narrow.)

    Baseline engines are separate experiments: their variances are pooled,
    weighted by their df, which add. Only cells measured in the engine runs
    most of their baseline engine's cells share enter the estimate. ``baseline_sd`` is
    sqrt(max(0, MS_run - MS_engine) / E) and ``engine_sd``
    sqrt(max(0, MS_engine - mean 1/C_e MS_cell)), pooled alike, where E >= 2.
    """
    if not len(ratios_by_cell) == len(engines) == len(baselines):
        raise ValueError(f"{len(ratios_by_cell)} cells, {len(engines)} engines and {len(baselines)} baselines")
    by_baseline: dict[Hashable, list[tuple[Hashable, Mapping[Hashable, float]]]] = {}
    for ratios, engine, baseline in zip(ratios_by_cell, engines, baselines):
        if len(ratios) >= 2:
            _positive(list(ratios.values()))
            by_baseline.setdefault(baseline, []).append((engine, ratios))
    variance, df = 0.0, 0.0
    split: dict[str, list[tuple[float, float]]] = {"baseline": [], "engine": []}
    for cells in by_baseline.values():
        group = _baseline_group_spread(cells)
        if group is None:
            continue
        terms, weights, parts = group
        total = sum(w * m.value for w, m in zip(weights, terms))
        # The degrees of freedom count the run mean square (terms[0]) at its upper bound (run_term_bound).
        used = [(w * m.value * (run_term_bound(m.df) if i == 0 else 1.0), m.df)
                for i, (w, m) in enumerate(zip(weights, terms)) if w > 0 and m.df > 0]
        counted = sum(v for v, _ in used)
        group_df = sum(d for _, d in used) if counted == 0.0 else counted**2 / sum(v * v / d for v, d in used)
        variance += group_df * total
        df += group_df
        for name, value in parts.items():
            split[name].append((value, group_df))
    if df == 0.0:
        return EngineRunSpread(sd=0.0, df=0)

    def pooled(parts: list[tuple[float, float]]) -> float | None:
        weight = sum(d for _, d in parts)
        return math.sqrt(sum(v * d for v, d in parts) / weight) if parts and weight else None

    return EngineRunSpread(sd=math.sqrt(variance / df), df=df,
                           baseline_sd=pooled(split["baseline"]), engine_sd=pooled(split["engine"]))


def _in_common_runs(cells: Sequence[Mapping[Hashable, float]]) -> tuple[list[Hashable], list[np.ndarray | None]]:
    """The engine runs most of ``cells`` were measured in, and each cell's log ratios in them (None for a
    cell missing one: it failed there). A cell measured in an extra run enters with the common runs only."""
    shared = Counter(frozenset(ratios) for ratios in cells).most_common(1)[0][0]
    runs = sorted(shared, key=str)
    logs = [_finite_array([math.log(ratios[r]) for r in runs], "ratios") if shared <= set(ratios) else None
            for ratios in cells]
    return runs, logs


def _baseline_group_spread(
    cells: Sequence[tuple[Hashable, Mapping[Hashable, float]]],
) -> tuple[list[_MeanSquare], list[float], dict[str, float]] | None:
    """One baseline engine's mean squares (run, engine, cell), their weights in one run's variance, and the
    variance components they separate; None with fewer than two engine runs in common.

    The engine runs are those most of its cells were measured in (a cell that failed in one run leaves
    the estimate; one measured in an extra run enters with the common runs only)."""
    runs, logs_by_cell = _in_common_runs([ratios for _, ratios in cells])
    by_engine: dict[Hashable, list[np.ndarray]] = {}
    for (engine, _), logs in zip(cells, logs_by_cell):
        if logs is not None:
            by_engine.setdefault(engine, []).append(logs - logs.mean())
    count = len(by_engine)
    engine_means = np.vstack([np.mean(c, axis=0) for c in by_engine.values()])  # engines x runs
    cell_ss = sum(float(np.sum((np.vstack(c) - m) ** 2)) for c, m in zip(by_engine.values(), engine_means))
    cell_df = sum((len(c) - 1) * (len(runs) - 1) for c in by_engine.values())
    run_means = engine_means.mean(axis=0)
    cell = _MeanSquare(cell_ss / cell_df if cell_df else 0.0, cell_df)
    engine_df = (count - 1) * (len(runs) - 1)
    engine = _MeanSquare(float(np.sum((engine_means - run_means) ** 2)) / engine_df if engine_df else 0.0, engine_df)
    run = _MeanSquare(count * float(np.sum(run_means**2)) / (len(runs) - 1), len(runs) - 1)
    inverse_cells = float(np.mean([1.0 / len(c) for c in by_engine.values()]))
    weights = [1.0 / count, 1.0 - 1.0 / count, 1.0 - inverse_cells]
    parts = {} if count < 2 else {
        "baseline": max(0.0, run.value - engine.value) / count,
        "engine": max(0.0, engine.value - inverse_cells * cell.value),
    }
    return [run, engine, cell], weights, parts


# The batch sizes share one spread unless it is shown to grow with the batch at this one-sided level (a liberal
# level: a spread that grows is seldom pooled), and only where each batch size's own spread has this many
# degrees of freedom: below them the baseline engine's few deviations dominate, Satterthwaite's count of df is
# already too kind, and pooling lent df it could not vouch for (make demo's design at baseline-engine sd 0.05:
# misses 7.2% -> 10.4%; tests/benchmarks/interval_coverage_sim.py).
GROWTH_ALPHA = 0.2
POOL_MIN_DF = 4.0


def _digamma(x: float) -> float:
    """psi(x) for x > 0: the recurrence up to x >= 10, then the asymptotic series (error below 1e-10)."""
    shift = 0.0
    while x < 10.0:
        shift -= 1.0 / x
        x += 1.0
    inverse = 1.0 / (x * x)
    return shift + math.log(x) - 0.5 / x - inverse * (1.0 / 12 - inverse * (1.0 / 120 - inverse / 252))


def _trigamma(x: float) -> float:
    """psi'(x) for x > 0: the recurrence up to x >= 10, then the asymptotic series (error below 1e-10)."""
    shift = 0.0
    while x < 10.0:
        shift += 1.0 / (x * x)
        x += 1.0
    inverse = 1.0 / (x * x)
    return shift + 1.0 / x + 0.5 * inverse + inverse / x * (1.0 / 6 - inverse * (1.0 / 30 - inverse / 42))


@dataclass(frozen=True)
class StratumSpreads:
    """The engine-to-engine spread behind each batch size's intervals, and how it was chosen (:func:`stratum_spreads`).

    ``spreads``: per stratum (batch size) the spread its intervals use; ``sources``: per stratum ``"own"`` (its
    cells' spread, :func:`engine_run_spread`), ``"pooled"`` (one spread fitted to every batch size, on their
    pooled degrees of freedom) or ``"none"`` (no cell with two engine runs: df 0); ``slope``: the slope of
    log sd on log batch size fitted to the batch sizes' own spreads, and ``growth_p`` the one-sided p-value of
    "the spread does not grow with the batch" (both None with fewer than two batch sizes measured).
    """

    spreads: dict[Hashable, EngineRunSpread]
    sources: dict[Hashable, str]
    slope: float | None
    growth_p: float | None


def stratum_spreads(
    ratios_by_cell: Sequence[Mapping[Hashable, float]],
    engines: Sequence[Hashable],
    baselines: Sequence[Hashable],
    batches: Sequence[Hashable],
    *,
    growth_alpha: float = GROWTH_ALPHA,
) -> StratumSpreads:
    """Each batch size's engine-to-engine spread: its own, or one fitted across batch sizes where that knows more.

    ``ratios_by_cell``, ``engines``, ``baselines``: as for :func:`engine_run_spread`; ``batches``: each cell's
    batch size, the stratum whose noise it shares. A batch size's own spread assumes nothing about the others,
    but has few degrees of freedom where it has few engines (4 configurations x 2 workloads in 2 engine runs:
    about 4). Where the spread does not grow with the batch, one spread for every batch size lends each the
    others' degrees of freedom: :func:`engine_run_spread` over all their cells at once, so that they stay
    counted in independent engines (one baseline engine serves every batch size: its deviations are no new
    evidence in a second stratum, and adding the strata's df would count them twice).

    Whether it grows: log sd = a + b log(batch), fitted to the batch sizes' own spreads by weighted least
    squares. The log of a variance on d df varies by trigamma(d / 2) and is biased by digamma(d / 2) - log(d / 2)
    (a scaled chi-square), both allowed for; b is tested one-sided against 0 (z on its standard error, the
    variances taken as independent: batch sizes that share a baseline engine's deviations vary together, so
    the error is overstated and growth must be clearer to be found, hence the liberal level). Below ``growth_alpha``, or where a batch
    size's own spread has fewer than :data:`POOL_MIN_DF` degrees of freedom (a spread the baseline engine
    dominates: its deviations are the same ones in every stratum, and pooling would lend df nobody measured),
    every batch size keeps its own spread. Otherwise each takes the pooled spread where that has more degrees of
    freedom than its own. (A log-linear model of the sd, fitted across three batch sizes or more, lends df even
    where the spread grows, but where the spread is not log-linear in the batch it misplaced the largest batch
    size's spread: docs/methodology.md.)

    A batch size where no cell has two engine runs keeps its empty spread (df 0: the caller falls back on the
    sweep's); strata that are not positive numbers keep their own spread and are not tested.
    """
    if not len(ratios_by_cell) == len(engines) == len(baselines) == len(batches):
        raise ValueError(f"{len(ratios_by_cell)} cells, {len(engines)} engines, {len(baselines)} baselines and "
                         f"{len(batches)} batch sizes")
    if not 0.0 < growth_alpha < 1.0:
        raise ValueError(f"growth_alpha must lie strictly between 0 and 1, got {growth_alpha}")
    cells: dict[Hashable, list[int]] = {}
    for i, batch in enumerate(batches):
        cells.setdefault(batch, []).append(i)

    def spread_of(indices: Sequence[int]) -> EngineRunSpread:
        return engine_run_spread([ratios_by_cell[i] for i in indices], [engines[i] for i in indices],
                                 [baselines[i] for i in indices])

    own = {batch: spread_of(indices) for batch, indices in cells.items()}
    sources = {b: "own" if s.df > 0 else "none" for b, s in own.items()}
    measured = {b: s for b, s in own.items() if s.df > 0 and s.sd > 0.0 and _positive_number(b)}
    if len(measured) < 2:
        return StratumSpreads(own, sources, None, None)
    logs = {b: math.log(float(cast(float, b))) for b in measured}
    weights = {b: 1.0 / _trigamma(s.df / 2.0) for b, s in measured.items()}
    centre = sum(weights[b] * logs[b] for b in measured) / sum(weights.values())
    sxx = sum(weights[b] * (logs[b] - centre) ** 2 for b in measured)
    unbiased = {b: 2.0 * math.log(s.sd) - (_digamma(s.df / 2.0) - math.log(s.df / 2.0)) for b, s in measured.items()}
    slope = sum(weights[b] * (logs[b] - centre) * unbiased[b] for b in measured) / sxx  # of the log variance
    growth_p = 1.0 - _normal_cdf(slope * math.sqrt(sxx))
    spreads = dict(own)
    if growth_p >= growth_alpha and min(s.df for s in measured.values()) >= POOL_MIN_DF:
        pooled = spread_of([i for b in measured for i in cells[b]])
        for b in measured:
            if pooled.df > own[b].df:
                spreads[b], sources[b] = pooled, "pooled"
    return StratumSpreads(spreads, sources, slope / 2.0, growth_p)


def _positive_number(value: Hashable) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


# Where the run mean square of an engine-to-engine spread (the baseline engine's deviation, and what every
# configuration shares in a run) has one degree of freedom (2 engine runs), the spread's degrees of freedom count it
# at the upper bound it stays under with probability 1 - this: Satterthwaite's count on the observed mean squares
# was too kind exactly when that mean square came out small. Chosen on tests/benchmarks/interval_coverage_sim.py
# (baseline-engine sd 0.02-0.15, noise x1-x3 by batch size): 2 engine runs missed up to 11% of 95% intervals before,
# at most 7% after; 0.4 and 0.35 still missed 7.2% and 6.9% where the baseline engine dominates.
RUN_TERM_LEVEL = 0.3


def _chi_square_cdf(x: float, df: int) -> float:
    """P(X <= x) for X ~ chi-square with integer df >= 1: the finite series of the regularized gamma function."""
    if x <= 0.0:
        return 0.0
    half = x / 2.0
    if df % 2 == 0:
        term, series = 1.0, 1.0
        for k in range(1, df // 2):
            term *= half / k
            series += term
        return 1.0 - math.exp(-half) * series
    # Odd df: erf(sqrt(x/2)) less exp(-x/2) sum_{k=1}^{(df-1)/2} (x/2)^(k-1/2) / Gamma(k+1/2).
    term = math.sqrt(half) / math.gamma(1.5)
    series = 0.0
    for k in range(1, (df + 1) // 2):
        series += term
        term *= half / (k + 0.5)
    return math.erf(math.sqrt(half)) - math.exp(-half) * series


@functools.lru_cache(maxsize=None)
def chi_square_quantile(p: float, df: int) -> float:
    """The p-quantile of the chi-square distribution with integer df >= 1, by bisection on its exact CDF.

    Examples: p=0.5, df=1 -> 0.4549; p=0.3, df=1 -> 0.1485; p=0.3, df=2 -> 0.7133.

    Raises:
        ValueError: if p is not strictly between 0 and 1 or df is not an integer >= 1.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
    if isinstance(df, bool) or not isinstance(df, (int, np.integer)) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    low, high = 0.0, float(df) + 1.0
    while _chi_square_cdf(high, int(df)) < p:
        low, high = high, 2.0 * high
    while high - low > 1e-12 * high:
        middle = 0.5 * (low + high)
        if _chi_square_cdf(middle, int(df)) < p:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def run_term_bound(df: int) -> float:
    """How much larger than observed a run mean square on ``df`` degrees of freedom is counted in Satterthwaite's df.

    On one df: ``1 / chi_square_quantile(RUN_TERM_LEVEL, 1)`` (6.7), its expectation's one-sided upper
    confidence bound at 1 - :data:`RUN_TERM_LEVEL` over the mean square. A mean square on one df comes out
    small by chance often (below a tenth of its expectation a quarter of the time), its share of the variance
    with it, and then Satterthwaite's df (a function of the shares) come out large. From two df on: 1, as
    observed (3 engine runs missed at most 6.8% of 95% intervals counted so; the bound would widen them for
    nothing).
    """
    if df != 1:
        return 1.0
    return 1.0 / chi_square_quantile(RUN_TERM_LEVEL, 1)


@dataclass(frozen=True)
class ShiftedBaseline:
    """A baseline cell one of whose engine runs moved every speculative cell measured against it.

    ``run``: that engine run; ``shift``: its log ratio against the mean of the
    other runs, common to the cells (positive: the baseline ran slower, so every
    speedup of that run came out higher); ``cells``: the speculative cells that
    saw it; ``tests``: the baseline cells judged at once (Bonferroni).
    """

    run: Hashable
    shift: float
    cells: int
    tests: int
    # True: judged against the engine-to-engine spread measured elsewhere (its baseline engine served too
    # few other baseline cells to hold it against: a family measured again on a fresh engine).
    lone: bool = False


@dataclass(frozen=True)
class _BaselineCell:
    engine: Hashable
    runs: list[Hashable]
    common: np.ndarray  # per run, the part of the centred log ratios common to the cells
    cells: int
    stratum: Hashable
    weight: float  # Var(common part) over its stratum's residual mean square: (1 - 1/R)(1 + 1/E)


def shifted_baselines(
    ratios_by_cell: Sequence[Mapping[Hashable, float]],
    references: Sequence[Hashable],
    baselines: Sequence[Hashable],
    strata: Sequence[Hashable] | None = None,
    *,
    confidence: float = 0.95,
    yardsticks: Mapping[Hashable, EngineRunSpread] | None = None,
) -> dict[Hashable, ShiftedBaseline]:
    """The baseline cells one of whose engine runs went off alone: beyond any speculative cell's spread,
    and beyond the other cells of the same baseline engine in that run.

    ``ratios_by_cell``: each speculative cell's speedup per engine run (engine
    run index -> ratio); ``references``: the baseline cell it is measured
    against (one per workload, batch size and temperature, the same in every
    run); ``baselines``: that cell's baseline engine (:func:`engine_run_spread`);
    ``strata``: its stratum, the workload x batch size x temperature whose
    cells share one noise level (default: each baseline cell its own). A
    baseline cell serves several speculative cells (one per method and K), so
    a baseline run that went slow while other processes' CPU time showed
    nothing (a co-tenant's memory traffic, a throttled core) moves all their
    ratios of that run together, where their own noise moves them apart. The
    per-cell disagreement test of :func:`speedup_interval` misses it: the
    shared shift inflates the pooled spread it judges by, and each cell looks
    ordinary next to its neighbours.

    Per baseline cell with E >= 2 speculative cells over R >= 2 common engine
    runs: the log ratios, centred per cell over runs, split into the part
    common to the cells, c_r, and the rest. The rest is the speculative
    side's own run-to-run noise, in which the baseline's cancels: its mean
    square s^2, pooled over the baseline cells of one stratum only, has
    sum (E-1)(R-1) degrees of freedom. Noise differs between strata (a batch
    of 8 is noisier than a batch of 1, a sampled cell than a greedy one): one
    variance pooled over the sweep put the false flags on the noisiest
    references. A baseline cell that varied as a speculative one does would
    give c_r a variance of v = s^2 (1 - 1/R)(1 + 1/E). A shift is flagged when both

    - |c_r| exceeds t sqrt(v) (t on its stratum's df): the baseline moved
      more than a speculative cell moves, and
    - c_r less the median c_r of the same baseline engine's *other* tested
      cells in that run (at least two) exceeds t times the sd of that
      difference, v + Var(median) (:func:`median_variance_factor` times the
      others' mean v over their number), on Satterthwaite's df over the
      strata involved: the engine did not move as a whole. A whole baseline
      engine's deviation is part of the engine-to-engine spread the intervals
      carry (:func:`engine_run_spread` estimates it apart), not a disturbance.
      The tested cell stays out of its own median, which would otherwise
      pull towards it,

    with t at 1 - (1 - confidence) / (2 m), m the baseline cells tested (R
    tests per cell, or 1 where R = 2: its two runs mirror each other).

    ``yardsticks``: for baseline cells that cannot be held against their engine's other cells (the only
    baseline cell of their baseline engine, :func:`lone_references`: a family measured again on a fresh
    engine), the engine-to-engine spread of one run measured on other baseline engines
    (:func:`engine_run_spread`). Such a cell's common part c_r, over its speculative cells and R >= 2 common
    runs, varies by at most (1 - 1/R) times that spread's variance if the engine that ran it was an ordinary
    one (its own deviation, its cell's and the speculative side's averaged over its cells, each at most what
    one run of a cell carries); with two speculative cells or more (one cannot tell its baseline's move from its
    own), it is flagged when |c_r| exceeds t times that, on the spread's df, in the
    same Bonferroni count (``lone`` set). A fresh baseline engine 3x slow in one run is found so; one that
    deviates as the sweep's other engines do is not.

    Returns the shifted baseline cells by reference; empty when no baseline
    cell has two speculative cells over two engine runs in common, or fewer
    than three such cells share a baseline engine, and no yardstick is given (:func:`shift_testable`
    says which references could be tested).
    """
    measured, variances = _baseline_cells(ratios_by_cell, references, baselines, strata, confidence)
    lone = _lone_baseline_cells(ratios_by_cell, references, baselines, yardsticks or {})
    if not measured and not lone:
        return {}
    by_engine_run: dict[tuple[Hashable, int], list[tuple[Hashable, float]]] = {}
    for reference, cell in measured.items():
        for run, value in zip(cell.runs, cell.common):
            by_engine_run.setdefault((cell.engine, run), []).append((reference, float(value)))
    tests = sum(1 if len(cell.runs) == 2 else len(cell.runs) for cell in measured.values()) + sum(
        1 if len(runs) == 2 else len(runs) for runs, _, _ in lone.values())
    level = 1.0 - (1.0 - confidence) / (2 * tests)
    shifted = {}
    for reference, (runs, common, cells) in lone.items():
        yardstick = (yardsticks or {})[reference]
        bound = student_t_quantile_real(level, yardstick.df) * yardstick.sd * math.sqrt(1.0 - 1.0 / len(runs))
        order = np.argsort(-common) if len(runs) == 2 else np.argsort(-np.abs(common))
        i = int(order[0])
        if abs(common[i]) > bound:
            shift = float(common[i]) * len(runs) / (len(runs) - 1)
            shifted[reference] = ShiftedBaseline(run=runs[i], shift=shift, cells=cells, tests=tests, lone=True)
    for reference, cell in measured.items():
        count = len(cell.runs)
        variance, df = variances[cell.stratum]
        spread = cell.weight * variance
        t = student_t_quantile_real(level, df)
        # Two runs mirror each other: name the slower baseline run (positive part), the one to rerun.
        order = np.argsort(-cell.common) if count == 2 else np.argsort(-np.abs(cell.common))
        for i in (int(j) for j in order):
            others = [(r, v) for r, v in by_engine_run[cell.engine, cell.runs[i]] if r != reference]
            if len(others) < 2 or abs(cell.common[i]) <= t * math.sqrt(spread):
                continue
            # Var(c_i - median of others) as a sum of the strata's mean squares, for Satterthwaite's df.
            factor = median_variance_factor(len(others)) / len(others) ** 2
            terms: dict[Hashable, float] = {cell.stratum: cell.weight}
            for other, _ in others:
                stratum = measured[other].stratum
                terms[stratum] = terms.get(stratum, 0.0) + factor * measured[other].weight
            parts = [(w * variances[s][0], variances[s][1]) for s, w in terms.items()]
            total = sum(p for p, _ in parts)
            apart_df = total**2 / sum(p * p / d for p, d in parts) if total > 0 else min(d for _, d in parts)
            apart = cell.common[i] - float(np.median([v for _, v in others]))
            if abs(apart) > student_t_quantile_real(level, max(1.0, apart_df)) * math.sqrt(total):
                shift = float(cell.common[i]) * count / (count - 1)  # against the mean of the other runs
                shifted[reference] = ShiftedBaseline(run=cell.runs[i], shift=shift, cells=cell.cells, tests=tests)
                break
    return shifted


def lone_references(references: Sequence[Hashable], baselines: Sequence[Hashable]) -> set[Hashable]:
    """The references whose baseline engine served no other baseline cell (a family measured again on a fresh
    engine): :func:`shifted_baselines` can hold them only against a yardstick measured elsewhere."""
    served: dict[Hashable, set[Hashable]] = {}
    for reference, baseline in zip(references, baselines):
        served.setdefault(baseline, set()).add(reference)
    return {next(iter(refs)) for refs in served.values() if len(refs) == 1}


def _lone_baseline_cells(
    ratios_by_cell: Sequence[Mapping[Hashable, float]],
    references: Sequence[Hashable],
    baselines: Sequence[Hashable],
    yardsticks: Mapping[Hashable, EngineRunSpread],
) -> dict[Hashable, tuple[list[Hashable], np.ndarray, int]]:
    """The baseline cells :func:`shifted_baselines` judges against a yardstick: per lone reference
    (:func:`lone_references`) with a yardstick of known spread and two speculative cells over two common
    engine runs, those runs, the part of its cells' centred log ratios common to them, and how many cells
    there are. (A baseline engine with two baseline cells may have moved as a whole: engine-to-engine
    spread, which one other cell cannot tell from a disturbance of either.)"""
    lone = lone_references(references, baselines)
    by_reference: dict[Hashable, list[Mapping[Hashable, float]]] = {}
    for ratios, reference in zip(ratios_by_cell, references):
        if len(ratios) >= 2 and reference in lone and reference in yardsticks and yardsticks[reference].df:
            by_reference.setdefault(reference, []).append(ratios)
    lone = {}
    for reference, cells in by_reference.items():
        runs, logs_by_cell = _in_common_runs(cells)
        logs = [cell_logs for cell_logs in logs_by_cell if cell_logs is not None]
        # One speculative cell cannot tell its baseline's move from its own: the disagreement test judges it.
        if len(logs) >= 2 and len(runs) >= 2:
            centred = np.vstack(logs) - np.vstack(logs).mean(axis=1, keepdims=True)
            lone[reference] = (runs, centred.mean(axis=0), len(logs))
    return lone


def shift_testable(
    ratios_by_cell: Sequence[Mapping[int, float]],
    references: Sequence[Hashable],
    baselines: Sequence[Hashable],
    strata: Sequence[Hashable] | None = None,
) -> set[Hashable]:
    """The references :func:`shifted_baselines` can test (same arguments): two speculative cells or more
    over two common engine runs, and two other such cells under the same baseline engine to hold it
    against. Elsewhere a baseline run that went off alone cannot be told from the cells' own noise."""
    measured, _ = _baseline_cells(ratios_by_cell, references, baselines, strata, 0.95)
    engines = Counter(cell.engine for cell in measured.values())
    return {reference for reference, cell in measured.items() if engines[cell.engine] >= 3}


def _baseline_cells(
    ratios_by_cell: Sequence[Mapping[int, float]],
    references: Sequence[Hashable],
    baselines: Sequence[Hashable],
    strata: Sequence[Hashable] | None,
    confidence: float,
) -> tuple[dict[Hashable, _BaselineCell], dict[Hashable, tuple[float, float]]]:
    """The baseline cells with two speculative cells over two common engine runs, and per stratum the
    speculative side's residual mean square with its degrees of freedom."""
    if not len(ratios_by_cell) == len(references) == len(baselines) == len(strata or references):
        raise ValueError(f"{len(ratios_by_cell)} cells, {len(references)} references, {len(baselines)} "
                         f"baselines and {len(strata or references)} strata")
    strata = list(references) if strata is None else list(strata)
    _check_confidence(confidence)
    by_reference: dict[Hashable, list[Mapping[Hashable, float]]] = {}
    key_of: dict[Hashable, tuple[Hashable, Hashable]] = {}
    for ratios, reference, baseline, stratum in zip(ratios_by_cell, references, baselines, strata):
        if len(ratios) >= 2:
            _positive(list(ratios.values()))
            by_reference.setdefault(reference, []).append(ratios)
            key_of[reference] = (baseline, stratum)
    measured: dict[Hashable, _BaselineCell] = {}
    sums: dict[Hashable, tuple[float, int]] = {}
    for reference, cells in by_reference.items():
        runs, logs_by_cell = _in_common_runs(cells)
        logs = [cell_logs for cell_logs in logs_by_cell if cell_logs is not None]
        if len(logs) < 2 or len(runs) < 2:
            continue
        centred = np.vstack(logs) - np.vstack(logs).mean(axis=1, keepdims=True)  # cells x runs
        common = centred.mean(axis=0)
        engine, stratum = key_of[reference]
        ss, df = sums.get(stratum, (0.0, 0))
        sums[stratum] = (ss + float(np.sum((centred - common) ** 2)), df + (len(logs) - 1) * (len(runs) - 1))
        weight = (1.0 - 1.0 / len(runs)) * (1.0 + 1.0 / len(logs))
        measured[reference] = _BaselineCell(engine, runs, common, len(logs), stratum, weight)
    variances = {stratum: (ss / df, float(df)) for stratum, (ss, df) in sums.items()}
    # A stratum whose cells agree exactly has no noise to judge by (nothing measured is that quiet).
    measured = {r: c for r, c in measured.items() if variances[c.stratum][0] > 0.0}
    return measured, variances


@functools.lru_cache(maxsize=None)
def median_variance_factor(n: int) -> float:
    """Var(median of n) / Var(mean of n) for independent normal values: how much less a median pins down.

    1 for n <= 2 (the median of two is their mean); 1.3475 for n = 3 (the
    median of three normals varies by 0.4487, the mean by 1/3); towards pi/2
    as n grows. Integrated numerically from the order statistics' densities
    (the middle one for odd n, the middle two's joint density for even n) on
    a grid over +-8 standard deviations, to about 1e-3.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if n <= 2:
        return 1.0
    x = np.linspace(-8.0, 8.0, 1601 if n % 2 else 1201)
    step = float(x[1] - x[0])
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    k = (n + 1) // 2
    if n % 2:
        density = math.comb(n, k) * k * cdf ** (k - 1) * (1.0 - cdf) ** (n - k) * pdf
        variance = float(np.sum(x * x * density) * step)
    else:
        # (X_(k), X_(k+1)), k = n/2: n! / ((k-1)! (k-1)!) F(a)^(k-1) (1-F(b))^(k-1) f(a) f(b), a < b.
        scale = math.factorial(n) / math.factorial(k - 1) ** 2
        # The diagonal a = b is the region's edge: half its cells lie inside.
        above = np.triu(np.ones((x.size,) * 2)) - 0.5 * np.eye(x.size)
        joint = scale * np.outer(cdf ** (k - 1) * pdf, (1.0 - cdf) ** (k - 1) * pdf) * above
        middle = (x[:, None] + x[None, :]) / 2.0
        variance = float(np.sum(middle * middle * joint) * step * step)
    return variance * n


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


def is_interval(ci_low: float | None, ci_high: float | None) -> bool:
    """Whether two ends make an interval: both known, and apart (a zero-width interval is none)."""
    return ci_low is not None and ci_high is not None and ci_low < ci_high


def lower_end(point: float, ci_low: float | None, ci_high: float | None) -> float:
    """The lower end of a speedup's interval; its point estimate where it has none (:func:`is_interval`)."""
    return cast(float, ci_low) if is_interval(ci_low, ci_high) else point


def clears(point: float, ci_low: float | None, ci_high: float | None, threshold: float = 1.0) -> bool:
    """Whether a speedup clears ``threshold``: the one rule of every "pays" (offline, serving, the K schedule).

    Its whole 95% interval must lie above the threshold, so a win inside the
    noise does not count; a speedup with no interval is judged on its point.
    """
    return lower_end(point, ci_low, ci_high) > threshold


def speedup_interval(
    ratios: Sequence[float],
    spread: EngineRunSpread,
    within: WithinNoise | None,
    *,
    confidence: float = 0.95,
    cells: int = 1,
    others: EngineRunSpread | None = None,
    flag_alpha: float | None = None,
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
    the pooled spread allows (``|ln r_i - ln r_j| > t * s * sqrt(2)``), i.e. something
    beyond ordinary engine-to-engine variation happened in one of them. The sweep asks
    it of ``cells`` cells at once, so t is taken at ``1 - (1 - confidence) / (2 cells)``
    (Bonferroni): at the per-cell level, 20 sound cells would lose one, perhaps the
    fastest, 64% of the time. ``others``: the spread of the other cells, to judge the
    cell against (default ``spread``); a cell whose runs jumped would otherwise widen
    the yardstick it is judged by.
    """
    if cells < 1:
        raise ValueError(f"cells must be >= 1, got {cells}")
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
        t = student_t_quantile_real(tail, spread.df)
        ci_half = t * spread.sd / math.sqrt(logs.size)
        rerun_half = t * spread.sd * math.sqrt(2.0 / logs.size)
        judge = others if others is not None and others.df > 0 else spread
        level = 1.0 - confidence if flag_alpha is None else flag_alpha
        # The widest of n runs' differences is the largest of n (n - 1) / 2 pairs: Bonferroni over them too
        # (with 3 runs at the cells' level alone, sound sweeps lost a cell 1.7 times as often as allowed).
        pairs = logs.size * (logs.size - 1) // 2
        t_cells = student_t_quantile_real(1.0 - level / (2 * cells * max(pairs, 1)), judge.df)
        disagree = logs.size > 1 and float(logs.max() - logs.min()) > t_cells * judge.sd * math.sqrt(2.0)
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
