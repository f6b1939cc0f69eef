"""Do the page's speedup intervals hold at every batch size, and does choosing the best of several pay for itself?

Prints figures; asserts nothing (tests/test_results.py and tests/test_verdicts.py assert the same properties on
fewer draws, as do tests/test_stats.py). No engine, about ten minutes at the default:

    .venv/bin/python tests/benchmarks/interval_coverage_sim.py [TRIALS [SELECTION_TRIALS]]
    .venv/bin/python tests/benchmarks/interval_coverage_sim.py df [TRIALS]

(TRIALS sweeps per coverage setting, default 1,000; SELECTION_TRIALS per selection setting, default TRIALS.)

**The baseline engine's df** (``df``). Per batch size at 2 and 3 engine runs (and as make demo), baseline-engine
sd 0.02, 0.05 and 0.15: misses and median width before and after counting the run mean square at its upper
bound in the spread's df (``stats.spreads.run_term_bound``).

**Coverage by batch size.** Simulated sweeps as in tests/benchmarks/flag_budget.py: one baseline engine, 4
speculative configurations, 2 workloads x 3 batch sizes, 3 engine runs. Log speedup of a cell in a run: log
1.5 + u (the baseline engine, sd 0.02, 0.05 or 0.15) + w (the baseline cell, sd sqrt(0.02^2 + 0.02^2)) - v
(the speculative engine, 0.02) + e (the cell, 0.02), every term but u scaled by its batch size's noise (x1,
x1.5, x3). The rows go through ``results.judging.judge_speedups``, the code that makes the page's intervals:
"fitted" as it is (each batch size's own spread, or the spread pooled over batch sizes where it does not
grow with the batch and that has more df: ``stats.spreads.stratum_spreads``), "own" with each batch size's own spread
only (``coverage(..., spreads="own")``; ``pooled=True``: every cell in one stratum). Per batch size and
setting: how often the 95% interval misses the true speedup (1.5x), the median width of the interval (log of
high over low), the median df and how often a sound sweep has a cell whose engine runs disagree.

**As make demo.** The same, with 4 configurations x 2 workloads at batch 1 and 4 and 2 engine runs, noise
x1 / x1, x1 / x1.5 and x1 / x3.

**Choosing among configurations.** 8 configurations at batch 1 and 4, all truly 1.0x, 3 engine runs,
baseline engine sd 0.02, 0.05 or 0.15, the rest as above: the share of sweeps whose verdict
(``analytic.verdicts.verdict``) says a configuration pays, and the share in which the verdict, the best
configuration per batch size (``best_configs``) or the K schedule (``schedule_evidence``) says one pays at
either batch size; "before" judges each chosen cell on its own interval.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from typing import Any
from unittest import mock

import numpy as np

from specbench.analytic import verdicts
from specbench.results import judging

CONFIGURATIONS = 4
WORKLOADS = 2
BATCHES = (1, 4, 8)
BATCH_NOISE = (1.0, 1.5, 3.0)  # noise scale of batch sizes 1, 4, 8
RUNS = 3
BASELINE_ENGINE_SDS = (0.02, 0.05, 0.15)
ENGINE_SD = 0.02
CELL_SD = 0.02
BASELINE_CELL_SD = math.hypot(ENGINE_SD, CELL_SD)  # as noisy as a speculative cell
TRUE_SPEEDUP = 1.5


def sound_sweep(rng: np.random.Generator, baseline_sd: float, *, configurations: int = CONFIGURATIONS,
                workloads: int = WORKLOADS, batches: Sequence[int] = BATCHES,
                batch_noise: Sequence[float] = BATCH_NOISE, speedup: float = TRUE_SPEEDUP,
                runs: int = RUNS) -> list[dict[str, Any]]:
    """One simulated sweep's speculative rows as the merge holds them before it judges their speedups.

    Every configuration is one speculative engine per engine run (it serves every workload and batch size), and
    one baseline engine serves every baseline cell; the rows carry what ``judging.judge_speedups`` reads.
    """
    u = rng.normal(0, baseline_sd, runs)
    v = rng.normal(0, ENGINE_SD, (configurations, runs))
    rows = []
    for workload in range(workloads):
        for batch, scale in zip(batches, batch_noise):
            w = rng.normal(0, BASELINE_CELL_SD * scale, runs)
            for k in range(configurations):
                logs = math.log(speedup) + u + w - scale * v[k] + rng.normal(0, CELL_SD * scale, runs)
                rows.append({
                    "cell_id": f"ngram-k{k + 1}-b{batch}-w{workload}", "method": "ngram",
                    "num_speculative_tokens": k + 1, "batch_size": batch, "workload": f"w{workload}",
                    "status": "ok", "engine_runs": runs, "speedup_per_engine_run": np.exp(logs).tolist(),
                    "_runs": [f"base-{r}" for r in range(runs)], "_engine": tuple(f"k{k}-{r}" for r in range(runs)),
                    "_baseline": 0, "_within": None,
                })
    return rows


def _own_spreads(rows: Sequence[dict[str, Any]]) -> dict[Any, Any]:
    """Each batch size's own spread and nothing fitted across them (the rule before the fitted model)."""
    keys = dict.fromkeys(judging.stratum(r) for r in rows)
    return {key: judging._engine_spread([r for r in rows if judging.stratum(r) == key]) for key in keys}


def judged(rows: list[dict[str, Any]], *, pooled: bool = False, spreads: str = "fitted") -> list[dict[str, Any]]:
    """``rows`` with their speedups judged by the merge. ``spreads``: ``"fitted"`` (the merge as it is: a batch
    size's own spread, or one fitted across batch sizes where that has more df), ``"own"`` (each batch size's own
    spread only) or ``"pooled"`` (one stratum, the spread of the whole sweep; also ``pooled=True``)."""
    spreads = "pooled" if pooled else spreads
    if spreads == "pooled":
        with mock.patch.object(judging, "stratum", lambda row: None):
            judging.judge_speedups(rows)
    elif spreads == "own":
        with mock.patch.object(judging, "stratum_spreads", _own_spreads):
            judging.judge_speedups(rows)
    else:
        judging.judge_speedups(rows)
    for row in rows:
        row["flagged"] = bool(row.get("flag_reasons"))
    return rows


def coverage(trials: int, seed: int, baseline_sd: float, *, pooled: bool = False, spreads: str = "fitted",
             batches: Sequence[int] = BATCHES, batch_noise: Sequence[float] = BATCH_NOISE, runs: int = RUNS,
             configurations: int = CONFIGURATIONS, workloads: int = WORKLOADS) -> dict[int, dict[str, float]]:
    """Per batch size: the share of cells whose interval misses the true speedup, the median log width, the
    median df, and the share of sweeps with a cell flagged for disagreeing engine runs (``pooled``, ``spreads``:
    :func:`judged`; the rest: :func:`sound_sweep`)."""
    rng = np.random.default_rng(seed)
    misses: dict[int, list[bool]] = {b: [] for b in batches}
    widths: dict[int, list[float]] = {b: [] for b in batches}
    dfs: dict[int, list[float]] = {b: [] for b in batches}
    flagged: dict[int, int] = dict.fromkeys(batches, 0)
    for _ in range(trials):
        sweep = sound_sweep(rng, baseline_sd, configurations=configurations, workloads=workloads, batches=batches,
                            batch_noise=batch_noise, runs=runs)
        rows = judged(sweep, pooled=pooled, spreads=spreads)
        for batch in batches:
            here = [r for r in rows if r["batch_size"] == batch]
            misses[batch] += [not r["speedup_ci_low"] <= TRUE_SPEEDUP <= r["speedup_ci_high"] for r in here]
            widths[batch] += [math.log(r["speedup_ci_high"] / r["speedup_ci_low"]) for r in here]
            dfs[batch] += [r["speedup_df"] for r in here]
            flagged[batch] += any(r["flagged"] for r in here)
    return {b: {"miss": float(np.mean(misses[b])), "width": statistics.median(widths[b]),
                "df": statistics.median(dfs[b]), "disagree": flagged[b] / trials} for b in batches}


def selection_sweep(rng: np.random.Generator, baseline_sd: float = 0.05) -> list[dict[str, Any]]:
    """8 configurations at batch 1 and 4, all truly 1.0x, judged by the merge: the rows a verdict reads."""
    rows = judged(sound_sweep(rng, baseline_sd, configurations=8, workloads=1, batches=(1, 4),
                              batch_noise=(1.0, 1.5), speedup=1.0))
    for row in rows:
        row["exactness"] = "exact"
    return rows


def says_pays(rows: list[dict[str, Any]]) -> tuple[bool, bool]:
    """Whether the verdict says anything pays, and whether anything says so at any batch size: the verdict,
    the best configuration per batch size or the K schedule."""
    grid = verdicts.Grid.of(rows)
    verdict = verdicts.verdict(rows, grid).pays
    table = any(verdicts.best_row([r for r in rows if r["batch_size"] == b.batch])[1]  # type: ignore[index]
                for b in verdicts.best_configs(rows, grid) if b.top is not None)
    evidence = {b: [r for r in rows if r["batch_size"] == b] for b in (1, 4)}
    schedule, _ = verdicts.schedule_evidence(evidence, rows, grid)
    return verdict, verdict or table or any(k for k, _ in schedule.values())


def false_pays(trials: int, seed: int, *, baseline_sd: float = 0.05) -> tuple[float, float]:
    """Of sweeps of 8 configurations all truly 1.0x: the share whose verdict says something pays, and the share
    in which anything (verdict, best configuration per batch size, K schedule) says so at some batch size."""
    rng = np.random.default_rng(seed)
    found = [says_pays(selection_sweep(rng, baseline_sd)) for _ in range(trials)]
    return sum(v for v, _ in found) / trials, sum(a for _, a in found) / trials


DEMO = {"batches": (1, 4), "runs": 2, "configurations": 4, "workloads": 2}  # make demo: 8 cells per batch size
DEMO_NOISE = ((1.0, 1.0), (1.0, 1.5), (1.0, 3.0))


def _line(label: str, before: dict[str, float], after: dict[str, float]) -> str:
    return (f"  {label}: own miss {before['miss']:.1%} width {before['width']:.3f} df {before['df']:.1f} "
            f"disagree {before['disagree']:.1%} | fitted miss {after['miss']:.1%} width {after['width']:.3f} "
            f"df {after['df']:.1f} disagree {after['disagree']:.1%} (width x{after['width'] / before['width']:.2f})")


def uncounted() -> Any:
    """The engine-to-engine spread's df as counted before a run mean square on one df was held at its upper
    bound (``stats.spreads.run_term_bound``): Satterthwaite's df on the observed mean squares alone."""
    return mock.patch("specbench.stats.spreads.run_term_bound", lambda df: 1.0)


def baseline_df(trials: int) -> None:
    """Per stratum at 2 and 3 engine runs: misses and median width with the run mean square counted at its
    bound, against Satterthwaite's plug-in df (before)."""
    print(f"The baseline engine's deviation in the df, {trials} sound sweeps per setting ({CONFIGURATIONS} "
          f"configurations x {WORKLOADS} workloads per batch size): before (Satterthwaite's df on the observed "
          "mean squares) -> after (the run mean square counted at its upper bound, stats.spreads.run_term_bound):")
    settings: list[tuple[str, dict[str, Any]]] = [
        (f"{runs} engine runs", {"runs": runs}) for runs in (2, 3)]
    settings += [(f"as make demo, noise x{n[0]:g} / x{n[1]:g}", dict(DEMO, batch_noise=n)) for n in DEMO_NOISE]
    worst = 0.0
    for name, design in settings:
        for baseline_sd in BASELINE_ENGINE_SDS:
            with uncounted():
                before = coverage(trials, 1, baseline_sd, **design)
            after = coverage(trials, 1, baseline_sd, **design)
            noise = design.get("batch_noise", BATCH_NOISE)
            for batch, scale in zip(design.get("batches", BATCHES), noise):
                b, a = before[batch], after[batch]
                worst = max(worst, a["miss"])
                print(f"  {name}, baseline sd {baseline_sd:.2f}, batch {batch} (noise x{scale:g}): miss "
                      f"{b['miss']:.1%} -> {a['miss']:.1%}, median width {b['width']:.3f} -> {a['width']:.3f} "
                      f"(x{a['width'] / b['width']:.2f}), df {b['df']:.1f} -> {a['df']:.1f}")
    print(f"worst miss after: {worst:.1%}")


def main(argv: Sequence[str]) -> None:
    if argv and argv[0] == "df":
        baseline_df(int(argv[1]) if len(argv) > 1 else 1000)
        return
    trials = int(argv[0]) if argv else 1000
    selection = int(argv[1]) if len(argv) > 1 else trials
    print(f"Coverage of the 95% speedup interval, {trials} sound sweeps per setting "
          f"({CONFIGURATIONS} configurations x {WORKLOADS} workloads per batch size, {RUNS} engine runs); "
          "own: each batch size's own spread; fitted: the merge's choice (own, or fitted across batch sizes):")
    for baseline_sd in BASELINE_ENGINE_SDS:
        before = coverage(trials, 1, baseline_sd, spreads="own")
        after = coverage(trials, 1, baseline_sd)
        for batch, scale in zip(BATCHES, BATCH_NOISE):
            print(_line(f"baseline sd {baseline_sd:.2f}, batch {batch} (noise x{scale:g})", before[batch], after[batch]))
    print(f"As make demo: {DEMO['configurations']} configurations x {DEMO['workloads']} workloads at batch 1 and 4, "
          f"{DEMO['runs']} engine runs, {trials} sound sweeps per setting:")
    for baseline_sd in BASELINE_ENGINE_SDS:
        for noise in DEMO_NOISE:
            before = coverage(trials, 1, baseline_sd, spreads="own", batch_noise=noise, **DEMO)  # type: ignore[arg-type]
            after = coverage(trials, 1, baseline_sd, batch_noise=noise, **DEMO)  # type: ignore[arg-type]
            for batch, scale in zip(DEMO["batches"], noise):  # type: ignore[call-overload]
                label = f"baseline sd {baseline_sd:.2f}, noise x{noise[0]:g} / x{noise[1]:g}, batch {batch}"
                print(_line(label, before[batch], after[batch]))
    for baseline_sd in BASELINE_ENGINE_SDS:
        with mock.patch.object(verdicts, "simultaneous_lower_bound", lambda row, candidates: verdicts.lower_bound(row)):
            before_pays = false_pays(selection, 2, baseline_sd=baseline_sd)
        after_pays = false_pays(selection, 2, baseline_sd=baseline_sd)
        print(f"8 configurations at batch 1 and 4, all truly 1.0x, baseline sd {baseline_sd:.2f}, {selection} sweeps: "
              f"the verdict says one pays in {before_pays[0]:.1%} before, {after_pays[0]:.1%} after; anything "
              f"(verdict, best configuration, K schedule) at either batch size in {before_pays[1]:.1%} before, "
              f"{after_pays[1]:.1%} after")


if __name__ == "__main__":
    main(sys.argv[1:])
