"""Which demo grid reaches make demo's verdicts, how often, and in how many seconds of sweep?

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

Per design and noise setting: its sweep's seconds priced from the quiet demo's engines (``sweep_seconds``), how often the summarize verdict says its configuration pays at every measured
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
# name: (methods, K values, engine runs, creative at batch 4 too)
DESIGNS: Mapping[str, tuple[tuple[str, ...], tuple[int, ...], int, bool]] = {
    "K=2,4 x 2 engine runs": (("ngram", "eagle3"), (2, 4), 2, True),
    "K=4 x 3 engine runs (today)": (("ngram", "eagle3"), (4,), 3, True),
    "K=4 x 2 engine runs": (("ngram", "eagle3"), (4,), 2, True),
    "K=4 x 3, creative at batch 1 only": (("ngram", "eagle3"), (4,), 3, False),
    "ngram K=4 x 3 engine runs": (("ngram",), (4,), 3, True),
    "ngram K=4 x 4 engine runs": (("ngram",), (4,), 4, True),
}
# Seconds per engine per engine run (its start, warm-ups and cells, and ~1 s to stop it and fork the next), read
# from the quiet 2026-12-07 demo's rows (docs/results/2026-12-07-demo-time.md): the baseline's, ngram K=4's and
# EAGLE-3 K=4's; K=2's engines cost what K=4's do. A creative batch-4 cell and its warm-up: 2.8, 2.8 and 3.7 s
# (and its job, 0.35 s). The sweep's own work: 8 s before the plan line, 10 s of merge and report.
ENGINE_S = {"baseline": 39.0, "ngram": 34.0, "eagle3": 43.0}
CREATIVE_B4_S = {"baseline": 3.1, "ngram": 3.1, "eagle3": 4.0}
SWEEP_OWN_S = 18.0


def sweep_seconds(methods: Sequence[str], ks: Sequence[int], runs: int, creative_b4: bool) -> float:
    """The design's sweep, priced from the quiet demo's engines."""
    engines = ["baseline", *(m for m in methods for _ in ks)]
    per_run = sum(ENGINE_S[e] - (0.0 if creative_b4 else CREATIVE_B4_S[e]) for e in engines)
    return runs * per_run + SWEEP_OWN_S
# (baseline engine sd, speculative engine sd, cell sd at batch 1, batch 4's scale): the quiet demo's merge
# reported a baseline engine log SD of 0.042-0.050 and per-run log speedups spread 0.076-0.080.
NOISE = ((0.045, 0.02, 0.04, 1.0), (0.045, 0.02, 0.05, 1.5), (0.02, 0.02, 0.05, 1.5), (0.08, 0.03, 0.05, 1.5))


def sweep(rng: np.random.Generator, methods: Sequence[str], ks: Sequence[int], runs: int, creative_b4: bool,
          baseline_sd: float, engine_sd: float, cell_sd: float, b4_scale: float) -> list[dict[str, Any]]:
    """One simulated demo's speculative rows, judged by the merge."""
    configurations = [(m, k) for m in methods for k in ks]
    u = rng.normal(0, baseline_sd, runs)
    v = {c: rng.normal(0, engine_sd, runs) for c in configurations}
    rows = []
    for workload in ("summarize", "creative"):
        for i, batch in enumerate((1, 4)):
            if workload == "creative" and batch == 4 and not creative_b4:
                continue
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
        for name, design in DESIGNS.items():
            rng = np.random.default_rng(0)
            found = [outcome(sweep(rng, *design, *noise)) for _ in range(trials)]
            print(f"  {name:<34} sweep {sweep_seconds(*design):4.0f} s   summarize pays up to 4: {sum(f[0] for f in found) / trials:6.1%}   "
                  f"creative pays at 1: {sum(f[1] for f in found) / trials:6.1%}   "
                  f"ngram K=4 b4 summarize: misses {sum(f[2] for f in found) / trials:5.1%}, "
                  f"median log width {statistics.median(f[3] for f in found):.3f}, "
                  f"df {statistics.median(f[4] for f in found):.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
