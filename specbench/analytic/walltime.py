"""A sweep's wall time before any engine: its cells' generation, and its engine starts.

Generation: each cell is priced by the roofline model (:func:`steps.plain_batch_time`) over the
batches of the prompts it serves (:mod:`specbench.analytic.sizing`), its warm-up and its
repetitions, in every engine run; a speculative cell at its predicted decode speedup. Engine
starts: each engine of each engine run, started once for the cells that share it:

- on a GPU, a fixed part (the process and its CUDA context, vLLM's profiling run, torch.compile's
  graphs), the weights read at :data:`WEIGHT_LOAD_BYTES_PER_S`, and the CUDA graphs captured at
  :data:`CAPTURE_S_PER_SIZE` per size per model (target, and drafter where it has its own), each
  capture counted as often as vLLM 0.32 runs it: its memory profiling captures graphs before the
  real capture does (:func:`captured_sizes`);
- on the CPU build, a fixed part and the KV pool touched at :data:`CPU_KV_S_PER_GIB` (measured on
  2 cores at 1 GiB, below).

Around them, the sweep's own work (:data:`FORK_SERVER_S` once, :data:`CELL_OVERHEAD_S` per cell and
engine run, :data:`FINISH_S` once), which :attr:`SweepTime.overhead_s` counts.

The GPU constants follow vLLM's own start-up lines for a model on one card with torch.compile's
cache warm (vllm#20264: "torch.compile takes 7.51 s", "Graph capturing finished in 17 secs" for the
default 67 sizes, one capture of the list: that vLLM had no graph-memory profiling yet, "init engine
(profile, create kv cache, warmup model) took 34.11 seconds"); the
engine workers fork from a process that imported vLLM once (specbench.engine), so no start pays
the import. They are not measured by specbench: they set the starts' order of magnitude.

Pure: numbers in, seconds out. :func:`fit_budget` sizes a sweep to a budget by its precision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

GPU_START_FIXED_S = 25.0
WEIGHT_LOAD_BYTES_PER_S = 1.5e9
CAPTURE_S_PER_SIZE = 0.25
# A CPU engine's start on 2 cores (vLLM 0.32, SmolLM2-135M, the default 1 GiB KV pool), since the fork
# server imports vLLM for every worker and each worker freezes the heap it inherits: 3.0 s, the mean of
# the rows' engine_start_s in two quiet runs of 2026-12-07 (make demo's sweep: 9 engines, 2.6-3.9 s, mean
# 3.2 s, docs/results/2026-12-07-demo-under-six.md; the headline command: 21 engines, mean 2.9 s, README).
# Stopping the engine before it and forking the next no longer shows: that demo's 312 s are its cells'
# timed generation (191 s), warm-ups (60 s), starts (29 s) and the sweep's own work below (34 s). Each GiB
# of KV pool above or below 1 costs 2.6 s, the step an engine's "init engine" took from 1 GiB (0.5 s) to
# 2 GiB (3.1 s) on 2026-12-05; no start at another pool size has been timed since, so the fixed part is
# what a 1 GiB start leaves, not a measured start without a pool.
CPU_START_FIXED_S = 0.4
CPU_KV_S_PER_GIB = 2.6
# The same sweep's own work around its engines: the engines' fork server imported vLLM once while the
# first job prepared its prompts (the first engine started 11.4 s after the plan was printed); each
# cell's job spent 0.35 s around its measurement (its prompts, row, files and line: 14 s over 40 cells);
# the merge, the report and the verdicts took 10 s after the last cell.
FORK_SERVER_S = 11.0
CELL_OVERHEAD_S = 0.35
FINISH_S = 10.0
# The descriptors per mode V1's memory profiling captures before it extrapolates the rest (``descs[:2]`` in
# GPUModelRunner.profile_cudagraph_memory, vllm/v1/worker/gpu_model_runner.py).
V1_PROFILED_SIZES = 2


def captured_sizes(sizes: int, model_runner: str = "V2") -> int:
    """How many graph sizes an engine with CUDA graphs captures at start in vLLM 0.32, its memory profiling
    counted: ``sizes`` for the real capture, plus the profiling's.

    ``Worker.determine_available_memory`` (vllm/v1/worker/gpu_worker.py) calls the runner's
    ``profile_cudagraph_memory()`` whenever the engine captures graphs on a GPU
    (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` decides only whether its figure is used), and throws
    the graphs away before the real capture:

    - Model Runner V2 (``profile_cudagraph_memory`` in vllm/v1/worker/gpu/cudagraph_utils.py) runs
      ``capture_model(profile_only=True)``, which captures every PIECEWISE size and the speculator's
      graphs in full and only the two largest FULL graphs: the list is captured twice, counted here
      as ``2 x sizes`` (the FULL graphs it samples are the smaller part of a size's capture: one
      graph, against one per compiled piece);
    - V1 captures the first :data:`V1_PROFILED_SIZES` descriptors of each mode and extrapolates the
      rest: ``sizes + min(sizes, 2)``.
    """
    if model_runner not in ("V1", "V2"):
        raise ValueError(f"model_runner must be V1 or V2, got {model_runner!r}")
    if sizes <= 0:
        return 0
    return sizes + (sizes if model_runner == "V2" else min(sizes, V1_PROFILED_SIZES))


def engine_start_s(*, gpu: bool, weight_bytes: float, models: int = 1, capture_sizes: int = 0,
                   cpu_kv_gib: float = 0.0, model_runner: str = "V2") -> float:
    """Seconds to start one engine: fixed part, weights, and CUDA-graph capture (GPU) or KV pool (CPU).

    ``capture_sizes``: the sizes of the engine's capture list (0: eager), each captured as often as
    ``model_runner`` does at start, profiling included (:func:`captured_sizes`)."""
    if gpu:
        return (GPU_START_FIXED_S + weight_bytes / WEIGHT_LOAD_BYTES_PER_S
                + CAPTURE_S_PER_SIZE * captured_sizes(capture_sizes, model_runner) * models)
    return CPU_START_FIXED_S + CPU_KV_S_PER_GIB * cpu_kv_gib


@dataclass(frozen=True)
class CellCost:
    """One cell's generation, per engine run, as a function of the prompts it serves.

    ``batch_s``: one batch of ``batch_size`` decoded to max_tokens at the cell's speed;
    ``warmup_s``: its untimed warm-up; ``prompts``: maps a target half-width (None: the config's
    own) to the prompts the cell serves (:func:`specbench.analytic.sizing.sized`); ``fixed_s``: a
    serving cell's time, which the prompts do not set (0 for an offline cell).
    """

    batch_size: int
    batch_s: float
    warmup_s: float
    repetitions: int
    engine_runs: int
    prompts: Callable[[float | None], int]
    fixed_s: float = 0.0

    def seconds(self, half_width: float | None = None) -> float:
        """Seconds over all its engine runs at this target half-width."""
        if self.fixed_s:
            return self.engine_runs * self.fixed_s
        batches = math.ceil(self.prompts(half_width) / self.batch_size)
        return self.engine_runs * (self.warmup_s + self.repetitions * batches * self.batch_s)


@dataclass(frozen=True)
class SweepTime:
    """A sweep's estimated seconds: generation, engine starts, and the sweep's own work around them."""

    generation_s: float
    starts: int
    start_s: float
    overhead_s: float = 0.0

    @property
    def total_s(self) -> float:
        """Generation, starts and the sweep's own work together."""
        return self.generation_s + self.start_s + self.overhead_s


def overhead_s(cell_runs: int) -> float:
    """The sweep's own seconds around ``cell_runs`` measured cells (each cell once per engine run): its
    engines' fork server, each cell's job, the merge and report; none for a sweep with nothing to run."""
    return FORK_SERVER_S + CELL_OVERHEAD_S * cell_runs + FINISH_S if cell_runs else 0.0


def sweep_time(cells: Sequence[CellCost], starts: Sequence[float], half_width: float | None = None) -> SweepTime:
    """The sweep's time with its cells sized for ``half_width``; ``starts``: each engine start's seconds."""
    return SweepTime(sum(c.seconds(half_width) for c in cells), len(starts), sum(starts),
                     overhead_s(sum(c.engine_runs for c in cells)))


@dataclass(frozen=True)
class BudgetFit:
    """What a budget allows: the target half-width to size for (None: the config's own fits), the time it
    takes, and the fastest the sweep can be (every sized cell at its floor of prompts)."""

    fits: bool
    half_width: float | None
    time: SweepTime
    floor: SweepTime


# The budget's search widens the target in steps of this factor: fine enough that a fit uses most of
# the budget, coarse enough to print as a round figure.
_WIDEN = 1.05
_LOOSEST = 1.0  # a half-width of 100%: every sized cell at its floor of prompts


def fit_budget(cells: Sequence[CellCost], starts: Sequence[float], budget_s: float,
               start_half_width: float) -> BudgetFit:
    """The tightest target half-width, from ``start_half_width`` outwards, whose sweep fits ``budget_s``.

    The config's own sizing is kept when it fits (``half_width`` None). Otherwise the target widens,
    and each cell serves fewer prompts, down to its floor (``precision.min_prompts``, one batch);
    a sweep that does not fit even there does not fit (``fits`` False).
    """
    own = sweep_time(cells, starts)
    floor = sweep_time(cells, starts, _LOOSEST)
    if own.total_s <= budget_s:
        return BudgetFit(True, None, own, floor)
    if floor.total_s > budget_s:
        return BudgetFit(False, None, own, floor)
    target = start_half_width
    while target < _LOOSEST:
        candidate = round(target, 3)  # printed and passed on as precision.half_width
        time = sweep_time(cells, starts, candidate)
        if time.total_s <= budget_s:
            return BudgetFit(True, candidate, time, floor)
        target *= _WIDEN
    return BudgetFit(True, _LOOSEST, floor, floor)
