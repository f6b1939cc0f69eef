"""The shifted-baseline test: a baseline cell one of whose engine runs moved every speculative cell measured
against it (:func:`shifted_baselines`), and which baseline cells it can test (:func:`shift_testable`,
:func:`lone_references`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specbench.stats._inputs import _check_confidence, _in_common_runs, _positive
from specbench.stats.distributions import chi_square_quantile, median_variance_factor, student_t_quantile_real
from specbench.stats.spreads import GROWTH_ALPHA, RUN_TERM_LEVEL, EngineRunSpread, spread_growth


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
    pools: Sequence[tuple[Hashable, Hashable]] | None = None,
    engines: Sequence[Hashable] | None = None,
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
    references. ``pools``: per cell, (its pool, its batch size): the strata of
    one pool (one workload x temperature) share one mean square, on their
    summed df, where it is not shown to grow with the batch size (:func:`_pooled`,
    the intervals' rule); without ``pools`` each stratum keeps its own. A baseline cell that varied as a speculative one does would
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
    measured, variances = _baseline_cells(ratios_by_cell, references, baselines, strata, confidence, pools, engines)
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
    pools: Sequence[tuple[Hashable, Hashable]] | None = None,
    engines: Sequence[Hashable] | None = None,
) -> set[Hashable]:
    """The references :func:`shifted_baselines` can test (same arguments): two speculative cells or more
    over two common engine runs, and two other such cells under the same baseline engine to hold it
    against. Elsewhere a baseline run that went off alone cannot be told from the cells' own noise."""
    measured, _ = _baseline_cells(ratios_by_cell, references, baselines, strata, 0.95, pools, engines)
    engines = Counter(cell.engine for cell in measured.values())
    return {reference for reference, cell in measured.items() if engines[cell.engine] >= 3}


def _baseline_cells(
    ratios_by_cell: Sequence[Mapping[int, float]],
    references: Sequence[Hashable],
    baselines: Sequence[Hashable],
    strata: Sequence[Hashable] | None,
    confidence: float,
    pools: Sequence[tuple[Hashable, Hashable]] | None = None,
    engines: Sequence[Hashable] | None = None,
) -> tuple[dict[Hashable, _BaselineCell], dict[Hashable, tuple[float, float]]]:
    """The baseline cells with two speculative cells over two common engine runs, and per stratum the
    speculative side's residual mean square with its degrees of freedom (pooled over the batch sizes of a
    pool where :func:`_pooled` allows)."""
    if not len(ratios_by_cell) == len(references) == len(baselines) == len(strata or references) == len(
            pools or references) == len(engines or references):
        pooled = "" if pools is None else f" and {len(pools)} pools"
        raise ValueError(f"{len(ratios_by_cell)} cells, {len(references)} references, {len(baselines)} "
                         f"baselines and {len(strata or references)} strata{pooled}")
    strata = list(references) if strata is None else list(strata)
    _check_confidence(confidence)
    by_reference: dict[Hashable, list[Mapping[Hashable, float]]] = {}
    engines_of: dict[Hashable, list[Hashable]] = {}
    key_of: dict[Hashable, tuple[Hashable, Hashable]] = {}
    for i, (ratios, reference, baseline, stratum) in enumerate(zip(ratios_by_cell, references, baselines, strata)):
        if len(ratios) >= 2:
            _positive(list(ratios.values()))
            by_reference.setdefault(reference, []).append(ratios)
            engines_of.setdefault(reference, []).append(engines[i] if engines is not None else ("cell", i))
            key_of[reference] = (baseline, stratum)
    measured: dict[Hashable, _BaselineCell] = {}
    sums: dict[Hashable, tuple[float, int]] = {}
    # Per stratum, each speculative engine's residual in each engine run: one engine serves its configuration's
    # cells at every batch size, so their residuals share its deviation (:func:`_pooled` counts the df so).
    residuals: dict[Hashable, dict[tuple[Hashable, Hashable], float]] = {}
    for reference, cells in by_reference.items():
        runs, logs_by_cell = _in_common_runs(cells)
        logs = [cell_logs for cell_logs in logs_by_cell if cell_logs is not None]
        if len(logs) < 2 or len(runs) < 2:
            continue
        centred = np.vstack(logs) - np.vstack(logs).mean(axis=1, keepdims=True)  # cells x runs
        common = centred.mean(axis=0)
        engine, stratum = key_of[reference]
        kept = [e for e, cell_logs in zip(engines_of[reference], logs_by_cell) if cell_logs is not None]
        for spec_engine, row in zip(kept, centred - common):
            for run, value in zip(runs, row):
                residuals.setdefault(stratum, {})[spec_engine, run] = float(value)
        ss, df = sums.get(stratum, (0.0, 0))
        sums[stratum] = (ss + float(np.sum((centred - common) ** 2)), df + (len(logs) - 1) * (len(runs) - 1))
        weight = (1.0 - 1.0 / len(runs)) * (1.0 + 1.0 / len(logs))
        measured[reference] = _BaselineCell(engine, runs, common, len(logs), stratum, weight)
    variances = {stratum: (ss / df, float(df)) for stratum, (ss, df) in sums.items()}
    if pools is not None:
        variances = _pooled(variances, dict(zip(strata, pools)), residuals)
    # A stratum whose cells agree exactly has no noise to judge by (nothing measured is that quiet).
    measured = {r: c for r, c in measured.items() if variances[c.stratum][0] > 0.0}
    return measured, variances


def _pooled(variances: Mapping[Hashable, tuple[float, float]], pool_of: Mapping[Hashable, tuple[Hashable, Hashable]],
            residuals: Mapping[Hashable, Mapping[tuple[Hashable, Hashable], float]]) -> dict[Hashable, tuple[float, float]]:
    """Per stratum, its residual mean square and df, or those pooled over the strata of its pool (one workload x
    temperature at every batch size) where the spread is not shown to grow with the batch.

    The rule the intervals follow across batch sizes (:func:`spreads.stratum_spreads`): the one-sided slope test of
    log sd on log batch size (:func:`spreads.spread_growth`), pooled at p >= :data:`spreads.GROWTH_ALPHA`. Unlike
    the intervals' spread, the residual holds no baseline engine's deviation (it cancels within a baseline cell),
    so a batch size's few df are not the baseline engine's few draws counted again, and no minimum df is asked of
    each stratum. A stratum's own (E-1)(R-1) df are few (2 with two configurations in three engine runs), and the
    t quantile at the Bonferroni level on them is in the tens: the test could not find a baseline run 3x slow.

    The pooled df are not the strata's sum where the same speculative engines serve every batch size: their
    deviation in a run (v) is one draw that each stratum's residual repeats. The pooled sum of squares splits into
    the part the strata share, per engine and run the residuals' mean (v + e / B, about (E-1)(R-1) df), and the
    rest (the cells' own, e); the pooled mean square's df are Satterthwaite's over the two, near (E-1)(R-1) where
    the engines' deviation dominates and near the sum where the cells' own noise does. (Summed, 2,000 sound small
    sweeps whose engines' deviation dominated lost a baseline cell 2.8% of the time at a share of 1.25%:
    tests/benchmarks/shift_power.py.)
    """
    groups: dict[Hashable, dict[Hashable, Hashable]] = {}
    for stratum, (pool, batch) in pool_of.items():
        if variances.get(stratum, (0.0, 0.0))[0] > 0.0:  # a stratum with no noise stays out (below)
            groups.setdefault(pool, {})[batch] = stratum
    pooled = dict(variances)
    for by_batch in groups.values():
        growth = spread_growth({b: (math.sqrt(variances[s][0]), variances[s][1]) for b, s in by_batch.items()})
        if growth is None or growth[1] < GROWTH_ALPHA:
            continue
        ss = sum(variances[s][0] * variances[s][1] for s in by_batch.values())
        total_df = sum(variances[s][1] for s in by_batch.values())
        df = total_df
        shared: dict[tuple[Hashable, Hashable], list[float]] = {}
        for s in by_batch.values():
            for key, value in residuals.get(s, {}).items():
                shared.setdefault(key, []).append(value)
        shared = {key: values for key, values in shared.items() if len(values) >= 2}
        engines, runs = {e for e, _ in shared}, {r for _, r in shared}
        shared_df = int(min(total_df, max(0, len(shared) - len(engines) - len(runs) + 1)))
        if shared_df:
            between = min(ss, sum(len(v) * float(np.mean(v)) ** 2 for v in shared.values()))
            # Counted at its upper bound (as spreads.run_term_bound counts an engine run's term): Satterthwaite's df
            # on the observed parts are too kind exactly when the shared part came out small.
            bound = shared_df / chi_square_quantile(RUN_TERM_LEVEL, shared_df)
            parts = [(between * bound, shared_df), (ss - between, total_df - shared_df)]
            used = [(p, d) for p, d in parts if d > 0 and p > 0.0]
            df = sum(p for p, _ in used) ** 2 / sum(p * p / d for p, d in used) if used else total_df
        for stratum in by_batch.values():
            pooled[stratum] = (ss / total_df, df)
    return pooled
