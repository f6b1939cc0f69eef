"""Which demo grid reaches make demo's verdicts more often: K=2,4 over 2 engine runs, or K=4 over 3?

Prints figures; asserts nothing. No engine, about a minute at the default:

    .venv/bin/python tests/benchmarks/demo_design_sim.py [TRIALS]

Simulated sweeps shaped like ``sweep=cpu_demo``: ngram and EAGLE-3, summarize and creative, batch 1 and 4,
each configuration one speculative engine per engine run (it serves both workloads and batch sizes) beside
one baseline engine. Each cell's true speedup is what a quiet 2026-12-07 demo measured (``TRUE``). Log
speedup of a cell in a run: log(true) + u (the baseline engine, sd ``baseline_sd``) - v (the speculative
engine, ``engine_sd``) + w (the baseline cell) - e (the cell), w and e of sd ``cell_sd`` at batch 1 and
``cell_sd x b4_scale`` at batch 4. The rows go through ``results.judging.judge_speedups`` (the page's
intervals; ``interval_coverage_sim.judged``) and ``analytic.verdicts.verdict`` (the page's sentences), so
the figures are those of the code that writes the report.

Per design and noise setting: how often the summarize verdict says its configuration pays at every measured
batch size (up to 4), how often the creative verdict says something pays at batch 1, and of ngram K=4 on
summarize at batch 4: how often its 95% interval misses the true speedup, its median width (log of high over
low) and its median df.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interval_coverage_sim import judged  # noqa: E402

from specbench.analytic import verdicts  # noqa: E402

# (method, K) -> workload -> (speedup at batch 1, at batch 4): the quiet 2026-12-07 demo's merged speedups.
TRUE: Mapping[tuple[str, int], Mapping[str, tuple[float, float]]] = {
    ("ngram", 2): {"summarize": (1.51, 1.34), "creative": (1.10, 0.96)},
    ("ngram", 4): {"summarize": (1.94, 1.27), "creative": (1.12, 1.06)},
    ("eagle3", 2): {"summarize": (0.96, 0.94), "creative": (0.98, 0.88)},
    ("eagle3", 4): {"summarize": (0.82, 0.81), "creative": (1.08, 0.78)},
}
DESIGNS = {"K=2,4 x 2 engine runs (today)": ((2, 4), 2), "K=4 x 3 engine runs": ((4,), 3)}
# (baseline engine sd, speculative engine sd, cell sd at batch 1, batch 4's scale): the quiet demo's merge
# reported a baseline engine log SD of 0.042-0.050 and per-run log speedups spread 0.076-0.080.
NOISE = ((0.045, 0.02, 0.04, 1.0), (0.045, 0.02, 0.05, 1.5), (0.02, 0.02, 0.05, 1.5), (0.08, 0.03, 0.05, 1.5))


def sweep(rng: np.random.Generator, ks: Sequence[int], runs: int, baseline_sd: float, engine_sd: float,
          cell_sd: float, b4_scale: float) -> list[dict[str, Any]]:
    """One simulated demo's speculative rows, judged by the merge."""
    configurations = [(m, k) for m in ("ngram", "eagle3") for k in ks]
    u = rng.normal(0, baseline_sd, runs)
    v = {c: rng.normal(0, engine_sd, runs) for c in configurations}
    rows = []
    for workload in ("summarize", "creative"):
        for i, batch in enumerate((1, 4)):
            sd = cell_sd * (b4_scale if batch == 4 else 1.0)
            w = rng.normal(0, sd, runs)
            for method, k in configurations:
                logs = math.log(TRUE[(method, k)][workload][i]) + u + w - v[(method, k)] + rng.normal(0, sd, runs)
                rows.append({
                    "cell_id": f"{method}-k{k}-b{batch}-{workload}", "method": method, "method_label": f"{method} K={k}",
                    "num_speculative_tokens": k, "batch_size": batch, "workload": workload, "status": "ok",
                    "engine_runs": runs, "speedup_per_engine_run": np.exp(logs).tolist(),
                    "_runs": [f"base-{r}" for r in range(runs)], "_engine": tuple(f"{method}{k}-{r}" for r in range(runs)),
                    "_baseline": 0, "_within": None,
                })
    rows = judged(rows)
    for row in rows:
        row["exactness"] = "exact"
    return rows


def outcome(rows: list[dict[str, Any]]) -> tuple[bool, bool, bool, float, float]:
    """Summarize pays up to batch 4; creative pays at batch 1; ngram K=4 summarize batch 4's interval misses the
    true speedup; its log width and df."""
    summarize = [r for r in rows if r["workload"] == "summarize"]
    creative = [r for r in rows if r["workload"] == "creative"]
    s = verdicts.verdict(summarize, verdicts.Grid.of(summarize))
    c = verdicts.verdict(creative, verdicts.Grid.of(creative))
    up_to_4 = s.pays and s.reach is not None and s.reach.reached[-1] == 4
    cell = next(r for r in summarize if r["cell_id"] == "ngram-k4-b4-summarize")
    true = TRUE[("ngram", 4)]["summarize"][1]
    miss = not cell["speedup_ci_low"] <= true <= cell["speedup_ci_high"]
    return up_to_4, c.pays, miss, math.log(cell["speedup_ci_high"] / cell["speedup_ci_low"]), cell["speedup_df"]


def main(argv: Sequence[str]) -> None:
    trials = int(argv[0]) if argv else 2000
    print(f"{trials} simulated demos per design and noise setting (seed 0)")
    for noise in NOISE:
        print(f"baseline engine sd {noise[0]}, speculative engine sd {noise[1]}, cell sd {noise[2]} "
              f"(x{noise[3]} at batch 4):")
        for name, (ks, runs) in DESIGNS.items():
            rng = np.random.default_rng(0)
            found = [outcome(sweep(rng, ks, runs, *noise)) for _ in range(trials)]
            print(f"  {name:<32} summarize pays up to 4: {sum(f[0] for f in found) / trials:6.1%}   "
                  f"creative pays at 1: {sum(f[1] for f in found) / trials:6.1%}   "
                  f"ngram K=4 b4 summarize: misses {sum(f[2] for f in found) / trials:5.1%}, "
                  f"median log width {statistics.median(f[3] for f in found):.3f}, "
                  f"df {statistics.median(f[4] for f in found):.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
