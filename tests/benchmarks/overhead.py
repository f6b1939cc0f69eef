"""Sweep overhead: total wall time / time spent inside generation.

Prints figures; asserts nothing. Target: at most 1.5 for specbench.

    .venv/bin/python tests/benchmarks/overhead.py [extra overrides...]

1. specbench runs the CPU demo preset (``sweep=cpu_demo``, plus any extra
   overrides, e.g. ``passes=1`` for a quicker run) into a fresh directory;
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


def run_specbench(directory: Path, extra: list[str]) -> tuple[float, pd.DataFrame]:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "specbench", "sweep=cpu_demo", f"hydra.sweep.dir={directory}", *extra],
                   check=True, capture_output=True)
    wall = time.perf_counter() - start
    return wall, pd.read_parquet(directory / "results.parquet")


def run_naive(directory: Path) -> tuple[float, float]:
    """Every planned cell on a fresh engine, in this process's children."""
    from hydra import compose, initialize_config_module

    from specbench.config import cell_from_config
    from specbench.engine import EnginePool
    from specbench.run import run_cell

    plan = json.loads((directory / "plan.json").read_text())
    naive_dir = directory / "naive"
    start = time.perf_counter()
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        for entry in plan[:NAIVE_CELLS]:
            cfg = compose(config_name="config", overrides=["sweep=cpu_demo", *entry["overrides"]])
            pool = EnginePool()  # a fresh engine for every cell
            run_cell(cell_from_config(cfg), naive_dir / "cells", passes=int(cfg.passes), pool=pool)
            pool.discard()
    wall = time.perf_counter() - start
    rows = [pd.read_parquet(p) for p in (naive_dir / "cells").glob("*.parquet") if ".tokens." not in p.name]
    return wall, generation_seconds(pd.concat(rows))


def main() -> None:
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "sweep"
        wall, rows = run_specbench(directory, extra)
        gen = generation_seconds(rows)
        print(f"specbench: {len(rows)} cells, wall {wall:.0f} s, generation {gen:.0f} s, "
              f"overhead {wall / gen:.2f} (target <= 1.5)", flush=True)
        naive_wall, naive_gen = run_naive(directory)
        print(f"naive (fresh engine per cell, first {NAIVE_CELLS} cells): wall {naive_wall:.0f} s, "
              f"generation {naive_gen:.0f} s, "
              f"overhead {naive_wall / naive_gen:.2f}")
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"this process's peak RSS after {NAIVE_CELLS} engines: {peak_mib:.0f} MiB "
              "(engines live in worker processes)")


if __name__ == "__main__":
    main()
