"""A cell's speedup interval from its per-run ratios (:func:`speedup_interval`: a Student t interval on the log
ratios, with whether its engine runs disagree), and the one rule of every "pays" (:func:`clears`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from specbench.stats._inputs import _check_confidence, _confidence_tag, _finite_array, _positive
from specbench.stats.distributions import student_t_quantile, student_t_quantile_real
from specbench.stats.spreads import EngineRunSpread


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
