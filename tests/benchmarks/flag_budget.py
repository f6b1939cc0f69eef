"""How often does a sound sweep lose a cell to a flag? Each flag family, and all four together.

Prints figures; asserts nothing (tests/test_stats.py and tests/test_results.py assert the documented
bounds on smaller runs of the same simulations). No engine, a minute or so:

    .venv/bin/python tests/benchmarks/flag_budget.py [TRIALS]

A merge flags a cell, and leaves it out of every verdict, for four statistical reasons, each a test
over the sweep's cells at a family-wise level (specbench/results/judging.py, FAMILY_ALPHA):

- engine runs disagree (``stats.intervals.speedup_interval``, Bonferroni over the compared cells);
- a shifted baseline (``stats.baseline_shifts.shifted_baselines``, Bonferroni over the baseline cells);
- an excess of numerical ties over the control (``exactness.tie_excess_p_value``, Holm);
- samples that differ in distribution (``distribution.permutation_p_value``, Holm).

The sound sweep simulated: one baseline engine, 4 speculative configurations, 2 workloads x 3 batch
sizes (6 baseline cells, 24 speculative cells), 3 engine runs (the default). Log speedup of a cell in
a run: its mean + u (the baseline engine, sd 0.15, as one measured on a shared machine) + w (the
baseline cell, as noisy as a speculative cell: sd sqrt(0.02^2 + 0.02^2)) - v (the speculative
engine, 0.02) + e (the cell, 0.02), every term but u scaled by its batch size's noise (x1, x1.5, x3:
larger batches are noisier). Ties: 32 greedy requests per cell in bfloat16, each tying with
probability 0.1 in the cell and in its control alike, paired by request (a request that ties in one
ties in the other half of the time). The distribution check is exact (a permutation test) and
costs seconds per cell, so its p-values are drawn uniform, as an exact test's are under its null;
the 24 cells are taken as sampled cells.

"Before": every family at 0.05 (and the code before issue 56: one pooled variance for the shifted
baseline, the tested cell in its own median, Fisher's test on the ties against a control pooled over
every batch size). "After": the code of this checkout, 0.05 / 4 per family (disagreement through
``results.judging.judge_speedups``, each batch size judged by its own spread).

Then the same sound sweeps written as cell files and merged (``results.merge.merge``) at baseline
engine sd 0.02, 0.05 and 0.15 (:func:`merged_rates`): the two families that read the ratios, end to end.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from specbench.results import distribution, exactness
from specbench.results.judging import FAMILY_ALPHA, SWEEP_ALPHA
from specbench.stats import baseline_shifts, intervals, spreads

ENGINES = 4
WORKLOADS = 2
BATCH_NOISE = (1.0, 1.5, 3.0)  # noise scale of batch sizes 1, 4, 8
RUNS = 3
BASELINE_ENGINE_SD = 0.15
ENGINE_SD = 0.02
CELL_SD = 0.02
BASELINE_CELL_SD = math.hypot(ENGINE_SD, CELL_SD)  # as noisy as a speculative cell
REQUESTS = 32
TIE_RATE = 0.1
FAMILIES = ("engine runs disagree", "shifted baseline", "tie excess", "distribution")


Table = dict[tuple[int, int], list[list[float]]]  # (workload, batch) -> per configuration, ratio per run


def sound_sweep(rng: np.random.Generator, *, runs: int = RUNS, batch_noise: Sequence[float] = BATCH_NOISE,
                baseline_cell_sd: float = BASELINE_CELL_SD, engines: int = ENGINES, workloads: int = WORKLOADS,
                shift: tuple[tuple[int, int], float] | None = None,
                baseline_sd: float = BASELINE_ENGINE_SD) -> Table:
    """Per baseline cell (workload, batch index), each configuration's speedup per engine run.

    ``shift``: one baseline cell and a log shift added to its last engine run (a baseline run that went
    off alone), for power.
    """
    u = rng.normal(0, baseline_sd, runs)
    v = rng.normal(0, ENGINE_SD, (engines, runs))
    table: Table = {}
    for workload in range(workloads):
        for batch, scale in enumerate(batch_noise):
            w = rng.normal(0, baseline_cell_sd * scale, runs)
            if shift is not None and shift[0] == (workload, batch):
                w[-1] += shift[1]
            table[workload, batch] = [
                np.exp(math.log(1.5) + u + w - scale * v[e] + rng.normal(0, CELL_SD * scale, runs)).tolist()
                for e in range(engines)
            ]
    return table


def _columns(table: Table) -> tuple[list[dict[int, float]], list[Hashable], list[Hashable], list[int]]:
    ratios, references, engines = [], [], []
    for reference, cells in table.items():
        for engine, cell in enumerate(cells):
            ratios.append(dict(enumerate(cell)))
            references.append(reference)
            engines.append(engine)
    return ratios, references, ["b"] * len(ratios), engines


def shifted(module: ModuleType, table: Table, confidence: float) -> dict[Hashable, object]:
    """``module.shifted_baselines`` on a simulated sweep, strata by reference where the module has them; with this
    checkout's, as the merge calls it (``judging.judge_baselines``): a workload's batch sizes pooled where the
    spread does not grow, each configuration's engine shared across them."""
    ratios, references, baselines, engines = _columns(table)
    if module is stats:
        pools = [(workload, batch + 1) for workload, batch in references]
        return module.shifted_baselines(ratios, references, baselines, references, confidence=confidence,
                                        pools=pools, engines=engines)
    return module.shifted_baselines(ratios, references, baselines, confidence=confidence)


def disagree(module: ModuleType, table: Table, level: float) -> bool:
    """Whether any cell's engine runs disagree (the merge's rule: each judged by the others' spread). With this
    checkout's ``stats``, through the merge's own code (``judging.judge_speedups``: the spread of each batch size);
    with an older module, its rule of one spread pooled over the sweep."""
    if module is stats and level == FAMILY_ALPHA:
        from specbench.results.judging import judge_speedups

        rows = [{"batch_size": batch + 1, "speedup_per_engine_run": cell, "_runs": list(range(len(cell))),
                 "_engine": engine, "_baseline": "b", "_within": None}
                for (_, batch), cells in table.items() for engine, cell in enumerate(cells)]
        judge_speedups(rows)
        return any(row.get("flag_reasons") for row in rows)
    ratios, _, baselines, engines = _columns(table)
    judged = 0
    for i, cell in enumerate(ratios):
        rest = [j for j in range(len(ratios)) if j != i]
        others = module.engine_run_spread([ratios[j] for j in rest], [engines[j] for j in rest], baselines[:-1])
        spread = module.engine_run_spread(ratios, engines, baselines)
        kwargs = {"flag_alpha": level} if level != SWEEP_ALPHA else {}
        found = module.speedup_interval(list(cell.values()), spread, None, cells=len(ratios), others=others,
                                        **kwargs)
        judged += found.engine_runs_disagree
    return judged > 0


def tie_sweep(rng: np.random.Generator, cells: int = ENGINES * WORKLOADS * len(BATCH_NOISE)) -> list[tuple]:
    """Per cell: (cell's tied requests, control's tied requests) as sets over REQUESTS paired requests,
    and the control pooled over every sibling batch size and run (the old control)."""
    found = []
    for _ in range(cells):
        control = rng.random(REQUESTS) < TIE_RATE
        # Paired: a request that ties in the control ties in the cell half the time, else at the rate left.
        same = rng.random(REQUESTS) < 0.5
        cell = np.where(same, control, rng.random(REQUESTS) < TIE_RATE)
        pooled = control | (rng.random(REQUESTS) < TIE_RATE) | (rng.random(REQUESTS) < TIE_RATE)
        found.append((set(np.flatnonzero(cell)), set(np.flatnonzero(control)), set(np.flatnonzero(pooled))))
    return found


def ties_flagged(found: list[tuple], level: float, *, before: bool) -> bool:
    """Whether Holm over the cells with ties flags any: Fisher against the pooled control (before), or
    McNemar on the paired requests against the control of the cell's own batch shape (after)."""
    p_values = []
    for cell, control, pooled in found:
        if not cell:
            continue
        if before:
            p_values.append(_fisher(len(cell), len(pooled)))
        else:
            p_values.append(exactness.tie_excess_p_value(len(cell - control), len(control - cell)))
    return any(a < level for a in distribution.holm(p_values))


def _fisher(cell_ties: int, control_ties: int) -> float:
    """The old test: one-sided Fisher on (ties, other requests) x (cell, control), REQUESTS each side."""
    ties = cell_ties + control_ties
    tail = sum(math.comb(REQUESTS, x) * math.comb(REQUESTS, ties - x) for x in range(cell_ties, min(ties, REQUESTS) + 1))
    return min(1.0, tail / math.comb(2 * REQUESTS, ties))


def distribution_flagged(rng: np.random.Generator, cells: int, level: float) -> bool:
    """Holm over ``cells`` exact permutation tests under their null: uniform p-values."""
    return any(a < level for a in distribution.holm(rng.random(cells).tolist()))


def old_stats() -> ModuleType:
    """specbench/stats.py as it was before issue 56 (git show 08be91f), imported under another name."""
    root = Path(__file__).resolve().parents[2]
    source = subprocess.run(["git", "show", "08be91f:specbench/stats.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    path = Path("/tmp/specbench_stats_before_issue56.py")
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("stats_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def current_stats() -> ModuleType:
    """This checkout's statistics, gathered into one module as the old specbench/stats.py offered them (:func:`rates`
    and :func:`power` call ``engine_run_spread``, ``speedup_interval`` and ``shifted_baselines`` on either)."""
    module = ModuleType("stats_now")
    module.engine_run_spread = spreads.engine_run_spread  # type: ignore[attr-defined]
    module.speedup_interval = intervals.speedup_interval  # type: ignore[attr-defined]
    module.shifted_baselines = baseline_shifts.shifted_baselines  # type: ignore[attr-defined]
    return module


stats = current_stats()


def rates(trials: int, seed: int, *, before: bool, module: ModuleType) -> dict[str, float]:
    """Share of sound sweeps that lose at least one cell, per family and to any of them."""
    rng = np.random.default_rng(seed)
    level = SWEEP_ALPHA if before else FAMILY_ALPHA
    counts = dict.fromkeys((*FAMILIES, "any"), 0)
    for _ in range(trials):
        table = sound_sweep(rng)
        hit = {
            "engine runs disagree": disagree(module, table, level),
            "shifted baseline": bool(shifted(module, table, 1.0 - level)),
            "tie excess": ties_flagged(tie_sweep(rng), level, before=before),
            "distribution": distribution_flagged(rng, ENGINES * WORKLOADS * len(BATCH_NOISE), level),
        }
        for family, flagged in hit.items():
            counts[family] += flagged
        counts["any"] += any(hit.values())
    return {family: count / trials for family, count in counts.items()}


def power(module: ModuleType, trials: int, seed: int, shift: float, confidence: float,
          **sweep: object) -> float:
    """Share of sweeps in which a baseline cell (workload 0, batch 1: the middle noise) shifted by ``shift``
    (log) in its last run is found, and nothing else."""
    rng = np.random.default_rng(seed)
    found = 0
    for _ in range(trials):
        table = sound_sweep(rng, shift=((0, 1), shift), **sweep)  # type: ignore[arg-type]
        found += list(shifted(module, table, confidence)) == [(0, 1)]
    return found / trials


def write_sweep(cells: Path, table: Table) -> list[str]:
    """A simulated sweep (:func:`sound_sweep`) as cell files the merge reads: per engine run one baseline engine
    (every baseline cell) and one engine per configuration (every cell of it), greedy with equal outputs.
    Wall times put each ratio exactly where the table has it (the repetitions' +-1% leaves the median)."""
    # tests/rows.py builds cell files as the tests do; run as a script, tests/ is not on the path.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from rows import cell_row, write_cell

    ids = []
    runs = len(next(iter(table.values()))[0])
    for (workload, batch), configurations in table.items():
        shape = {"batch_size": batch + 1, "workload": f"w{workload}"}
        for run in range(runs):
            base_id = f"base-w{workload}-b{batch}-p{run}"
            ids.append(base_id)
            write_cell(cells, cell_row(base_id, "baseline", 2.0, engine_run=run, config_hash=f"B{workload}-{batch}")
                       | shape | {"engine_id": f"base-{run}"}, [[1]])
            for k, ratios in enumerate(configurations, start=1):
                ids.append(f"k{k}-w{workload}-b{batch}-p{run}")
                write_cell(cells, cell_row(ids[-1], "ngram", 2.0 / ratios[run], baseline_id=base_id, engine_run=run,
                                           k=k, config_hash=f"S{k}-{workload}-{batch}")
                           | shape | {"engine_id": f"k{k}-{run}"}, [[1]])
    return ids


def merged_rates(trials: int, seed: int, baseline_sd: float) -> dict[str, float]:
    """Share of sound sweeps, written as cell files and merged (``results.merge.merge``), that lose a cell to
    disagreeing engine runs, to a shifted baseline, and to either. (Greedy cells with equal outputs: the tie
    and distribution families cannot fire here; :func:`rates` simulates them.)"""
    import tempfile

    from specbench.results.merge import merge

    rng = np.random.default_rng(seed)
    counts = dict.fromkeys(("engine runs disagree", "shifted baseline", "any"), 0)
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as directory:
            rows = merge(Path(directory), write_sweep(Path(directory), sound_sweep(rng, baseline_sd=baseline_sd)))
        reasons = [reason for row in rows for reason in row.get("flag_reasons") or []]
        hit = {"engine runs disagree": any(r.startswith("engine runs disagree") for r in reasons),
               "shifted baseline": any(" of the baseline ran " in r for r in reasons)}
        for family, flagged in hit.items():
            counts[family] += flagged
        counts["any"] += bool(reasons)
    return {family: count / trials for family, count in counts.items()}


def _print_rates(title: str, found: Mapping[str, float]) -> None:
    print(title)
    for family, rate in found.items():
        print(f"  {family:<22} {rate:6.1%}")


def main(argv: Sequence[str]) -> None:
    trials = int(argv[0]) if argv else 1000
    before = old_stats()
    _print_rates(f"Before (each family at {SWEEP_ALPHA}), {trials} sound sweeps:",
                 rates(trials, 1, before=True, module=before))
    _print_rates(f"After (each family at {SWEEP_ALPHA} / {len(FAMILIES)} = {FAMILY_ALPHA}), {trials} sound sweeps:",
                 rates(trials, 1, before=False, module=stats))
    for baseline_sd in (0.02, 0.05, 0.15):
        _print_rates(f"Through merge() on cell files, baseline engine sd {baseline_sd}, {trials // 5} sound sweeps:",
                     merged_rates(trials // 5, 4, baseline_sd))
    print("Shifted baseline alone, sound sweeps (baseline cells as noisy as speculative ones):")
    for label, sweep in (("3 runs, batch noise x1/x1.5/x3", {}), ("2 runs, batch noise x1/x1.5/x3", {"runs": 2}),
                         ("3 runs, equal noise", {"batch_noise": (1.0, 1.0, 1.0)}),
                         ("old simulation: 2 runs, equal noise, baseline cells sd 0.02",
                          {"runs": 2, "batch_noise": (1.0, 1.0, 1.0), "baseline_cell_sd": CELL_SD})):
        row = []
        for name, module, confidence in (("before", before, 1 - SWEEP_ALPHA), ("after", stats, 1 - FAMILY_ALPHA)):
            rng = np.random.default_rng(2)
            tables = (sound_sweep(rng, **sweep) for _ in range(trials))  # type: ignore[arg-type]
            lost = sum(bool(shifted(module, table, confidence)) for table in tables)
            row.append(f"{name} {lost / trials:5.1%}")
        print(f"  {label:<60} {'  '.join(row)}")
    print("Shifted baseline, power (a batch-4 baseline cell slow in its last run, found alone):")
    for slow in (0.16, 0.28, 0.5):
        for runs in (3, 2):
            row = [f"{name} {power(module, trials // 2, 3, math.log1p(slow), confidence, runs=runs):5.1%}"
                   for name, module, confidence in (("before", before, 1 - SWEEP_ALPHA),
                                                    ("after", stats, 1 - FAMILY_ALPHA))]
            print(f"  {slow:.0%} slower, {runs} runs{'':<40} {'  '.join(row)}")


if __name__ == "__main__":
    main(sys.argv[1:])
