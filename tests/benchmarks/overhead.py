"""Sweep overhead: total wall time / time spent inside generation.

Prints figures; asserts nothing. Target: at most 1.5 for specbench.

    .venv/bin/python tests/benchmarks/overhead.py [extra overrides...]
    .venv/bin/python tests/benchmarks/overhead.py --sweep outputs/cpu_demo --wall 355   # reuse a timed demo run

1. specbench runs the CPU demo preset (``sweep=cpu_demo``, plus any extra
   overrides, e.g. ``engine_runs=1`` for a quicker run) into a fresh directory;
   generation time is the sum over cells of warm-up plus timed repetitions,
   as the cells recorded them.
2. The naive pattern runs the first ``NAIVE_CELLS`` cells of the same plan
   with a fresh engine per cell (start, warm up, measure, shut down), using
   specbench's own engine and measurement code so that only engine reuse
   differs. Its ratio is a per-cell property, so a subset measures it.
It also prints this process's peak memory after starting those engines one
after another: it stays flat, since each engine lives and dies in its own
worker process.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

NAIVE_CELLS = 8


def generation_seconds(rows: pd.DataFrame) -> float:
    return float(sum((r.warmup_s or 0.0) + sum(r.wall_time_s_reps) for r in rows.itertuples()))


def cell_rows(directory: Path) -> pd.DataFrame:
    """One row per measured cell and engine run, as the jobs wrote them."""
    return pd.concat(pd.read_parquet(p) for p in (directory / "cells").glob("*.parquet") if ".tokens." not in p.name)


def run_specbench(directory: Path, extra: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "specbench", "sweep=cpu_demo", f"hydra.sweep.dir={directory}", *extra],
                   check=True, capture_output=True)
    return time.perf_counter() - start


def run_naive(directory: Path, naive_dir: Path, extra: list[str]) -> tuple[float, float]:
    """The first planned cells of ``directory``'s sweep, each on a fresh engine, into ``naive_dir``."""
    from hydra import compose, initialize_config_module

    from specbench.config import cell_from_config
    from specbench.engine import EnginePool
    from specbench.job import run_cell

    plan = json.loads((directory / "plan.json").read_text())
    start = time.perf_counter()
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        for entry in plan[:NAIVE_CELLS]:
            cfg = compose(config_name="config", overrides=["sweep=cpu_demo", *extra, *entry["overrides"]])
            pool = EnginePool()  # a fresh engine for every cell
            run_cell(cell_from_config(cfg), naive_dir / "cells", engine_runs=int(cfg.engine_runs), pool=pool)
            pool.discard()
    wall = time.perf_counter() - start
    return wall, generation_seconds(cell_rows(naive_dir))


def main() -> None:
    args = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        if args[:1] == ["--sweep"]:  # a finished demo sweep and the wall time its command took
            directory, wall, extra = Path(args[1]), float(args[3]), []
        else:
            directory, extra = Path(tmp) / "sweep", args
            wall = run_specbench(directory, extra)
        rows = cell_rows(directory)
        gen = generation_seconds(rows)
        print(f"specbench: {len(rows)} cells, wall {wall:.0f} s, generation {gen:.0f} s, "
              f"overhead {wall / gen:.2f} (target <= 1.5)", flush=True)
        naive_wall, naive_gen = run_naive(directory, Path(tmp) / "naive", extra)
        print(f"naive (fresh engine per cell, first {NAIVE_CELLS} cells): wall {naive_wall:.0f} s, "
              f"generation {naive_gen:.0f} s, "
              f"overhead {naive_wall / naive_gen:.2f}")
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"this process's peak RSS after {NAIVE_CELLS} engines: {peak_mib:.0f} MiB "
              "(engines live in worker processes)")


if __name__ == "__main__":
    main()
