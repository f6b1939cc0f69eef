"""Does the shifted-baseline test find a baseline engine run 3x slow at the size of a small sweep?

Prints figures; asserts nothing (tests/test_results.py and tests/test_stats.py assert the constructed cases). No\nengine; the merged sweeps take a second or more each:

    .venv/bin/python tests/benchmarks/shift_power.py [JUDGED_TRIALS [MERGED_TRIALS]]

(MERGED_TRIALS 0: the judged sweeps only.)

The sweep simulated is a small real one's shape: one workload, batch sizes 1, 2 and 4, ngram at 2 or 4
values of K (2 or 4 speculative configurations per baseline cell), 3 engine runs; per engine run one baseline
engine serves the three baseline cells and one engine per configuration serves its three cells. The noise is
a quiet machine's (per-run speedups of such a sweep varied by a log sd of 0.03-0.10 per cell): log speedup of a
cell in a run is its mean + u (the baseline engine, sd ``baseline_sd``) + w (the baseline cell, as noisy as a
speculative cell) - v (the speculative engine, ``engine_sd``) + e (the cell, ``cell_sd``), every term but u
scaled by its batch size's noise. Each sweep is written as cell files and merged (``results.merge.merge``), so
the flags are the page's.

- "sound": no baseline run disturbed; the share of sweeps that lose a baseline cell (a false flag; its share of
  the error budget is 0.0125).
- "grid": the batch-1 baseline cell 3x slow in engine run 1 (every ratio of that run 3x); the share of sweeps
  in which that baseline cell is flagged as shifted.
- "remeasured": the batch-1 family measured again (``remeasure=flagged``) on fresh engines, one per engine run
  (its baseline engine serves that one baseline cell: a "lone" reference judged against the other baseline
  engine's spread), its fresh baseline 3x slow in engine run 0; the share flagged, and the share of sound
  re-measured families (no run slow) flagged.
"""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specbench.results.merge import merge

BATCHES = (1, 2, 4)
RUNS = 3
SLOW = 3.0


def sweep_ratios(rng: np.random.Generator, configs: int, *, baseline_sd: float, engine_sd: float, cell_sd: float,
                 batch_noise: Sequence[float], fresh: int | None = None) -> dict[tuple[str, int], list[list[float]]]:
    """Per (baseline engine, batch size), each configuration's speedup per engine run (true speedups 1.1-1.5).

    ``fresh``: the batch size whose family was measured again on engines of its own (a baseline engine and
    speculative engines that drew new deviations); ``"old"`` labels the others' engines."""
    groups = {"old": [b for b in BATCHES if b != fresh]} | ({"fresh": [fresh]} if fresh is not None else {})
    table = {}
    for group, batches in groups.items():
        u = rng.normal(0, baseline_sd, RUNS)
        v = rng.normal(0, engine_sd, (configs, RUNS))
        for batch in batches:
            scale = batch_noise[BATCHES.index(batch)]
            w = rng.normal(0, math.hypot(engine_sd, cell_sd) * scale, RUNS)  # as noisy as a speculative cell
            table[group, batch] = [
                np.exp(math.log(1.1 + 0.1 * k) + u + w - scale * v[k] + rng.normal(0, cell_sd * scale, RUNS)).tolist()
                for k in range(configs)]
    return table


def write_sweep(cells: Path, table: dict[tuple[str, int], list[list[float]]],
                slow: tuple[tuple[str, int], int] | None = None) -> list[str]:
    """The table as cell files: per engine run and engine group one baseline engine and one engine per
    configuration. ``slow``: the baseline cell ((group, batch)) and engine run whose baseline took 3x as long."""
    # tests/rows.py builds cell files as the tests do; run as a script, tests/ is not on the path.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from rows import cell_row, write_cell

    ids = []
    for (group, batch), configurations in table.items():
        shape = {"batch_size": batch, "workload": "creative"}
        for run in range(RUNS):
            base_id = f"{group}-base-b{batch}-p{run}"
            wall = 2.0 * (SLOW if slow == ((group, batch), run) else 1.0)
            ids.append(base_id)
            write_cell(cells, cell_row(base_id, "baseline", wall, engine_run=run, config_hash=f"B{batch}")
                       | shape | {"engine_id": f"{group}-base-{run}"}, [[1]])
            for k, ratios in enumerate(configurations):
                ids.append(f"{group}-k{k}-b{batch}-p{run}")
                write_cell(cells, cell_row(ids[-1], "ngram", 2.0 / ratios[run], baseline_id=base_id, engine_run=run,
                                           k=2 * (k + 1), config_hash=f"S{k}-{batch}")
                           | shape | {"engine_id": f"{group}-k{k}-{run}"}, [[1]])
    return ids


def shifted_references(rows: Sequence[dict]) -> set[str]:
    """The baseline cells (config hashes) the merge flagged as shifted."""
    return {r["config_hash"] for r in rows if r["method"] == "baseline"
            and any(" of the baseline ran " in reason for reason in r.get("flag_reasons") or [])}


def _counted_shares(trials: int, seed: int, configs: int, found_in, noise: dict) -> dict[str, float]:
    """Per scenario (module docstring), the share of ``trials`` simulated sweeps with the outcome it counts;
    ``found_in(table, slow)`` judges one sweep and returns the baseline cells it flagged as shifted."""
    rng = np.random.default_rng(seed)
    counts = dict.fromkeys(("sound", "grid", "remeasured sound", "remeasured"), 0)
    for _ in range(trials):
        for scenario in counts:
            fresh = 1 if scenario.startswith("remeasured") else None
            table = sweep_ratios(rng, configs, fresh=fresh, **noise)  # type: ignore[arg-type]
            slow = {"grid": (("old", 1), 1), "remeasured": (("fresh", 1), 0)}.get(scenario)
            found = found_in(table, slow)
            counts[scenario] += (found == {"B1"}) if slow else bool(found)
    return {scenario: count / trials for scenario, count in counts.items()}


def shares(trials: int, seed: int, configs: int, **noise: object) -> dict[str, float]:
    """Per scenario (module docstring), the share of ``trials`` merged sweeps with the outcome it counts."""
    def found_in(table, slow) -> set[str]:
        with tempfile.TemporaryDirectory() as directory:
            return shifted_references(merge(Path(directory), write_sweep(Path(directory), table, slow)))

    return _counted_shares(trials, seed, configs, found_in, noise)


def judged_shares(trials: int, seed: int, configs: int, **noise: object) -> dict[str, float]:
    """As :func:`shares`, the rows handed straight to the merge's judgement (``judging.judge_baselines``, with the
    private columns the merge gives them) instead of through cell files: the same test, thousands of sweeps a
    minute, where :func:`shares` reads parquet files (a second or more per sweep)."""
    from specbench.results.judging import judge_baselines

    def found_in(table, slow) -> set[str]:
        rows = [{"method": "baseline", "config_hash": f"B{batch}"} for _, batch in table]
        speculative = []
        for (group, batch), configurations in table.items():
            for k, ratios in enumerate(configurations):
                per_run = [r * (SLOW if slow == ((group, batch), run) else 1.0) for run, r in enumerate(ratios)]
                speculative.append({
                    "method": "ngram", "config_hash": f"S{k}-{batch}", "workload": "creative", "batch_size": batch,
                    "temperature": 0.0, "speedup_per_engine_run": per_run, "_reference": f"B{batch}",
                    "_runs": [f"{group}-base-{run}" for run in range(RUNS)], "_run_numbers": list(range(RUNS)),
                    "_baseline": group, "_engine": tuple(f"{group}-k{k}-{run}" for run in range(RUNS))})
        judge_baselines(rows + speculative, speculative)
        return shifted_references(rows)

    return _counted_shares(trials, seed, configs, found_in, noise)


SETTINGS = {
    "quiet, equal noise (engine 0.03, cell 0.04, baseline engine 0.02)":
        {"baseline_sd": 0.02, "engine_sd": 0.03, "cell_sd": 0.04, "batch_noise": (1.0, 1.0, 1.0)},
    "quiet, noise x1/x1.4/x2 (engine 0.03, cell 0.04, baseline engine 0.05)":
        {"baseline_sd": 0.05, "engine_sd": 0.03, "cell_sd": 0.04, "batch_noise": (1.0, 1.4, 2.0)},
    # The speculative engines' deviation, shared by a configuration's cells at every batch size, dominates the
    # residual: the pooled df count it once per batch size (the worst case for a pooled variance).
    "engine-dominated, equal noise (engine 0.06, cell 0.02, baseline engine 0.05)":
        {"baseline_sd": 0.05, "engine_sd": 0.06, "cell_sd": 0.02, "batch_noise": (1.0, 1.0, 1.0)},
}


def main(argv: Sequence[str]) -> None:
    trials = int(argv[0]) if argv else 2000
    merged = int(argv[1]) if len(argv) > 1 else 20
    print(f"1 workload, batch 1/2/4, 3 engine runs; share of sweeps (sound: any baseline flagged; grid / "
          f"remeasured: the {SLOW:g}x slow batch-1 baseline flagged); {trials} sweeps judged as the merge judges "
          f"them (judged_shares), {merged} written as cell files and merged (shares)")
    for configs in (2, 4):
        for label, noise in SETTINGS.items():
            for name, count, simulate in (("judged", trials, judged_shares), ("merged", merged, shares)):
                if count:
                    found = simulate(count, 5, configs, **noise)
                    print(f"  {configs} configs, {label}, {name}: "
                          + ", ".join(f"{k} {v:5.1%}" for k, v in found.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
