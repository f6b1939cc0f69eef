"""Does the check of a K schedule call a loss only where there is one? Simulated engines, no vLLM.

Prints figures; asserts nothing. Seconds:

    .venv/bin/python tests/benchmarks/schedule_comparison_sim.py [SIMS]

A check measures the schedule beside two fixed Ks (K=4, K=2) in the same engine
runs: every cell of an engine run is timed against one baseline engine, whose
own deviation (log SD ``baseline``) moves all three speedups of the run
together, while each speculative engine deviates on its own (log SD 0.02).
Each cell's own 95% interval is Student's over its 3 engine runs' log ratios.
Per setting it prints how often the schedule is said to lose to some fixed K:

- ``old``: the rule before, the schedule's upper end below the point estimate
  of the fastest fixed K (picked by that estimate);
- ``paired``: :func:`specbench.analytic.verdicts.schedule_against_fixed` and
  :func:`~specbench.analytic.verdicts.schedule_loses_to`, what
  ``recommend.comparisons`` and the page use, on the cells' per-run speedups;
- ``unpaired``: the same with the per-run speedups left out (a check whose fixed
  Ks come from another sweep): both cells' intervals combined.

``equal``: the schedule runs as fast as the fastest fixed K (every "loses" is
false; the target is at most 5%); ``4% slower`` and ``10% slower``: it runs that
much slower than K=4 (the share is the power to see it). Last, a best of five
fixed Ks, four as fast as the schedule, on noisier engines: the selection the
old rule did not pay for.
"""

from __future__ import annotations

import math
import random
import sys

from specbench.analytic.verdicts import schedule_against_fixed, schedule_loses_to
from specbench.stats import distributions

RUNS = 3
ENGINE_SD = 0.02


def _cell(logs: list[float]) -> dict[str, object]:
    """A merged row with its own interval over its runs (Student's, RUNS - 1 df) and its per-run speedups."""
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    half = distributions.student_t_quantile(0.975, len(logs) - 1) * sd / math.sqrt(len(logs))
    return {"speedup": math.exp(mean), "speedup_ci_low": math.exp(mean - half),
            "speedup_ci_high": math.exp(mean + half), "speedup_df": float(len(logs) - 1),
            "speedup_per_engine_run": [math.exp(x) for x in logs], "baseline_cell_id": "baseline-b4"}


def _one(rng: random.Random, baseline_sd: float, schedule_log: float, ties: int = 0,
         engine_sd: float = ENGINE_SD) -> tuple[bool, bool, bool]:
    true: dict[object, float] = {"schedule": schedule_log, 4: math.log(1.30), 2: math.log(1.20)}
    true |= {k: math.log(1.30) for k in (3, 5, 6)[:ties]}  # more fixed Ks as fast as K=4: a best of several
    shifts = [rng.gauss(0.0, baseline_sd) for _ in range(RUNS)]
    cells = {name: _cell([mu + rng.gauss(0.0, engine_sd) - shift for shift in shifts]) for name, mu in true.items()}
    schedule, fixed = cells.pop("schedule"), cells
    best = max(fixed.values(), key=lambda r: r["speedup"])
    old = schedule["speedup_ci_high"] < best["speedup"]
    paired = bool(schedule_loses_to(schedule_against_fixed(schedule, fixed)))
    strip = {"speedup_per_engine_run": None}
    unpaired = bool(schedule_loses_to(schedule_against_fixed(schedule | strip,
                                                             {k: r | strip for k, r in fixed.items()})))
    return old, paired, unpaired


def main(sims: int) -> None:
    rng = random.Random(65)
    for name, schedule in (("equal", math.log(1.30)), ("4% slower", math.log(1.30 * 0.96)),
                           ("10% slower", math.log(1.30 * 0.90))):
        for baseline_sd in (0.02, 0.05, 0.15):
            counts = [0, 0, 0]
            for _ in range(sims):
                for i, lost in enumerate(_one(rng, baseline_sd, schedule)):
                    counts[i] += lost
            old, paired, unpaired = (100.0 * c / sims for c in counts)
            print(f"{name:>10}, baseline sd {baseline_sd:.2f}: says 'loses' old {old:5.1f}%  "
                  f"paired {paired:5.1f}%  unpaired {unpaired:5.1f}%  ({sims} checks)")
    # A best of five fixed Ks, four as fast as the schedule, engines noisier than the baseline (SD 0.06):
    # the fastest of four equal noisy cells is biased upward, and the old rule compared against exactly it.
    for baseline_sd in (0.02, 0.05):
        counts = [0, 0, 0]
        for _ in range(sims):
            for i, lost in enumerate(_one(rng, baseline_sd, math.log(1.30), ties=3, engine_sd=0.06)):
                counts[i] += lost
        old, paired, unpaired = (100.0 * c / sims for c in counts)
        print(f"equal, best of 5 fixed Ks, engine sd 0.06, baseline sd {baseline_sd:.2f}: says 'loses' old "
              f"{old:5.1f}%  paired {paired:5.1f}%  unpaired {unpaired:5.1f}%  ({sims} checks)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
