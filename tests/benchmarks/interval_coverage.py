"""Are specbench's speedup intervals honest? Run the same sweep twice and check.

Prints figures; asserts nothing. Run on a quiet machine (on a shared one,
under its CPU lock):

    .venv/bin/python tests/benchmarks/interval_coverage.py FIRST_DIR SECOND_DIR [OVERRIDE ...]

The CPU demo sweep (``sweep=cpu_demo``: ngram and EAGLE-3, K=2,4 x batch 1,4 x
summarize, creative, two engine runs: 16 speculative cells), with any extra Hydra
overrides, runs into each directory unless it already holds a
finished sweep (``results.parquet``), so a finished demo sweep can be reused.
Both runs are merged again from their cell files with the current code, so
the intervals are the ones this checkout computes. For each speculative cell
it checks whether the second run's speedup falls inside the first run's 95%
intervals (and the first run's inside the second's: each rerun is a test of
the other), and prints the coverage and median relative width of:

- one engine run (one engine per side): the within-engine interval from run 0 alone;
- the pooled-pass confidence interval (``speedup_ci_*``) and the rerun
  interval (``speedup_rerun_*``) with ``engine_runs`` independent engine runs.

The rerun interval is the one a rerun should land in (target: 90% or more);
the confidence interval is for the expected speedup, so it may cover less.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd

from specbench import stats
from specbench.results.merge import merge
from specbench.sweep import read_plan


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
        ids = [i for i in ids if i.endswith("-p0")]
    return pd.DataFrame(merge(directory / "cells", ids))


def key(frame: pd.DataFrame) -> pd.DataFrame:
    spec = frame[(frame["method"] != "baseline") & frame["speedup"].notna()]
    return spec.set_index(["method", "num_speculative_tokens", "batch_size", "workload"])


def report(name: str, runs: list[pd.DataFrame], low: str, high: str) -> None:
    """Coverage of each run's interval by the other run's speedup, and median relative width."""
    inside, widths, cells = [], [], 0
    for first, second in ((runs[0], runs[1]), (runs[1], runs[0])):
        joined = key(first)[[low, high]].join(key(second)[["speedup"]], how="inner").dropna()
        cells = len(joined)
        inside += list((joined["speedup"] >= joined[low]) & (joined["speedup"] <= joined[high]))
        widths += list((joined[high] - joined[low]) / ((joined[high] + joined[low]) / 2))
    if not inside:
        print(f"{name}: no interval to check")
        return
    print(f"{name}: coverage {sum(inside) / len(inside):.0%} of {len(inside)} checks ({cells} cells, "
          f"both directions), median relative width {statistics.median(widths):.1%}")


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    dirs, overrides = [Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()], sys.argv[3:]
    for directory in dirs:
        sweep(directory, overrides)
    frames = [merged(d) for d in dirs]
    one_pass = [merged(d, pass_zero_only=True) for d in dirs]
    runs = int(frames[0]["engine_runs"].max())
    spec = [key(f) for f in frames]
    print(f"speculative cells compared: {len(spec[0])} + {len(spec[1])} in the two runs, {runs} engine runs each")
    for i, frame in enumerate(spec):
        methods = frame["speedup_ci_method"].unique()
        spread = stats.pooled_engine_run_spread(list(frame["speedup_per_engine_run"]))
        print(f"run {i + 1}: pass-to-pass sd of log speedup {spread.sd:.3f}; interval methods {', '.join(methods)}")
    diffs = (spec[0]["speedup"] / spec[1]["speedup"]).dropna().apply(lambda x: abs(x - 1))
    print(f"run 1 vs run 2 speedup: median |difference| {statistics.median(diffs):.1%}, max {diffs.max():.1%}")
    report("1 pass (within-engine interval)", one_pass, "speedup_ci_low", "speedup_ci_high")
    report(f"{runs} engine runs, confidence interval", frames, "speedup_ci_low", "speedup_ci_high")
    report(f"{runs} engine runs, rerun interval", frames, "speedup_rerun_low", "speedup_rerun_high")


if __name__ == "__main__":
    main()
