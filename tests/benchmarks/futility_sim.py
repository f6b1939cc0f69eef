"""Does stopping for futility (``futility=true``) keep the verdict's error rates, and what does it cost the intervals?

Prints figures; asserts nothing (tests/test_futility.py asserts the same properties on fewer draws). No engine,
about ten minutes on 2 cores at the default (2,000 sweeps per line):

    .venv/bin/python tests/benchmarks/futility_sim.py [TRIALS] ["sd 0.10/0.06" ...]

Simulated sweeps of the headline command's design: one workload at batch 1, six speculative configurations, one
baseline engine and one engine per configuration in each of 3 engine runs. Log speedup of configuration c in run
r: log s_c + u_r (the baseline engine) - v_cr (the configuration's engine) + e_cr (the cell), u, v, e normal with
sd 0.038, 0.025, 0.01 (the baseline and speculative engines' log SDs of the 2026-12-06 headline run), 0.03,
0.03, 0.01, or 0.10, 0.06, 0.01 (those of the 2026-12-07 night headline run, 0.114 and 0.064 on 3.1 df: the
baseline engine's deviations dominating). Each sweep is judged twice, through the project's own code (``results.judging.judge_speedups``, then
``analytic.verdicts.best_row``):

- "all runs": every configuration in every engine run (``futility=false``);
- "futility": as the sweeper runs it (``specbench.futility``): engine run 0 for every configuration; the later
  runs of those at least 1x in run 0; the merge; the later runs of those below 1x only where ``futility.settled``
  does not settle them;
- "futility, 4 runs": the same with ``engine_runs=4``.

Per scenario: the share of sweeps whose verdict says some configuration pays when none truly does (false pays;
the verdict's alpha is 0.05); the share that finds a payer when one does (power); the miss rate and median
half-width (log) of the intervals of the configurations at or above 1x; their median df; how many speculative cells run; and the minutes the
headline command's engines would take for them (:func:`seconds`; meaningful for the headline scenario).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from specbench import futility
from specbench.analytic import verdicts
from specbench.results import judging

RUNS = 3
CELL_SD = 0.01
# Seconds per engine run of the headline command's engines on 2 CPU cores, start and warm-up included (means over
# the 3 engine runs of the 2026-12-07 night headline, docs/results/2026-12-08-headline-futility-default.md): the
# baseline, ngram K=2, 4, 8, EAGLE-1 K=2, 4, 8; and the sweep's own work (its fork server, plan, merge and report:
# 22 s, and 0.35 s a cell). The sum at every engine run: 889 s, as measured.
BASELINE_S = 35.5
ENGINE_S = (26.5, 23.4, 24.3, 47.4, 58.6, 70.9)
FIXED_S = 22.0
NOISES = {"sd 0.038/0.025": (0.038, 0.025), "sd 0.03/0.03": (0.03, 0.03), "sd 0.10/0.06": (0.10, 0.06)}
SCENARIOS = {
    "headline (ngram 1.8-1.9, EAGLE 0.5-0.84)": (1.8, 1.9, 1.9, 0.84, 0.67, 0.5),
    "headline, night (ngram 1.4-1.7, EAGLE 0.47-0.72)": (1.42, 1.66, 1.63, 0.72, 0.58, 0.47),
    "all 1.0x": (1.0,) * 6,
    "three at 1.0x, three at 0.8x": (1.0, 1.0, 1.0, 0.8, 0.8, 0.8),
    "three at 1.0x, three at 0.95x": (1.0, 1.0, 1.0, 0.95, 0.95, 0.95),
    "one at 1.15x, five at 0.7x": (1.15, 0.7, 0.7, 0.7, 0.7, 0.7),
}


def draws(rng: np.random.Generator, speedups: Sequence[float], baseline_sd: float, engine_sd: float,
          runs: int = RUNS) -> np.ndarray:
    """Every configuration's log speedup in every engine run (configurations x runs)."""
    u = rng.normal(0, baseline_sd, runs)
    v = rng.normal(0, engine_sd, (len(speedups), runs))
    e = rng.normal(0, CELL_SD, (len(speedups), runs))
    return np.log(np.asarray(speedups))[:, None] + u[None, :] - v + e


def rows_of(logs: np.ndarray, runs: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
    """The merge's offline speculative rows, each configuration with the engine runs ``runs`` gives it, judged."""
    rows = []
    for c, measured in enumerate(runs):
        rows.append({
            "cell_id": f"c{c}", "config_hash": f"c{c}", "method": "ngram", "num_speculative_tokens": c + 1,
            "model": "m", "workload": "w", "batch_size": 1, "temperature": 0.0, "status": "ok",
            "exactness": "exact", "load_request_rate": None, "engine_runs": len(measured),
            "speedup_per_engine_run": [float(math.exp(logs[c, r])) for r in measured],
            "_runs": [f"base-{r}" for r in measured], "_engine": tuple(f"c{c}-{r}" for r in measured),
            "_baseline": 0, "_within": None,
        })
    judging.judge_speedups(rows)
    for row in rows:
        row["flagged"] = bool(row.get("flag_reasons"))
    return rows


def with_futility(logs: np.ndarray, runs: int = RUNS) -> list[dict[str, Any]]:
    """The rows as a ``futility=true`` sweep of ``runs`` engine runs measures them (:mod:`specbench.futility`, as
    the sweeper calls it)."""
    configs = range(logs.shape[0])
    first = rows_of(logs, [[0] for _ in configs])
    waiting = futility.below_one(first, {f"c{c}" for c in configs})
    measured = [[0] if f"c{c}" in waiting else list(range(runs)) for c in configs]
    done = futility.settled(rows_of(logs, measured), waiting)
    return rows_of(logs, [[0] if f"c{c}" in done else list(range(runs)) for c in configs])


def seconds(rows: Sequence[dict[str, Any]]) -> float:
    """The headline command's wall time for these rows' engine runs, at :data:`ENGINE_S` per engine run."""
    runs = max(r["engine_runs"] for r in rows)
    return BASELINE_S * runs + sum(s * r["engine_runs"] for s, r in zip(ENGINE_S, rows)) + FIXED_S + 0.35 * (
        runs + sum(r["engine_runs"] for r in rows))


DESIGNS = {"all runs": lambda logs: rows_of(logs, [list(range(RUNS))] * logs.shape[0]),
           "futility": with_futility,
           "futility, 4 runs": lambda logs: with_futility(logs, RUNS + 1)}


def scenario(trials: int, seed: int, speedups: Sequence[float], noise: tuple[float, float]) -> dict[str, dict]:
    """Both designs' figures over ``trials`` simulated sweeps of one scenario."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, list[float]]] = {
        d: {"pays": [], "miss": [], "half": [], "df": [], "cells": [], "minutes": []} for d in DESIGNS}
    for _ in range(trials):
        logs = draws(rng, speedups, *noise, runs=RUNS + 1)
        for design, judge in DESIGNS.items():
            rows = judge(logs)
            chosen = verdicts.best_row(rows)
            figures = out[design]
            figures["pays"].append(bool(chosen and chosen[1]))
            figures["cells"].append(sum(r["engine_runs"] for r in rows))
            figures["minutes"].append(seconds(rows) / 60.0)
            for row, truth in zip(rows, speedups):
                if truth >= 1.0 and row["speedup_ci_low"] is not None:
                    figures["miss"].append(not row["speedup_ci_low"] <= truth <= row["speedup_ci_high"])
                    figures["half"].append(math.log(row["speedup_ci_high"] / row["speedup_ci_low"]) / 2)
                    figures["df"].append(row["speedup_df"])
    return {d: {"pays": float(np.mean(f["pays"])), "miss": float(np.mean(f["miss"])) if f["miss"] else math.nan,
                "half": statistics.median(f["half"]) if f["half"] else math.nan,
                "df": statistics.median(f["df"]) if f["df"] else math.nan, "cells": float(np.mean(f["cells"])),
                "minutes": float(np.mean(f["minutes"]))}
            for d, f in out.items()}


def main(trials: int, noises: Sequence[str]) -> None:
    """Every scenario under each of ``noises`` (:data:`NOISES` keys; all where empty), ``trials`` sweeps a line."""
    print(f"{trials} sweeps per line; 6 configurations x {RUNS} engine runs, batch 1; pays: share of sweeps whose "
          "verdict pays (false pays where no configuration is above 1x); miss, half, df: intervals of the "
          "configurations at or above 1x; cells: speculative cells measured")
    for noise_name, noise in NOISES.items():
        if noises and noise_name not in noises:
            continue
        for i, (name, speedups) in enumerate(SCENARIOS.items()):
            figures = scenario(trials, 1000 + i, speedups, noise)
            for design, f in figures.items():
                print(f"{noise_name}  {name:<50} {design:<16} pays {f['pays']:6.1%}  miss {f['miss']:5.1%}  "
                      f"half {f['half']:.4f}  df {f['df']:4.2f}  cells {f['cells']:4.1f}  min {f['minutes']:4.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000, sys.argv[2:])
