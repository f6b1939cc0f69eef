"""The engine-to-engine spread of log speedups: one engine run's spread with degrees of freedom counted in
independent engines (:func:`engine_run_spread`), each batch size's own or one fitted across batch sizes
(:func:`stratum_spreads`), and how the run term counts in the degrees of freedom (:func:`run_term_bound`)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from specbench.stats._inputs import _in_common_runs, _positive
from specbench.stats.distributions import chi_square_quantile


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
    growth = spread_growth({b: (s.sd, s.df) for b, s in measured.items()})
    if growth is None:
        return StratumSpreads(own, sources, None, None)
    slope, growth_p = growth
    spreads = dict(own)
    if growth_p >= growth_alpha and min(s.df for s in measured.values()) >= POOL_MIN_DF:
        pooled = spread_of([i for b in measured for i in cells[b]])
        for b in measured:
            if pooled.df > own[b].df:
                spreads[b], sources[b] = pooled, "pooled"
    return StratumSpreads(spreads, sources, slope, growth_p)


def spread_growth(by_batch: Mapping[Hashable, tuple[float, float]]) -> tuple[float, float] | None:
    """Whether a spread grows with the batch size: the slope of log sd on log batch size and the one-sided p-value
    of "it does not grow" (:func:`stratum_spreads`' test, which the shifted-baseline test shares).

    ``by_batch``: per batch size, an sd and its degrees of freedom. log sd = a + b log(batch) is fitted by
    weighted least squares; the log of a variance on d df varies by trigamma(d / 2) and is biased by
    digamma(d / 2) - log(d / 2) (a scaled chi-square), both allowed for, and b is tested one-sided against 0
    (z on its standard error, the variances taken as independent). Batch sizes that are not positive numbers,
    or whose sd is 0 or has no df, are left out; None where fewer than two remain.
    """
    measured = {b: v for b, v in by_batch.items() if v[1] > 0 and v[0] > 0.0 and _positive_number(b)}
    if len(measured) < 2:
        return None
    logs = {b: math.log(float(cast(float, b))) for b in measured}
    weights = {b: 1.0 / _trigamma(df / 2.0) for b, (_, df) in measured.items()}
    centre = sum(weights[b] * logs[b] for b in measured) / sum(weights.values())
    sxx = sum(weights[b] * (logs[b] - centre) ** 2 for b in measured)
    unbiased = {b: 2.0 * math.log(sd) - (_digamma(df / 2.0) - math.log(df / 2.0)) for b, (sd, df) in measured.items()}
    slope = sum(weights[b] * (logs[b] - centre) * unbiased[b] for b in measured) / sxx  # of the log variance
    return slope / 2.0, 1.0 - _normal_cdf(slope * math.sqrt(sxx))


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
