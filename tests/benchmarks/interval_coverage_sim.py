"""Do the page's speedup intervals hold at every batch size, and does choosing the best of several pay for itself?

Prints figures; asserts nothing (tests/test_results.py and tests/test_verdicts.py assert the same properties on
fewer draws). No engine, a minute or two:

    .venv/bin/python tests/benchmarks/interval_coverage_sim.py [TRIALS [SELECTION_TRIALS]]

(TRIALS sweeps per coverage setting, default 1,000; SELECTION_TRIALS per selection setting, default TRIALS.)

**Coverage by batch size.** Simulated sweeps as in tests/benchmarks/flag_budget.py: one baseline engine, 4
speculative configurations, 2 workloads x 3 batch sizes, 3 engine runs. Log speedup of a cell in a run: log
1.5 + u (the baseline engine, sd 0.02, 0.05 or 0.15) + w (the baseline cell, sd sqrt(0.02^2 + 0.02^2)) - v
(the speculative engine, 0.02) + e (the cell, 0.02), every term but u scaled by its batch size's noise (x1,
x1.5, x3). The rows go through ``results.merge.judge_speedups``, the code that makes the page's intervals;
"before" runs the same code with every cell in one stratum (one spread pooled over the sweep, as before the
spread was estimated per batch size). Per batch size and setting: how often the 95% interval misses the true
speedup (1.5x), the median width of the interval (log of high over low) and how often a sound sweep has a
cell whose engine runs disagree.

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
from specbench.results import merge

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
    one baseline engine serves every baseline cell; the rows carry what ``merge.judge_speedups`` reads.
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


def judged(rows: list[dict[str, Any]], *, pooled: bool = False) -> list[dict[str, Any]]:
    """``rows`` with their speedups judged by the merge (``pooled``: one stratum, the spread of the whole sweep)."""
    if pooled:
        with mock.patch.object(merge, "stratum", lambda row: None):
            merge.judge_speedups(rows)
    else:
        merge.judge_speedups(rows)
    for row in rows:
        row["flagged"] = bool(row.get("flag_reasons"))
    return rows


def coverage(trials: int, seed: int, baseline_sd: float, *, pooled: bool) -> dict[int, dict[str, float]]:
    """Per batch size: the share of cells whose interval misses the true speedup, the median log width, and the
    share of sweeps with a cell flagged for disagreeing engine runs."""
    rng = np.random.default_rng(seed)
    misses: dict[int, list[bool]] = {b: [] for b in BATCHES}
    widths: dict[int, list[float]] = {b: [] for b in BATCHES}
    flagged: dict[int, int] = dict.fromkeys(BATCHES, 0)
    for _ in range(trials):
        rows = judged(sound_sweep(rng, baseline_sd), pooled=pooled)
        for batch in BATCHES:
            here = [r for r in rows if r["batch_size"] == batch]
            misses[batch] += [not r["speedup_ci_low"] <= TRUE_SPEEDUP <= r["speedup_ci_high"] for r in here]
            widths[batch] += [math.log(r["speedup_ci_high"] / r["speedup_ci_low"]) for r in here]
            flagged[batch] += any(r["flagged"] for r in here)
    return {b: {"miss": float(np.mean(misses[b])), "width": statistics.median(widths[b]),
                "disagree": flagged[b] / trials} for b in BATCHES}


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


def main(argv: Sequence[str]) -> None:
    trials = int(argv[0]) if argv else 1000
    selection = int(argv[1]) if len(argv) > 1 else trials
    print(f"Coverage of the 95% speedup interval, {trials} sound sweeps per setting "
          f"({CONFIGURATIONS} configurations x {WORKLOADS} workloads per batch size, {RUNS} engine runs):")
    for baseline_sd in BASELINE_ENGINE_SDS:
        before = coverage(trials, 1, baseline_sd, pooled=True)
        after = coverage(trials, 1, baseline_sd, pooled=False)
        for batch, scale in zip(BATCHES, BATCH_NOISE):
            b, a = before[batch], after[batch]
            print(f"  baseline sd {baseline_sd:.2f}, batch {batch} (noise x{scale:g}): "
                  f"before miss {b['miss']:.1%} width {b['width']:.3f} disagree {b['disagree']:.1%} | "
                  f"after miss {a['miss']:.1%} width {a['width']:.3f} disagree {a['disagree']:.1%} "
                  f"(width x{a['width'] / b['width']:.2f})")
    for baseline_sd in BASELINE_ENGINE_SDS:
        with mock.patch.object(verdicts, "simultaneous_lower_bound", lambda row, candidates: verdicts.lower_bound(row)):
            before = false_pays(selection, 2, baseline_sd=baseline_sd)
        after = false_pays(selection, 2, baseline_sd=baseline_sd)
        print(f"8 configurations at batch 1 and 4, all truly 1.0x, baseline sd {baseline_sd:.2f}, {selection} sweeps: "
              f"the verdict says one pays in {before[0]:.1%} before, {after[0]:.1%} after; anything (verdict, best "
              f"configuration, K schedule) at either batch size in {before[1]:.1%} before, {after[1]:.1%} after")


if __name__ == "__main__":
    main(sys.argv[1:])
