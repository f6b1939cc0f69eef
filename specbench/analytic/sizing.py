"""Cells sized by the precision they need: how many prompts a cell serves, from a target half-width.

A speedup measured on a workload is uncertain for two reasons, and only one
of them shrinks with the prompts a cell serves:

- **the engines**: every engine run starts fresh engines, and a fresh engine
  runs a few percent faster or slower than its twin (the engine lottery,
  docs/methodology.md). One run's log speedup carries its baseline engine's
  deviation and its speculative engine's, ``sqrt(2) * engine_sd``; the cell's
  95% interval is ``t * sqrt(2) * engine_sd / sqrt(R)`` over R engine runs.
  When the engines, not the cells, vary, the interval's degrees of freedom
  fall towards R - 1 at one speculative engine per baseline engine, more with
  more of them (:func:`engine_df`, :func:`specbench.stats.spreads.engine_run_spread`):
  t is 12.7 at two runs of one. More prompts, tokens or repetitions do not
  narrow it; more engine runs do.
- **the prompts**: prompts differ in how much of the draft the target
  accepts, so a cell's speedup is that of its prompts, a sample of the
  workload's: ``z * prompt_sd / sqrt(n)`` at n prompts, whatever the batch
  size (a batch of 1 serves n requests one by one, a batch of n serves them
  at once: the same n prompts).

The two combine in quadrature into the half-width the cell is sized for
(:func:`expected_half_width`). A cell at batch b serves the fewest prompts n
that meet the target (:func:`prompts_needed`), rounded up to whole batches
and never fewer than one batch (:func:`cell_prompts`): batch 1 no longer
serves the 128 prompts a batch of 128 needs. The prompts are then the first
n of the source (``workload.selection`` first), so a smaller cell's prompts
are a prefix of a larger cell's, and a speculative cell and its baseline
always serve the same ones.

Pure: numbers in, numbers out; :func:`sized` applies it to a resolved config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from specbench.stats import distributions, spreads

CONFIDENCE = 0.95
# The normal quantile of the prompts' term: a sample of prompts, many degrees of freedom.
_Z = 1.959963984540054


@dataclass
class PrecisionSchema:
    """Types of ``precision.*`` (conf/config.yaml holds the values and what each means)."""

    half_width: Optional[float] = None  # target relative 95% half-width of a cell's speedup; null: no sizing
    prompt_sd: float = 0.2  # log SD of one prompt's speedup around the workload's
    engine_sd: float = 0.03  # log SD of one fresh engine's speed around its twins'
    min_prompts: int = 8  # the fewest prompts a sized cell serves
    speculative_engines: int = 1  # speculative engines per baseline engine in an engine run (the engines' df)


@dataclass(frozen=True)
class Precision:
    """The sizing's inputs, read from ``precision.*``."""

    half_width: float | None
    prompt_sd: float
    engine_sd: float
    min_prompts: int
    speculative_engines: int = 1

    @classmethod
    def from_config(cls, plain: Mapping[str, Any]) -> Precision:
        """``precision.*`` of a resolved config (the schema's defaults where a key is absent)."""
        given = plain.get("precision") or {}
        default = PrecisionSchema()
        return cls(given.get("half_width", default.half_width), float(given.get("prompt_sd", default.prompt_sd)),
                   float(given.get("engine_sd", default.engine_sd)),
                   int(given.get("min_prompts", default.min_prompts)),
                   int(given.get("speculative_engines", default.speculative_engines)))


def engine_df(engine_runs: int, speculative_engines: int = 1) -> float:
    """Degrees of freedom of the engines' term, as :func:`specbench.stats.spreads.engine_run_spread` counts them
    when the baseline engine and each speculative engine deviate alike and the cells do not.

    Satterthwaite's over its two mean squares at their expectations (u = v, e = 0): with S speculative
    engines per baseline engine and R runs, ``(R - 1) (a + b)^2 / (a^2 + b^2 / (S - 1))`` with
    ``a = k (1 + 1/S)``, ``b = 1 - 1/S`` and ``k`` the merge's :func:`specbench.stats.spreads.run_term_bound` (the
    run mean square counted at its upper bound on one df: 6.7 at two runs, 1 from three on); R - 1 for one
    speculative engine (every cell shares every deviation).
    """
    if engine_runs < 2:
        return 0.0
    s = max(1, speculative_engines)
    if s == 1:
        return float(engine_runs - 1)
    a = spreads.run_term_bound(engine_runs - 1) * (1.0 + 1.0 / s)
    b = 1.0 - 1.0 / s
    return (engine_runs - 1) * (a + b) ** 2 / (a ** 2 + b ** 2 / (s - 1))


def engine_half_width(engine_sd: float, engine_runs: int, speculative_engines: int = 1) -> float:
    """The 95% half-width (log scale) the engines alone leave a cell's speedup over ``engine_runs`` runs.

    ``t(df) * sqrt(2) * engine_sd / sqrt(R)``, df from :func:`engine_df`: infinite for one run (no interval).
    """
    if engine_runs < 2:
        return math.inf
    t = distributions.student_t_quantile_real((1.0 + CONFIDENCE) / 2.0, engine_df(engine_runs, speculative_engines))
    return t * math.sqrt(2.0) * engine_sd / math.sqrt(engine_runs)


def prompt_half_width(prompt_sd: float, prompts: int) -> float:
    """The 95% half-width (log scale) of a speedup measured on ``prompts`` prompts of a workload."""
    if prompts < 1:
        raise ValueError(f"prompts must be >= 1, got {prompts}")
    return _Z * prompt_sd / math.sqrt(prompts)


def expected_half_width(precision: Precision, prompts: int, engine_runs: int) -> float:
    """The half-width a cell of ``prompts`` prompts and ``engine_runs`` runs is expected to get (both terms)."""
    return math.hypot(engine_half_width(precision.engine_sd, engine_runs, precision.speculative_engines),
                      prompt_half_width(precision.prompt_sd, prompts))


def prompts_needed(precision: Precision, half_width: float, engine_runs: int, available: int) -> int:
    """The fewest prompts (at least ``min_prompts``, at most ``available``) whose cell meets ``half_width``.

    ``available`` when no number of prompts does (the engines' term alone reaches the target).
    """
    engines = engine_half_width(precision.engine_sd, engine_runs, precision.speculative_engines)
    if engines >= half_width:
        return available
    if precision.prompt_sd == 0.0:
        return min(precision.min_prompts, available)
    room = math.sqrt(half_width**2 - engines**2)
    return max(1, min(available, max(precision.min_prompts, math.ceil((_Z * precision.prompt_sd / room) ** 2))))


def cell_prompts(batch_size: int, needed: int, available: int) -> int:
    """Prompts a cell at ``batch_size`` serves: ``needed`` rounded up to whole batches, at least one batch,
    at most ``available`` (the workload's num_prompts, the largest batch's)."""
    batches = max(1, math.ceil(needed / batch_size))
    return min(available, batches * batch_size)


def is_sizable(plain: Mapping[str, Any]) -> bool:
    """Whether sizing applies: an offline cell (a serving cell's size is load.num_requests) of a counted workload."""
    num_prompts = (plain.get("workload") or {}).get("num_prompts")
    serving = (plain.get("load") or {}).get("request_rate") is not None
    return not serving and isinstance(num_prompts, int) and not isinstance(num_prompts, bool)


def sized(plain: dict[str, Any], half_width: float | None = None) -> dict[str, Any]:
    """A resolved config with its cell sized: ``workload.num_prompts`` the prompts its precision needs.

    ``half_width`` overrides ``precision.half_width`` (the budget's search prices other targets);
    unchanged where neither sets one or sizing does not apply (:func:`is_sizable`). A sized cell takes
    the first prompts of its source, so every cell of a workload serves a prefix of the same list.
    """
    precision = Precision.from_config(plain)
    target = precision.half_width if half_width is None else half_width
    if target is None or not is_sizable(plain):
        return plain
    workload = plain["workload"]
    available = int(workload["num_prompts"])
    needed = prompts_needed(precision, float(target), int(plain["engine_runs"]), available)
    prompts = cell_prompts(int(plain["batch_size"]), needed, available)
    return dict(plain, workload=dict(workload, num_prompts=prompts, selection="first"))


def problems(plain: Mapping[str, Any]) -> list[str]:
    """``precision.*`` and ``budget`` values that cannot be used, one message each naming key and range."""
    errors: list[str] = []
    given = plain.get("precision") or {}
    half_width = given.get("half_width")
    if half_width is not None and not (_real(half_width) and 0.0 < half_width < 1.0):
        errors.append(f"precision.half_width={half_width!r} must be null or a number in (0, 1) "
                      "(a relative half-width: 0.1 is +-10%)")
    for key in ("prompt_sd", "engine_sd"):
        value = given.get(key, 0.0)
        if not (_real(value) and 0.0 <= value < 10.0):
            errors.append(f"precision.{key}={value!r} must be a number >= 0 (a log standard deviation)")
    for key in ("min_prompts", "speculative_engines"):
        low = given.get(key, 1)
        if not (isinstance(low, int) and not isinstance(low, bool) and low >= 1):
            errors.append(f"precision.{key}={low!r} must be an integer >= 1")
    budget = plain.get("budget")
    if budget is not None and not (_real(budget) and budget > 0):
        errors.append(f"budget={budget!r} must be null or minutes > 0")
    return errors


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
