"""Are specbench's speedup intervals honest? Run the same sweep twice and check.

Prints figures; asserts nothing. Run on a quiet machine:

    .venv/bin/python tests/benchmarks/interval_coverage.py [FIRST_SWEEP_DIR]

The CPU demo sweep (``sweep=cpu_demo``: ngram K=2,4 x batch 1,4 x summarize,
creative, two passes) runs twice into fresh directories; pass the directory of
a finished demo sweep (e.g. ``outputs/cpu_demo`` after ``make demo``) to reuse
it as the first run. For each speculative cell it checks whether the
second run's speedup falls inside the first run's 95% intervals, and prints
the coverage and median width of:

- before (one engine per side): the within-engine interval from the first
  pass alone, as specbench computed it before passes existed;
- after: the pooled-pass confidence interval (``speedup_ci_*``) and the rerun
  interval (``speedup_rerun_*``) with ``passes`` independent passes.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from specbench import stats
from specbench.results import merge

def sweep(directory: Path) -> pd.DataFrame:
    if not (directory / "results.parquet").exists():
        subprocess.run([sys.executable, "-m", "specbench", "sweep=cpu_demo", f"hydra.sweep.dir={directory}"],
                       check=True, capture_output=True)
    return pd.read_parquet(directory / "results.parquet")


def first_pass_only(directory: Path) -> pd.DataFrame:
    """The sweep as if it had run one pass: merge only the pass-0 cells."""
    ids = [p.stem for p in (directory / "cells").glob("*-p0.parquet")]
    return pd.DataFrame(merge(directory / "cells", ids))


def key(frame: pd.DataFrame) -> pd.DataFrame:
    spec = frame[frame["method"] != "baseline"]
    return spec.set_index(["num_speculative_tokens", "batch_size", "workload"])


def report(name: str, first: pd.DataFrame, second: pd.DataFrame, low: str, high: str) -> None:
    joined = key(first)[[low, high]].join(key(second)[["speedup"]], how="inner")
    inside = ((joined["speedup"] >= joined[low]) & (joined["speedup"] <= joined[high])).mean()
    widths = (joined[high] - joined[low]) / ((joined[high] + joined[low]) / 2)
    print(f"{name}: coverage {inside:.0%} of {len(joined)} cells, median relative width {widths.median():.1%}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs = [Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "first", Path(tmp) / "second"]
        frames = [sweep(d) for d in runs]
        passes = int(frames[0]["passes"].max())
        before = [first_pass_only(d) for d in runs]
        ratios = [r for f in frames for r in key(f)["speedup_per_pass"]]
        spread = stats.pooled_pass_spread([list(r) for r in ratios])
        print(f"pooled pass-to-pass spread of log speedup: sd {spread.sd:.3f} over {spread.df} df")
        diffs = (key(frames[0])["speedup"] / key(frames[1])["speedup"]).apply(lambda x: abs(x - 1))
        print(f"run 1 vs run 2 speedup: median |difference| {statistics.median(diffs):.1%}, max {diffs.max():.1%}")
        report("before (1 pass, within-engine interval)", before[0], before[1], "speedup_ci_low", "speedup_ci_high")
        report(f"after ({passes} passes, confidence interval)", frames[0], frames[1],
               "speedup_ci_low", "speedup_ci_high")
        report(f"after ({passes} passes, rerun interval)", frames[0], frames[1],
               "speedup_rerun_low", "speedup_rerun_high")


if __name__ == "__main__":
    main()
