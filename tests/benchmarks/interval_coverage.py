"""Are specbench's intervals honest? Run the same sweep twice and check, or simulate engines.

Prints figures; asserts nothing. Two modes.

**Two real sweeps.** Run on a quiet machine (on a shared one, under its CPU lock):

    .venv/bin/python tests/benchmarks/interval_coverage.py FIRST_DIR SECOND_DIR [OVERRIDE ...]

The CPU demo sweep (``sweep=cpu_demo``: ngram and EAGLE-3, K=4 x batch 1,4 x
summarize, creative, three engine runs: 8 speculative cells), with any extra Hydra
overrides, runs into each directory unless it already holds a
finished sweep (``results.parquet``), so a finished demo sweep can be reused.
Both runs are merged again from their cell files with the current code, so
the intervals are the ones this checkout computes. For each cell it checks
whether the second run's figure falls inside the first run's 95% intervals
(and the first run's inside the second's: each rerun is a test of the other),
and prints the coverage and median relative width, over all cells and split
by method and by batch size (the target: 90% or more in each group), of:

- one engine run (one engine per side): the within-engine speedup interval from run 0 alone;
- the pooled-pass confidence interval (``speedup_ci_*``) and the rerun
  interval (``speedup_rerun_*``) with ``engine_runs`` independent engine runs;
- the wall-time interval (``wall_time_s_ci_*``, every cell, baselines too).

The rerun interval is the one a rerun should land in; a confidence interval
(speedup or wall time) is for the expected value, so a rerun's own point
falls in it less often than its label even when it is honest.

**Simulation** (no engine, seconds):

    .venv/bin/python tests/benchmarks/interval_coverage.py --simulate [TRIALS]

Draws wall times as a cell's true time x an engine run's deviation
(log-normal, sd ``between``) x a repetition's (log-normal, sd ``within``), for
within- and between-engine spreads of the size this project has measured
(repetitions of one engine within 1-3%; engine runs of one cell 1.4% apart
on a quiet machine, 19% on a shared one, baseline step times up to 50% apart
between sweeps), and prints how often the merged wall-time interval holds
the true time: before (the repetitions of every engine run pooled as if
independent, ``timings.summarize``) and after (each engine run one cluster,
``timings.engine_run_interval``, what ``results.merge`` computes now), with the
label each claims and their median relative width.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.results.merge import merge
from specbench.stats import timings
from specbench.sweep import read_plan

# (within-engine sd, between-engine sd) of log wall time, as measured here (see the docstring).
SPREADS = ((0.01, 0.0), (0.01, 0.02), (0.02, 0.05), (0.02, 0.10), (0.03, 0.20))
ENGINE_RUNS = (1, 2, 3)
REPETITIONS = 3


def sweep(directory: Path, overrides: list[str]) -> None:
    """Run the demo sweep into ``directory`` unless it is already there."""
    if (directory / "results.parquet").exists():
        return
    command = [sys.executable, "-m", "specbench", "sweep=cpu_demo", f"hydra.sweep.dir={directory}", *overrides]
    # A sweep exits non-zero when a cell failed; the merge below shows which.
    subprocess.run(command, check=False, capture_output=True)


def merged(directory: Path, pass_zero_only: bool = False) -> pd.DataFrame:
    """The sweep merged from its cell files with this checkout's code (optionally engine run 0 alone)."""
    ids = read_plan(directory)
    if pass_zero_only:
        ids = [i for i in ids if i.endswith("-r0")]
    return pd.DataFrame(merge(directory / "cells", ids))


def key(frame: pd.DataFrame, column: str = "speedup") -> pd.DataFrame:
    """Cells with a ``column`` figure, indexed by what they measured (speedup: speculative cells only)."""
    cells = frame[frame["status"] == "ok"] if "status" in frame.columns else frame
    if column == "speedup":
        cells = cells[cells["method"] != "baseline"]
    cells = cells[cells[column].notna()]
    return cells.set_index(["method", "num_speculative_tokens", "batch_size", "workload"])


def report(name: str, runs: list[pd.DataFrame], low: str, high: str, column: str = "speedup") -> None:
    """Coverage of each run's interval by the other run's ``column``, overall, by method and by batch size."""
    checks = []
    for first, second in ((runs[0], runs[1]), (runs[1], runs[0])):
        joined = key(first, column)[[low, high]].join(key(second, column)[[column]], how="inner").dropna()
        checks.append(joined.assign(
            inside=(joined[column] >= joined[low]) & (joined[column] <= joined[high]),
            width=(joined[high] - joined[low]) / ((joined[high] + joined[low]) / 2),
        ).reset_index())
    table = pd.concat(checks)
    if table.empty:
        print(f"{name}: no interval to check")
        return
    print(f"{name}: coverage {table['inside'].mean():.0%} of {len(table)} checks ({len(checks[0])} cells, "
          f"both directions), median relative width {table['width'].median():.1%}")
    for group in ("method", "batch_size"):
        parts = [f"{value} {part['inside'].mean():.0%} of {len(part)}" for value, part in table.groupby(group)]
        print(f"    by {group.replace('_', ' ')}: " + "; ".join(parts))


def compare_sweeps(first: Path, second: Path, overrides: list[str]) -> None:
    """The two-sweep mode (see the module docstring)."""
    dirs = [first.resolve(), second.resolve()]
    for directory in dirs:
        sweep(directory, overrides)
    frames = [merged(d) for d in dirs]
    one_pass = [merged(d, pass_zero_only=True) for d in dirs]
    runs = int(frames[0]["engine_runs"].max())
    spec = [key(f) for f in frames]
    print(f"speculative cells compared: {len(spec[0])} + {len(spec[1])} in the two runs, {runs} engine runs each")
    for i, frame in enumerate(spec):
        methods = frame["speedup_ci_method"].unique()
        first = frame.iloc[0]
        print(f"run {i + 1}: engine-run sd of log speedup {first['speedup_log_sd']:.3f} on {first['speedup_df']} df "
              f"(baseline engine {first['baseline_engine_log_sd']}, speculative engine "
              f"{first['speculative_engine_log_sd']}); interval methods {', '.join(methods)}")
    diffs = (spec[0]["speedup"] / spec[1]["speedup"]).dropna().apply(lambda x: abs(x - 1))
    print(f"run 1 vs run 2 speedup: median |difference| {statistics.median(diffs):.1%}, max {diffs.max():.1%}")
    report("1 pass (within-engine interval)", one_pass, "speedup_ci_low", "speedup_ci_high")
    report(f"{runs} engine runs, confidence interval", frames, "speedup_ci_low", "speedup_ci_high")
    report(f"{runs} engine runs, rerun interval", frames, "speedup_rerun_low", "speedup_rerun_high")
    report(f"{runs} engine runs, wall-time interval (a confidence interval)", frames,
           "wall_time_s_ci_low", "wall_time_s_ci_high", column="wall_time_s")


def simulate(trials: int, seed: int = 0) -> None:
    """The simulation mode (see the module docstring): coverage of the true wall time, before and after."""
    rng = np.random.default_rng(seed)
    print(f"wall-time interval of one cell, {REPETITIONS} repetitions per engine run, {trials} simulated cells each;")
    print("coverage of the true time (label: what the interval claims), median relative width")
    print(f"{'within':>7} {'between':>8} {'runs':>5}   {'before: pooled repetitions':<36} "
          f"{'after: engine runs as clusters':<36}")
    for within, between in SPREADS:
        for runs in ENGINE_RUNS:
            before, after = [], []
            for _ in range(trials):
                logs = rng.normal(0.0, between, (runs, 1)) + rng.normal(0.0, within, (runs, REPETITIONS))
                walls = np.exp(logs)  # the true time is 1
                before.append(timings.summarize(walls.ravel().tolist()))
                clustered = timings.engine_run_interval(walls.tolist())
                after.append((clustered.ci_low, clustered.ci_high, clustered.coverage, clustered.method))
            print(f"{within:>7.0%} {between:>8.0%} {runs:>5}   "
                  f"{_coverage([(s.ci_low, s.ci_high, s.coverage, s.method) for s in before]):<36} "
                  f"{_coverage(after):<36}")


def _coverage(intervals: list[tuple[float | None, float | None, float | None, str]]) -> str:
    """'coverage (label L, method) width W' for intervals of a true value of 1."""
    held = [(low, high) for low, high, _, _ in intervals if low is not None and high is not None]
    if not held:
        return "no interval"
    inside = sum(low <= 1.0 <= high for low, high in held) / len(held)
    labels = sorted({round(c, 3) for _, _, c, _ in intervals if c is not None})
    method = intervals[0][3].split("-")[0]
    width = statistics.median((high - low) / ((high + low) / 2) for low, high in held)
    label = "/".join(f"{c:.1%}" for c in labels)
    return f"{inside:6.1%} (label {label}, {method}) {width:6.1%}"


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--simulate":
        simulate(int(sys.argv[2]) if len(sys.argv) > 2 else 20_000)
        return
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    compare_sweeps(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])


if __name__ == "__main__":
    main()
