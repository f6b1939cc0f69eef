"""The merge's statistical judgements of its rows: each speedup's interval and whether its engine runs disagree,
the shifted-baseline test, the tie-excess and distribution tests, within one error budget for the flags a sound
sweep can trip by chance.

The merge (:mod:`specbench.results.merge`) reads the cell files, joins each cell's engine runs and its baselines,
and hands its rows here; the statistics themselves are :mod:`specbench.stats`'. Rows carry the merge's private
columns (``_runs``, ``_engine``, ``_baseline``, ``_reference``, ``_within``, ``_disturbed``, ``_tie_excess``,
``_draws``) that these functions read.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from specbench.results import distribution
from specbench.stats import baseline_shifts, distributions, intervals, spreads


# The exactness of a sampled cell whose distribution check exercised no draft: nothing was tested.
UNTESTED = "untested"
# One error budget for the flags that a sound sweep can trip by chance: the chance that a sweep whose
# every cell is sound loses any cell to one of them is at most SWEEP_ALPHA (Bonferroni over the four
# families; within each, Bonferroni or Holm over its cells). Each family at 0.05 on its own lost a
# sound cell in up to about 19% of sweeps (tests/benchmarks/flag_budget.py).
SWEEP_ALPHA = 0.05
FLAG_FAMILIES = ("engine runs disagree", "shifted baseline", "tie excess", "distribution")
FAMILY_ALPHA = SWEEP_ALPHA / len(FLAG_FAMILIES)


def stratum(row: Mapping[str, Any]) -> Any:
    """The batch-size stratum a speculative cell's engine-to-engine spread is estimated in: its batch size.

    The spread of a cell's log ratios grows with the batch (the noise of a batch of 8 is not that of a
    batch of 1, docs/methodology.md): one spread pooled over the sweep made the noisiest batch size's
    intervals too narrow and the quietest's too wide.
    """
    return row.get("batch_size")


def disagreement_tests(rows: Iterable[Mapping[str, Any]]) -> int:
    """How many cells the "engine runs disagree" family judges at once: every speculative cell of two engine runs
    or more, offline and serving alike (:func:`judge_speedups`, :func:`specbench.results.serving.with_serving_comparison`),
    so that the family stays within its share of the sweep's budget (:data:`FAMILY_ALPHA`)."""
    return sum(r.get("method") not in ("baseline", None) and r.get("status", "ok") == "ok"
               and (r.get("engine_runs") or len(r.get("speedup_per_engine_run") or ())) > 1 for r in rows)


def judge_speedups(speculative: Sequence[dict[str, Any]], tests: int = 0) -> None:
    """Each compared cell's speedup, its intervals and whether its engine runs disagree, in place.

    ``speculative``: the merge's offline speculative rows with their per-run ratios and engines (the private
    ``_runs``, ``_engine``, ``_baseline``, ``_within`` and ``_disturbed``). The spread behind a cell's interval is
    its batch size's (:func:`stratum`, :func:`stratum_spreads`): the stratum's own, on its own degrees of freedom,
    or a spread fitted across batch sizes where that gives the stratum more of them; a stratum where no cell has
    two engine runs falls back on the spread pooled over the sweep. The disagreement test judges a cell against
    the spread its stratum gets from the other cells (the same choice, made without it), at the family's level
    Bonferroni over ``tests`` cells (the sweep's, serving cells included: :func:`disagreement_tests`; at least
    the compared cells of ``speculative``).
    """
    pooled = _engine_spread(speculative)
    compared = max(tests, sum(len(r["speedup_per_engine_run"]) > 1 for r in speculative))
    spreads = stratum_spreads(speculative)
    for row in speculative:
        within = row.pop("_within", None)
        ratios = row["speedup_per_engine_run"]
        own = spreads[stratum(row)]
        spread = own if own.df else pooled
        others = None
        if len(ratios) > 1:  # the same choice without the cell: a cell whose runs jumped would widen its yardstick
            rest = [r for r in speculative if r is not row]
            others = stratum_spreads(rest).get(stratum(row)) if own.df else None
            others = others if others is not None and others.df else _engine_spread(rest)
        interval = intervals.speedup_interval(ratios, spread, within, cells=max(compared, 1), others=others,
                                          flag_alpha=FAMILY_ALPHA)
        # The interval's ingredients, in the terms exp(m +- t_df sd / sqrt(engine runs)); a within-engine
        # interval exp(m +- t se) stores se sqrt(engine runs), so that rebuilding it gives the same width.
        sd, df = ((spread.sd, spread.df) if spread.df else (within.se * math.sqrt(len(ratios)), within.df)
                  if within else (None, None))
        row |= {
            "speedup_log_sd": sd if interval.ci_low is not None else None,
            "speedup_df": df if interval.ci_low is not None else None,
            "baseline_engine_log_sd": spread.baseline_sd,
            "speculative_engine_log_sd": spread.engine_sd,
            "speedup": interval.point,
            "speedup_ci_low": interval.ci_low,
            "speedup_ci_high": interval.ci_high,
            "speedup_rerun_low": interval.rerun_low,
            "speedup_rerun_high": interval.rerun_high,
            "speedup_ci_method": interval.method,
        }
        if interval.engine_runs_disagree:
            row["flag_reasons"] = (row.get("flag_reasons") or []) + [
                "engine runs disagree: " + ", ".join(f"{r:.2f}x" for r in ratios)
                + f" (beyond the engine-to-engine spread the other cells give batch {stratum(row)}, at "
                f"{FAMILY_ALPHA:g} Bonferroni over {compared} cells)"
            ]


def stratum_spreads(speculative: Sequence[dict[str, Any]]) -> dict[Any, spreads.EngineRunSpread]:
    """Per batch size (:func:`stratum`), the engine-to-engine spread behind its cells' intervals: its own, or one
    fitted across batch sizes where that gives it more degrees of freedom (:func:`spreads.stratum_spreads`), from
    the cells that measured the machine's spread (:func:`_engine_spread`: disturbed cells stay out). A batch size
    whose undisturbed cells have no two engine runs gets its own cells' spread, disturbed ones included (df 0
    where none has two runs: :func:`judge_speedups` falls back on the sweep's).
    """
    cells = [r for r in speculative if not r.get("_disturbed")]
    fitted = spreads.stratum_spreads([dict(zip(r["_runs"], r["speedup_per_engine_run"])) for r in cells],
                                   engines=[r["_engine"] for r in cells], baselines=[r["_baseline"] for r in cells],
                                   batches=[stratum(r) for r in cells]).spreads
    by_stratum = {}
    for row in speculative:
        key = stratum(row)
        if key not in by_stratum:
            found = fitted.get(key)
            by_stratum[key] = found if found is not None and found.df else _engine_spread(
                [r for r in speculative if stratum(r) == key])
    return by_stratum


def judge_baselines(rows: Sequence[dict[str, Any]], speculative: Sequence[dict[str, Any]]) -> None:
    """Flag every baseline cell one of whose engine runs moved all its speculative cells together
    (:func:`baseline_shifts.shifted_baselines`, each workload x batch size x temperature judged by its own noise, or
    by its workload x temperature's batch sizes together where that noise is not shown to grow with the batch), and
    those cells: disturbed, they leave verdicts and the spread. Every speculative cell of two engine runs
    or more records whether its baseline could be tested (``baseline_shift_checked``; it cannot with one
    speculative configuration per baseline, or fewer than three testable baseline cells per engine).

    Cells that other processes disturbed, or that ran on other hardware, are flagged already and stay out:
    they would inflate the noise every other cell of their stratum is judged by. The baseline is flagged
    too, so that ``remeasure=flagged`` measures it again with its cells.
    """
    compared = [r for r in speculative if len(r["speedup_per_engine_run"]) > 1 and r.get("_reference")
                and not r.get("_disturbed")]
    columns = ([dict(zip(r["_runs"], r["speedup_per_engine_run"])) for r in compared],
               [r["_reference"] for r in compared], [r["_baseline"] for r in compared],
               [(r.get("workload"), r.get("batch_size"), r.get("temperature") or 0.0) for r in compared])
    # A workload x temperature's batch sizes share one residual variance unless it grows with the batch.
    pools = [((r.get("workload"), r.get("temperature") or 0.0), stratum(r)) for r in compared]
    # One speculative engine serves its configuration's cells at every batch size: their residuals share its deviation.
    engines = [r["_engine"] for r in compared]
    testable = baseline_shifts.shift_testable(*columns, pools=pools, engines=engines)
    yardsticks = _yardsticks(compared, testable)
    for row in speculative:
        if len(row["speedup_per_engine_run"]) > 1:
            row["baseline_shift_checked"] = row.get("_reference") in testable or row.get("_reference") in yardsticks
    shifted = baseline_shifts.shifted_baselines(*columns, confidence=1.0 - FAMILY_ALPHA, yardsticks=yardsticks,
                                                pools=pools, engines=engines)
    if not shifted:
        return
    baselines = [r for r in rows if r.get("method") == "baseline" and r.get("config_hash") in shifted]
    run_number = {key: n for r in compared for key, n in zip(r["_runs"], r["_run_numbers"])}
    for row, reference in [(r, r["_reference"]) for r in compared] + [(r, r["config_hash"]) for r in baselines]:
        found = shifted.get(reference)
        if found is None:
            continue
        # A ratio is baseline time over speculative time: the baseline's run took exp(shift) of its others.
        pace = (f"{math.expm1(found.shift):.0%} slower" if found.shift >= 0
                else f"{-math.expm1(found.shift):.0%} faster")
        beyond = ("beyond the engine-to-engine spread of the other baseline engines' cells (its engine served "
                  "too few other baseline cells to hold it against)" if found.lone else
                  f"and its engine's other cells did not: all {found.cells} speculative cells measured against it "
                  "moved together, beyond their own run-to-run spread")
        row["flag_reasons"] = (row.get("flag_reasons") or []) + [
            f"engine run {run_number[found.run]} of the baseline ran {pace} than its other runs, {beyond} "
            f"(at {FAMILY_ALPHA:g}, Bonferroni over {found.tests} baseline cells)"
        ]
        row["_disturbed"] = True


def _yardsticks(compared: Sequence[dict[str, Any]], testable: set[Any]) -> dict[Any, spreads.EngineRunSpread]:
    """Per baseline cell the shifted-baseline test cannot hold against its engine's other cells (the only one its
    baseline engine served, :func:`baseline_shifts.lone_references`: a family measured again), the spread of one
    engine run measured on the cells of other baseline engines (:func:`baseline_shifts.shifted_baselines`' yardsticks):
    those of its batch size where they measured one, else all of them. None is given where no other baseline
    engine measured a spread: a fresh engine's deviation then cannot be told from a disturbance.
    """
    yardsticks = {}
    lone = baseline_shifts.lone_references([r["_reference"] for r in compared], [r["_baseline"] for r in compared])
    for reference in dict.fromkeys(r["_reference"] for r in compared if r["_reference"] in lone - testable):
        mine = [r for r in compared if r["_reference"] == reference]
        if len(mine) < 2:  # one speculative cell cannot tell its baseline's move from its own
            continue
        others = [r for r in compared if r["_baseline"] not in {m["_baseline"] for m in mine}]
        same = [r for r in others if stratum(r) == stratum(mine[0])]
        spread = _engine_spread(same)
        spread = spread if spread.df else _engine_spread(others)
        if spread.df:
            yardsticks[reference] = spread
    return yardsticks


def _engine_spread(speculative: Sequence[dict[str, Any]]) -> spreads.EngineRunSpread:
    """The machine's engine-to-engine spread (:func:`spreads.engine_run_spread`), from the cells that measured it.

    A cell whose baseline or engine another process disturbed, or that ran on other hardware, measured
    something else, and would widen every other cell's interval (it is flagged itself). Where no
    undisturbed cell has two engine runs, the disturbed ones are all there is: their own spread, however
    wide, beats an interval from the repetitions of one engine, which knows nothing of engine runs.
    """
    for cells in ([r for r in speculative if not r.get("_disturbed")], list(speculative)):
        spread = spreads.engine_run_spread([dict(zip(r["_runs"], r["speedup_per_engine_run"])) for r in cells],
                                         engines=[r["_engine"] for r in cells],
                                         baselines=[r["_baseline"] for r in cells])
        if spread.df:
            return spread
    return spread


def judge_distributions(rows: Sequence[dict[str, Any]]) -> None:
    """Test every checked cell of the sweep in distribution, Holm-adjust the p-values, and fail those below alpha.

    A sweep checks many sampled cells: at 0.05 each, one of sixteen exact ones
    would fail by chance more often than not. Holm's step-down keeps the chance
    of failing any exact cell at most the family's share of the error budget
    (:data:`FAMILY_ALPHA`). So the test runs with permutations enough for m
    cells at that level (:func:`distribution.permutations_for`), and its power
    is stated at FAMILY_ALPHA / m, where Holm judges a lone deviating cell,
    for a defect that moves only the positions a verify pass with a draft
    decided (:func:`distribution.verified_share`). A failed cell's exactness is
    "mismatch": flagged, warned about and left out of verdicts as an inexact
    greedy cell is. A cell that passes with a power unknown or weaker than
    :data:`distribution.MAX_DETECTABLE_TV` is "untested", with a caveat: its
    pass says little.
    """
    checked = [r for r in rows if r.get("_draws") is not None]
    if not checked:
        return
    permutations = distribution.permutations_for(len(checked), alpha=FAMILY_ALPHA)
    for row in checked:
        theirs, mine, tokens = row.pop("_draws")
        row["distribution_p_value"] = distribution.permutation_p_value(
            theirs, mine, tokens=tokens, permutations=permutations)
        share = distribution.verified_share(mine, tokens, row.get("distribution_drafts"),
                                            row.get("distribution_accepted_tokens"))
        row["distribution_power_tv"] = distribution.detectable_deviation(
            theirs, [len(s) for s in mine], tokens=tokens, alpha=FAMILY_ALPHA / len(checked),
            verified=share)
    for row, adjusted in zip(checked, distribution.holm([r["distribution_p_value"] for r in checked])):
        row["distribution_p_adjusted"] = adjusted
        power = row["distribution_power_tv"]
        if adjusted < FAMILY_ALPHA:
            row["exactness"] = "mismatch"
            row["flag_reasons"] = (row.get("flag_reasons") or []) + [
                f"samples differ in distribution from the baseline's (p = {row['distribution_p_value']:.2g}, "
                f"Holm-adjusted over {len(checked)} cells {adjusted:.2g}, at {FAMILY_ALPHA:g}): speculative "
                "sampling should be exact in distribution, so this speedup is not of the same work"
            ]
        elif power is None or power > distribution.MAX_DETECTABLE_TV:
            row["exactness"] = UNTESTED
            reach = ("no deviation up to a total-variation distance of "
                     f"{distribution.DEVIATIONS[-1]:g}" if power is None else f"only deviations of {power:g} or more")
            row["caveats"] = (row.get("caveats") or []) + [
                f"not checked in distribution: the check passed (p = {row['distribution_p_value']:.2g}) but "
                f"detects {reach} (total variation at the positions a draft decided, 80% power), weaker than "
                f"the {distribution.MAX_DETECTABLE_TV:g} a check must reach to count"
            ]


def judge_tie_excess(rows: Sequence[dict[str, Any]]) -> None:
    """Flag the cells that tie significantly more often than plain decoding does, Holm-adjusted over the
    sweep's cells with ties (the chance of flagging any cell whose ties are numerics stays at most 0.05).

    A decoder that goes wrong only where the target is uncertain passes the per-request tie rule on every
    request it gets wrong; only its excess of ties over the control's rate shows it.
    """
    tested = [r for r in rows if r.get("_tie_excess") is not None]
    for row, adjusted in zip(tested, distribution.holm([r["_tie_excess"][0] for r in tested])):
        p_value, counts = row["_tie_excess"]
        if adjusted < FAMILY_ALPHA:
            row["flag_reasons"] = (row.get("flag_reasons") or []) + [
                f"{counts} (one-sided McNemar p = {p_value:.2g}, Holm-adjusted over {len(tested)} cells "
                f"{adjusted:.2g}): more ties than numerics explain, so some may be wrong tokens"
            ]


def within_noise(base: Mapping[str, Any], spec: Mapping[str, Any]) -> intervals.WithinNoise | None:
    """The repetitions' noise on a ratio of two medians; None when a side has one repetition.

    A median of n varies more than a mean of n (by :func:`distributions.median_variance_factor`: 1.35 times
    the variance for n = 3), and each side's speedup is a median of its repetitions.
    """
    variance, df = 0.0, 0
    for side in (base, spec):
        cv, n = side.get("wall_time_s_cv"), len(side.get("wall_time_s_reps") or [])
        if cv is None or n < 2:
            return None
        variance += distributions.median_variance_factor(n) * cv * cv / n
        df += n - 1
    return intervals.WithinNoise(se=math.sqrt(variance), df=df)
