"""``python -m specbench.plan``: every cell of a grid with its predicted memory and speedup, no engine.

Takes the same overrides as ``python -m specbench`` (a preset, ``hardware=``,
grid points such as ``batch_size=1,8``), composes each cell with Hydra's
compose API, and prints per cell the memory model's figures
(:mod:`specbench.analytic.memory`, CUDA graphs included: the sizes each
engine captures, shared by the cells of one engine as the sweep shares them,
:func:`specbench.grid.shared_graph_batches`), the predicted decode speedup at an assumed
per-token acceptance alpha (:func:`speedup.predicted_decode_speedup` with
``E(alpha, K)``), and whether grid validation would refuse it and why. It
imports neither vLLM nor torch, so it answers in seconds on any machine:

    python -m specbench.plan sweep=full_grid model=qwen2.5-7b-instruct-awq hardware=rtx4090

Where the calibrated profile prices the cells and its calibration was narrowed to another sweep's range
(``calibrate --batch-sizes``, ...), it says which cells lie outside it (:func:`extrapolated_cells`).
It ends with the sweep's estimated wall time (:mod:`specbench.analytic.walltime`: generation at the
predicted speedups, every engine start with its weights and CUDA graphs) and the precision its cells
are sized for (:mod:`specbench.analytic.sizing`); with ``budget=<minutes>`` it sizes the sweep to fit
(:func:`budget_overrides`, which the sweeper calls too) or refuses it.

Exits 1 when some cell would be refused, 2 on a config error or a budget the sweep cannot fit.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict

from specbench import futility, grid, methods
from specbench.analytic import (acceptance, footprint, graphs, memory, prediction, profiles, sizing, speedup, steps,
                                walltime)
from specbench.config import (ConfigError, batch_prompt_tokens, checked, longest_prompt, valid_cell, validate,
                              with_draft_vocabulary, with_schedule)
from specbench.config import problems as config_problems
from specbench.measure import WARMUP_MAX_TOKENS
from specbench.workloads import estimated_requests

DEFAULT_ALPHA = 0.7


@dataclass(frozen=True)
class CellTiming:
    """What one cell adds to the sweep's wall time: its generation, and the engine it runs on."""

    cost: walltime.CellCost
    engine: Hashable  # cells with the same engine share its start in each engine run
    start_s: float  # seconds to start that engine once
    precision: sizing.Precision
    sizable: bool
    gpu: bool
    speculative: bool = True
    # confirm=true: the verdict this offline cell is a candidate of (model, workload, temperature), whose chosen
    # configuration and baseline are measured again after the grid (:func:`confirmation_timings`); None otherwise.
    verdict: Hashable | None = None
    futility: bool = False  # a speculative cell that stops after engine run 0 when below 1x (specbench.futility)


@dataclass(frozen=True)
class PlannedRow:
    """One cell of the plan: what it is, what it costs, what it is predicted to gain."""

    overrides: tuple[str, ...]
    label: str
    estimate: footprint.MemoryEstimate | None
    predicted_decode_speedup: float | None
    problems: tuple[str, ...]  # validation errors; empty when the cell would run
    # The largest step (tokens) the engine's CUDA graphs must cover, and the most one step may
    # process (max_num_batched_tokens); None where the engine captures no graphs or is unpriced.
    largest_step: int | None = None
    step_limit: int | None = None
    # The model runner vLLM gives the cell's engine on the hardware priced (V1 or V2); None where unpriced.
    model_runner: str | None = None
    # A serving cell whose schedule cycles its prompts: (requests sent, distinct prompts); None otherwise.
    cycled_prompts: tuple[int, int] | None = None
    timing: CellTiming | None = None  # its wall time, where the hardware profile prices it
    budget: float | None = None  # the config's budget (minutes)
    # What the calibrated profile must have measured to price it (:func:`extrapolated_cells`); None where a
    # named profile (hardware=) prices it, none does, or it is refused.
    extent: prediction.PricedExtent | None = None

    @property
    def step_over_limit(self) -> bool:
        """The engine's largest step exceeds max_num_batched_tokens: vLLM splits it, and no graph holds it."""
        return self.largest_step is not None and self.step_limit is not None and self.largest_step > self.step_limit


def grid_jobs(overrides: Sequence[str]) -> list[tuple[str, ...]]:
    """The grid points (full override lists) a sweep with these overrides runs, as the sweeper expands them."""
    parser = OverridesParser.create()
    # The preset's grid lives in hydra.sweeper.params of the config composed without the sweeps.
    single = [o.input_line for o in parser.parse_overrides(list(overrides)) if not o.is_sweep_override()]
    with initialize_config_module("specbench.conf", version_base="1.3"):
        cfg = compose("config", overrides=single, return_hydra_config=True)
    # No preset: the sweeper's params are empty (None or an empty node), and the grid is the overrides alone.
    params = cfg.hydra.sweeper.params
    jobs = grid.grid_points(parser, OmegaConf.to_container(params, resolve=False) if params else {}, overrides)
    # Hydra's own settings (hydra.run.dir=, hydra/launcher=) shaped the composition above; as in a sweep,
    # they are no cell's overrides. Its search path (--config-dir) stays: the cells' groups are found there.
    return [tuple(o for o in job if not _is_hydra_override(o) or grid.override_key(o) == SEARCH_PATH)
            for job in jobs]


SEARCH_PATH = "hydra.searchpath"


def _is_hydra_override(override: str) -> bool:
    """``hydra.run.dir=...``, ``hydra/launcher=...``: a setting of Hydra's, not of the cell."""
    key = grid.override_key(override)
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def with_baselines(jobs: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The jobs plus the baseline each speculative job is compared with, once each (as the sweeper adds them)."""
    out: dict[tuple[str, ...], None] = {}
    for job in jobs:
        out.setdefault(grid.baseline_overrides(job), None)
    for job in jobs:
        out.setdefault(job, None)
    return list(out)


def plan_row(job: tuple[str, ...], cfg: Any, alpha: float, engine: Hashable | None = None) -> PlannedRow:
    """Price one composed cell; ``engine`` (:func:`specbench.grid.engine_key`) lets it price its time too."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    return priced_row(job, plain, tuple(validate(cfg)), alpha, engine)


def priced_row(job: tuple[str, ...], plain: dict[str, Any], problems: tuple[str, ...], alpha: float,
               engine: Hashable | None = None) -> PlannedRow:
    """:func:`plan_row` of a cell already resolved to plain Python, with its validation's ``problems``."""
    plain = with_draft_vocabulary(plain)  # as the cell's engine gets it: the runner depends on it
    if not problems:
        plain = with_schedule(plain)
    method = plain["method"]["name"]
    k = 0 if method == "baseline" else int(plain["num_speculative_tokens"])
    scheduled = plain["method"].get(methods.SCHEDULE)
    name = methods.label(plain["method"], k) if scheduled else f"{methods.variant(plain['method'])} K={k}"
    label = f"{name} b={plain['batch_size']} {plain['workload']['name']}"
    # A K schedule runs one K at this batch size: price that one.
    k = prediction.effective_k(plain["method"].get("speculative_config"), k, int(plain["batch_size"]))
    hardware = memory.resolve_hardware(plain.get("hardware"))
    estimate = speedup = step = limit = runner = extent = None
    if hardware is not None:
        if not problems and not plain.get("hardware"):
            extent = prediction.PricedExtent.of_config(plain, longest_prompt(plain))
        runner = memory.model_runner(plain, hardware)
        try:
            # The prompts the cell sends, as validation prices them; an invalid cell at the workload's cap.
            prompts = None if problems else batch_prompt_tokens(plain)
            estimate = memory.cell_estimate(plain, hardware, batch_prompt_tokens=prompts)
            if estimate.capture_sizes:
                step = graphs.largest_step(graphs.graph_batch(plain), 0 if method == "baseline" else int(
                    plain["num_speculative_tokens"]), plain["method"].get("speculative_config"))
                limit = memory.step_tokens(hardware, plain["engine"])
        except memory.Unpriced:
            estimate = None
        speedup = _predicted_decode_speedup(plain, hardware, method, k, alpha)
    timing = None
    if not problems and estimate is not None and engine is not None:
        timing = cell_timing(plain, hardware, estimate, None if method == "baseline" else speedup, engine)
    return PlannedRow(job, label, estimate, speedup, problems, step, limit, runner, cycled_prompts(plain), timing,
                      plain.get("budget"), extent)


def cycled_prompts(plain: Mapping[str, Any]) -> tuple[int, int] | None:
    """(requests, prompts) where a serving cell sends more requests than its workload has prompts, so that
    its schedule repeats them (:func:`specbench.load.serving_plan` cycles them); None otherwise, and where
    the workload takes every prompt that fits (``num_prompts: all``: not counted before it is read)."""
    load = plain.get("load") or {}
    prompts, requests = (plain.get("workload") or {}).get("num_prompts"), load.get("num_requests")
    if load.get("request_rate") is None or not isinstance(prompts, int) or not isinstance(requests, int):
        return None
    if not load.get("cycle_prompts"):
        return None  # the cell takes a prompt per request (specbench.load.with_unique_prompts)
    return (requests, prompts) if requests > prompts else None


def cell_timing(plain: Mapping[str, Any], hardware: Mapping[str, Any], estimate: footprint.MemoryEstimate,
                decode_speedup: float | None, engine: Hashable) -> CellTiming | None:
    """A valid cell's share of the wall time (:mod:`specbench.analytic.walltime`); None where it cannot be priced.

    Generation at plain-decoding speed, on a GPU its decode steps over ``decode_speedup`` (the prediction
    at the plan's alpha; a baseline's None: prefill is not sped up), the prompts sized by
    :func:`specbench.analytic.sizing.sized`; its engine's start from the memory model's weights and
    CUDA-graph sizes.
    """
    requests = estimated_requests(plain["workload"])
    try:
        hw = profiles.HardwareProfile.from_mapping(hardware)
        model = plain["model"]
        target = prediction.model_profile(model["path"], plain["engine"].get("dtype") or model["dtype"], model.get("name"))
    except (KeyError, ValueError):
        return None
    if requests is None:
        return None
    workload, engine_cfg = plain["workload"], plain["engine"]
    batch, max_tokens, prompt_len = int(plain["batch_size"]), int(workload["max_tokens"]), max(requests[1], 1.0)
    step_tokens = engine_cfg.get("max_num_batched_tokens") or prediction.default_step_tokens(hw.name)
    gpu = bool(hardware.get("memory_bytes"))
    # On the CPU build a speculative cell is priced as plain decoding: the model at the plan's alpha took
    # the 2026-12-07 demo's speculative cells (ngram, the shipped EAGLE-3 head) for 0.49-0.77 of their
    # measured time, which was 0.8-1.1 of their baselines' (docs/results/2026-12-07-demo-time.md).
    speed = decode_speedup if decode_speedup and gpu else 1.0

    def batch_s(size: int, tokens: int) -> float:
        # Speculation speeds up the decode steps; the prefill (which emits each first token) runs as plain.
        prefill = steps.prefill_time(target, hw, size, prompt_len, step_tokens)
        return prefill + (steps.plain_batch_time(target, hw, size, prompt_len, tokens, step_tokens) - prefill) / speed

    sizable = sizing.is_sizable(plain)
    available = int(workload["num_prompts"]) if sizable else requests[0]

    def prompts(half_width: float | None) -> int:
        return int(sizing.sized(dict(plain), half_width)["workload"]["num_prompts"]) if sizable else available

    load = plain.get("load") or {}
    fixed = 0.0
    if load.get("request_rate") is not None:
        # A serving cell: its arrivals' span, then the last request's own service.
        rate = float(load["request_rate"])
        fixed = (int(load["num_requests"]) / rate if rate != float("inf") else 0.0) + batch_s(1, max_tokens)
    cost = walltime.CellCost(
        batch_size=batch, batch_s=batch_s(batch, max_tokens),
        warmup_s=batch_s(batch, min(max_tokens, WARMUP_MAX_TOKENS)) if plain.get("warmup", True) else 0.0,
        repetitions=int(plain["repetitions"]), engine_runs=int(plain["engine_runs"]), prompts=prompts,
        fixed_s=fixed)
    start = walltime.engine_start_s(
        gpu=gpu, weight_bytes=estimate.target_weight_bytes + estimate.drafter_weight_bytes,
        models=2 if estimate.drafter_weight_bytes else 1, capture_sizes=len(estimate.capture_sizes),
        cpu_kv_gib=float(engine_cfg.get("cpu_kvcache_space_gib") or 0),
        model_runner=memory.model_runner(plain, hardware))
    verdict = ((plain["model"].get("name"), workload.get("name"), float(plain.get("temperature") or 0.0))
               if plain.get("confirm") and load.get("request_rate") is None else None)
    speculative = plain["method"]["name"] != "baseline"
    return CellTiming(cost, engine, start, sizing.Precision.from_config(plain), sizable, gpu, speculative, verdict,
                      speculative and bool(plain.get("futility")) and sizable
                      and cost.engine_runs >= futility.MIN_ENGINE_RUNS)


def on_hardware(cfg: Any) -> Any:
    """``cfg``, changed in place, as the engine of its hardware profile runs it: eager by default only on the
    CPU build.

    ``engine.enforce_eager`` defaults to this machine's build (``${cpu_engine:}``); a plan for a
    GPU profile (one stating ``memory_bytes``) prices the GPU build's default, CUDA graphs on.
    An enforce_eager set explicitly is kept.
    """
    if OmegaConf.select(cfg, "hardware.memory_bytes") and OmegaConf.is_interpolation(cfg.engine, "enforce_eager"):
        cfg.engine.enforce_eager = False
    return cfg


def _predicted_decode_speedup(
    plain: Mapping[str, Any], hardware: Mapping[str, Any], method: str, k: int, alpha: float
) -> float | None:
    """Decode speedup at acceptance alpha over a mid-length request (half of prompt cap + output)."""
    priced_as = methods.cost(method)
    if priced_as is None:
        return None
    try:
        hw = profiles.HardwareProfile.from_mapping(hardware)
        dtype = plain["engine"].get("dtype") or plain["model"]["dtype"]
        target = prediction.model_profile(plain["model"]["path"], dtype, plain["model"].get("name"))
        draft = prediction.drafter_profile(plain["method"], target, dtype)
    except (KeyError, ValueError):
        return None
    workload = plain["workload"]
    return speedup.predicted_decode_speedup(
        method=priced_as, k=k, batch_size=int(plain["batch_size"]),
        tokens_per_pass=acceptance.expected_tokens_per_pass(alpha, k), target=target, hw=hw,
        context_len=(workload["max_prompt_tokens"] + workload["max_tokens"]) / 2, draft=draft,
    )


# Config groups (conf/config.yaml's defaults): choosing one recomposes the config.
_GROUPS = ("model", "method", "workload", "hardware", "sweep")


class GridComposer:
    """Composes grid points as Hydra's compose would, in a fraction of the time.

    Hydra composes a config once per choice of config groups; the scalar
    overrides of each point (K, batch size, method.draft, ...) are set on a
    copy of it, which is what composing again would give. A point that adds
    or deletes a key is composed in full. Call it inside
    ``initialize_config_module("specbench.conf")``.
    """

    def __init__(self) -> None:
        self._parser = OverridesParser.create()
        self._by_groups: dict[tuple[str, ...], Any] = {}
        # Each override parsed once: the grid's points share them, and parsing is a sixth of composing a point.
        self._parsed: dict[str, Any] = {}

    def __call__(self, job: Sequence[str]) -> Any:
        """The composed config of one grid point (its full override list)."""
        for o in job:
            if o not in self._parsed:
                (self._parsed[o],) = self._parser.parse_overrides([o])
        parsed = [self._parsed[o] for o in job]
        if any(o.is_add() or o.is_delete() or o.is_force_add() for o in parsed):
            return compose("config", overrides=list(job))
        groups = tuple(o.input_line for o in parsed if o.key_or_group in _GROUPS or o.key_or_group == SEARCH_PATH)
        if groups not in self._by_groups:
            self._by_groups[groups] = compose("config", overrides=list(groups))
        cfg = self._by_groups[groups].copy()
        for o in parsed:
            if o.key_or_group not in _GROUPS and o.key_or_group != SEARCH_PATH:
                OmegaConf.update(cfg, o.key_or_group, o.value(), merge=False)
        return cfg


def make_plan(overrides: Sequence[str], alpha: float = DEFAULT_ALPHA) -> list[PlannedRow]:
    """Every cell (baselines included) of the grid these overrides describe, priced (composed by :class:`GridComposer`)."""
    jobs = with_baselines(grid_jobs(overrides))
    with initialize_config_module("specbench.conf", version_base="1.3"):
        cells = composed_cells(jobs, GridComposer())
    return price_cells(cells, alpha)


def composed_cells(jobs: Sequence[tuple[str, ...]], compose: Callable[[Sequence[str]], Any]
                   ) -> list[tuple[tuple[str, ...], Any]]:
    """Each job (baselines included) with its config as its hardware's engine runs it, a K schedule's once.

    ``compose`` returns a config of the caller's own for each call (as Hydra's compose, the sweeper's loader and
    :class:`GridComposer` do): it is changed in place, not copied (a copy costs more than composing a point).
    """
    scheduled: set[tuple[str, ...]] = set()
    cells: list[tuple[tuple[str, ...], Any]] = []
    for job in jobs:
        cfg = compose(job)
        if "hydra" in cfg:  # a sweep's composition: its hydra node resolves only inside a job
            with open_dict(cfg):
                del cfg["hydra"]
        if cfg.method.get(methods.SCHEDULE) is not None:
            # A scheduled cell's K is its schedule's largest (config.with_schedule): the grid's
            # K values make one cell of it, listed once as the sweep measures it once.
            key = tuple(o for o in job if grid.override_key(o) != "num_speculative_tokens")
            if key in scheduled:
                continue
            scheduled.add(key)
        cells.append((job, on_hardware(cfg)))
    return cells


def price_cells(cells: Sequence[tuple[tuple[str, ...], Any]], alpha: float = DEFAULT_ALPHA) -> list[PlannedRow]:
    """Composed cells (grid point, config) priced as :func:`make_plan` prices them, times included.

    Each cell's engine gets ``engine.cudagraph_batch_size``, the largest graph batch of the valid cells that
    share it, as the sweep sets it (:func:`specbench.grid.shared_graph_batches`); an invalid cell keeps its own.
    Each config is resolved once, and validated once more only where that batch changed it (the graphs' memory
    is part of its fit): resolving is most of the cost of a plan of many cells.
    """
    resolved = [checked(cfg) for _, cfg in cells]
    keys: list[Hashable | None] = []
    largest: dict[Hashable, int] = {}
    for plain, problems in resolved:
        if plain is None or problems:
            keys.append(None)
            continue
        cell = valid_cell(plain)
        key = grid.engine_key(cell)
        keys.append(key)
        largest[key] = max(largest.get(key, 0), graphs.graph_batch(cell.config))
    rows = []
    for (job, cfg), (plain, problems), key in zip(cells, resolved, keys):
        if plain is None:  # it does not resolve: priced (or refused) as plan_row prices it
            rows.append(plan_row(job, cfg, alpha))
            continue
        if key is not None and plain["engine"].get("cudagraph_batch_size") is None:
            plain = dict(plain, engine=dict(plain["engine"], cudagraph_batch_size=largest[key]))
            problems = config_problems(plain)
        # The engine is the one found above: its key leaves the graph sizes out.
        rows.append(priced_row(job, plain, tuple(problems), alpha, None if problems else key))
    return rows


def _timed(rows: Sequence[PlannedRow]) -> list[CellTiming] | None:
    """The valid cells' timings; None when some valid cell cannot be priced (no profile, an hf workload)."""
    valid = [r for r in rows if not r.problems]
    timings = [r.timing for r in valid]
    return None if not valid or any(t is None for t in timings) else [t for t in timings if t is not None]


def _starts(timings: Sequence[CellTiming]) -> list[float]:
    """Each engine start's seconds: every engine once per engine run (its cells run back to back)."""
    runs: dict[Hashable, tuple[float, int]] = {}
    for t in timings:
        start, count = runs.get(t.engine, (0.0, 0))
        runs[t.engine] = (max(start, t.start_s), max(count, t.cost.engine_runs))
    return [start for start, count in runs.values() for _ in range(count)]


def confirmation_timings(timings: Sequence[CellTiming]) -> list[CellTiming]:
    """What ``confirm=true`` measures after the grid (:mod:`specbench.confirm`), priced before the grid says which.

    Per verdict (model, workload, temperature of the offline cells that ask for it), the cell the verdict names is
    one of its speculative cells at its smallest batch size: the costliest of them is priced, with its baseline,
    each in every engine run of its own and on engines of their own (the confirmation's engines are fresh ones:
    the baselines of several verdicts share one per engine run, as the confirmation's run shares it).
    """
    panels: dict[Hashable, list[CellTiming]] = {}
    for t in timings:
        if t.verdict is not None:
            panels.setdefault(t.verdict, []).append(t)
    out: list[CellTiming] = []
    for cells in panels.values():
        speculative = [t for t in cells if t.speculative]
        if not speculative:
            continue
        smallest = min(t.cost.batch_size for t in speculative)
        chosen = max((t for t in speculative if t.cost.batch_size == smallest), key=lambda t: t.cost.seconds())
        baseline = next((t for t in cells if not t.speculative and t.cost.batch_size == smallest), None)
        out += [replace(t, engine=("confirmation", t.engine), verdict=None)
                for t in (baseline, chosen) if t is not None]
    return out


def _with_confirmation(timings: list[CellTiming]) -> list[CellTiming]:
    """The grid's timings and, with ``confirm=true``, its confirmation's (:func:`confirmation_timings`)."""
    return timings + confirmation_timings(timings)


def plan_time(rows: Sequence[PlannedRow], half_width: float | None = None) -> walltime.SweepTime | None:
    """The sweep's estimated wall time (``half_width``: sized for it instead of the config's own), with
    ``confirm=true`` its confirmation's included; None: unpriced."""
    timings = _timed(rows)
    if timings is None:
        return None
    timings = _with_confirmation(timings)
    return walltime.sweep_time([t.cost for t in timings], _starts(timings), half_width)


def futility_floor(rows: Sequence[PlannedRow], half_width: float | None = None) -> walltime.SweepTime | None:
    """The sweep's shortest time under ``futility=true``: every configuration that may stop for futility
    measured in engine run 0 only (it measured below 1x and its interval lay below 1), the baselines and the
    rest in every engine run, with ``confirm=true`` the confirmation after them (it runs whatever stops); None
    where no cell may stop (or the sweep is unpriced). The plan's line and the sweeper's both print it."""
    timings = _timed(rows)
    stopping = _may_stop(timings or [])
    if timings is None or not stopping:
        return None
    floor = [replace(t, cost=replace(t.cost, engine_runs=1)) if id(t) in stopping else t for t in timings]
    # The confirmation is priced from the whole grid: it measures what the verdicts choose, each in every run.
    floor += confirmation_timings(timings)
    return walltime.sweep_time([t.cost for t in floor], _starts(floor), half_width)


def may_stop(rows: Sequence[PlannedRow]) -> int:
    """How many of the sweep's speculative cells :func:`futility_floor` prices at engine run 0 alone."""
    return len(_may_stop(_timed(rows) or []))


def _may_stop(timings: Sequence[CellTiming]) -> set[int]:
    """The cells (``id``) :func:`futility_floor` prices at engine run 0 alone: every cell of the costliest engines
    futility may stop, as a whole (:func:`specbench.futility.below_one` waits only where none of an engine's cells
    goes on), while each batch size they serve keeps :data:`specbench.futility.MIN_GOING_ON` of its engines going
    (:func:`specbench.futility.settle_room`)."""
    seconds: dict[Hashable, float] = {}
    batches: dict[Hashable, set[int]] = {}
    for t in timings:
        if t.speculative:
            seconds[t.engine] = seconds.get(t.engine, 0.0) + t.cost.seconds()
            batches.setdefault(t.engine, set()).add(t.cost.batch_size)
    asking = {t.engine for t in timings if t.futility}
    whole = {e for e in asking if all(t.futility for t in timings if t.engine == e)}
    room = futility.settle_room({b: {e for e, served in batches.items() if b in served}
                                 for b in {b for served in batches.values() for b in served}})
    stopping: set[Hashable] = set()
    for engine in sorted(whole, key=lambda e: -seconds[e]):
        if all(room[b] > 0 for b in batches[engine]):
            stopping.add(engine)
            room.update({b: room[b] - 1 for b in batches[engine]})
    return {id(t) for t in timings if t.engine in stopping}


def cell_rows(cells: Sequence[grid.PlannedCell], alpha: float = DEFAULT_ALPHA) -> list[PlannedRow]:
    """The configurations of a sweep's planned cells, one row each (its engine runs together), priced as
    :func:`make_plan` prices a grid point."""
    firsts: dict[str, grid.PlannedCell] = {}
    for p in cells:
        firsts.setdefault(p.cell.config_hash, p)
    return [plan_row(p.overrides, OmegaConf.create(p.cell.config), alpha, grid.engine_key(p.cell))
            for p in firsts.values()]


def run_time(todo: Sequence[grid.PlannedCell], alpha: float = DEFAULT_ALPHA,
             planned: Sequence[grid.PlannedCell] | None = None) -> tuple[walltime.SweepTime | None, str]:
    """The wall time of the cells still to run, in the order they run, and the hardware profile that priced
    it (or, with no time, why).

    Each cell is priced for its own engine run as :func:`plan_row` prices a grid point; an engine starts
    wherever the engine changes along the order (as :func:`specbench.sweep.engine_starts` counts them),
    and the sweep's own work is :func:`specbench.analytic.walltime.overhead_s`. Cells that differ only in
    their engine run are priced once. ``planned``: the whole grid, whose ``confirm=true`` confirmation runs
    after ``todo`` (:func:`confirmation_timings`, priced from every cell of the grid: it chooses among them all).
    """
    if not todo:
        return walltime.SweepTime(0.0, 0, 0.0), ""
    hardware = memory.resolve_hardware(todo[0].cell.config.get("hardware"))
    if hardware is None:
        return None, "no hardware profile: python -m specbench.calibrate, or hardware=<name>"
    priced: dict[str, CellTiming | None] = {}

    def timing_of(p: grid.PlannedCell) -> CellTiming | None:
        config = {k: v for k, v in p.cell.config.items() if k != "engine_run"}
        key = json.dumps(config, sort_keys=True, default=str)
        if key not in priced:
            priced[key] = plan_row(p.overrides, OmegaConf.create(p.cell.config), alpha, grid.engine_key(p.cell)).timing
        return priced[key]

    costs: list[walltime.CellCost] = []
    starts: list[float] = []
    previous = None
    for p in todo:
        timing = timing_of(p)
        if timing is None:
            return None, f"{p.cell.cell_id} cannot be priced (a workload read only by the engines?)"
        costs.append(replace(timing.cost, engine_runs=1))
        spec = p.cell.engine_spec(prepare=False)
        if spec != previous:
            starts.append(timing.start_s)
        previous = spec
    grid_cells = [timing_of(p) for p in {p.cell.config_hash: p for p in planned or ()}.values()]
    confirmation = confirmation_timings([t for t in grid_cells if t is not None])
    costs += [t.cost for t in confirmation]
    starts += _starts(confirmation)
    return walltime.sweep_time(costs, starts), (f"{hardware.get('name', 'calibrated')}; "
                                                f"{speculation(bool(hardware.get('memory_bytes')), alpha)}")


def speculative_engines(rows: Sequence[PlannedRow]) -> int:
    """Speculative engines per baseline engine in the grid (the engines' degrees of freedom; at least 1)."""
    timings = _timed(rows) or []
    speculative = {t.engine for t in timings if t.speculative}
    baselines = {t.engine for t in timings if not t.speculative}
    return max(1, len(speculative) // max(1, len(baselines)))


def widest_half_width(rows: Sequence[PlannedRow], half_width: float | None = None) -> tuple[float, int, int] | None:
    """The widest half-width a sized cell is expected to get, with its prompts and engine runs; None if none is sized."""
    timings = [t for t in _timed(rows) or () if t.sizable]
    if not timings:
        return None
    return max(((sizing.expected_half_width(t.precision, t.cost.prompts(half_width), t.cost.engine_runs),
                 t.cost.prompts(half_width), t.cost.engine_runs) for t in timings))


def time_lines(rows: Sequence[PlannedRow], alpha: float, half_width: float | None = None) -> list[str]:
    """The plan's wall-time and precision lines."""
    time = plan_time(rows, half_width)
    if time is None:
        return ["estimated wall time: none (a cell is unpriced: pass hardware=<name>, or a workload read only "
                "by the engines)"] if any(not r.problems for r in rows) else []
    timings = _timed(rows) or []
    where = "GPU" if any(t.gpu for t in timings) else "CPU"
    starts = ("weights load and CUDA-graph capture" if where == "GPU" else "KV pool allocation")
    lines = [f"estimated wall time: {duration(time.total_s)} = generation {duration(time.generation_s)} "
             f"({speculation(where == 'GPU', alpha)}) + {time.starts} engine start(s) "
             f"{duration(time.start_s)} ({starts}; {where}) + the sweep's own work {duration(time.overhead_s)}"]
    confirmation = confirmation_timings(timings)
    if confirmation:
        grid_only = walltime.sweep_time([t.cost for t in timings], _starts(timings), half_width)
        lines.append(f"confirm=true: {len(confirmation)} cells measured again after the grid on fresh engines, "
                     f"{max(t.cost.engine_runs for t in confirmation)} engine run(s) each (per verdict its costliest "
                     f"candidate and its baseline), included: {duration(time.total_s - grid_only.total_s)}")
    floor = futility_floor(rows, half_width)
    if floor is not None:
        stopping = may_stop(rows)
        lines.append(f"futility=true: {duration(floor.total_s)} to {duration(time.total_s)}: each of the "
                     f"{stopping} speculative configuration(s) that may stop, where it measures below 1x in engine "
                     f"run 0 and its interval lies below 1, stops there (the shortest: all do; {floor.starts} engine "
                     f"start(s); {futility.MIN_GOING_ON} engines of a batch size go on); one that pays runs every "
                     "engine run")
    widest = widest_half_width(rows, half_width)
    if widest is not None:
        precision = next(t.precision for t in timings if t.sizable)
        target = precision.half_width if half_width is None else half_width
        width, prompts, runs = widest
        engines = sizing.engine_half_width(precision.engine_sd, runs, precision.speculative_engines)
        sized_for = (f"cells sized for +-{target:.0%} (precision.half_width)" if target is not None
                     else "cells unsized (precision.half_width null: each serves workload.num_prompts)")
        grid_engines = speculative_engines(rows)
        lines.append(f"precision: {sized_for}; widest expected 95% half-width +-{_percent(width)} at {prompts} "
                     f"prompts x {runs} engine run(s) (engines +-{_percent(engines)}, prompts "
                     f"+-{_percent(sizing.prompt_half_width(precision.prompt_sd, prompts))})"
                     + (f"; the grid has {grid_engines} speculative engine(s) per baseline engine, priced as "
                        f"precision.speculative_engines={precision.speculative_engines}"
                        if grid_engines != precision.speculative_engines else ""))
    return lines


def speculation(gpu: bool, alpha: float) -> str:
    """How the wall time priced the speculative cells (:func:`cell_timing`)."""
    return f"speculative cells at their predicted speedup, alpha={alpha:g}" if gpu else \
        "speculative cells at plain-decoding speed, as the CPU build measures them"


def duration(seconds: float) -> str:
    """Seconds as the plan prints them: seconds below 90, minutes below 90, hours beyond."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else \
        f"{seconds / 3600:.1f} h"


def _percent(value: float) -> str:
    return "n/a (one engine run)" if value == float("inf") else f"{value:.1%}"


def fit_budget(rows: Sequence[PlannedRow]) -> tuple[walltime.BudgetFit, float] | None:
    """The rows' ``budget`` (minutes) against their estimate; None without a budget.

    Raises:
        ConfigError: one line, when a budget is set but the sweep cannot be priced or does not fit
            even with every sized cell at its floor of prompts; it names the budget that would fit.
    """
    budgets = {r.budget for r in rows if isinstance(r.budget, (int, float))}
    if not budgets:
        return None
    budget = min(budgets)
    timings = _timed(rows)
    if timings is None:
        raise ConfigError(f"budget={budget:g}: the sweep has no time estimate to hold against it "
                          "(pass hardware=<name> or run python -m specbench.calibrate)")
    sizable = [t for t in timings if t.sizable]
    timings = _with_confirmation(timings)  # the confirmation's cells are sized as the grid's
    cells, starts = [t.cost for t in timings], _starts(timings)
    start = (sizable[0].precision.half_width if sizable and sizable[0].precision.half_width is not None
             else (widest_half_width(rows) or (0.05, 0, 0))[0])
    fit = walltime.fit_budget(cells, starts, budget * 60.0, start)
    if not fit.fits:
        raise ConfigError(
            f"budget={budget:g}: the sweep takes at least {math.ceil(fit.floor.total_s / 60)} min (every sized cell at "
            f"its floor of prompts, {fit.floor.starts} engine starts {fit.floor.start_s / 60:.0f} min); "
            f"budget={math.ceil(fit.floor.total_s / 60)} would fit, or fewer cells or engine_runs")
    return fit, budget


def budget_overrides(rows: Sequence[PlannedRow]) -> tuple[list[str], str | None]:
    """The overrides that size the sweep to its ``budget`` (none where it fits as it is, or has no budget),
    and a line saying what the budget did.

    Raises:
        ConfigError: the one line of :func:`fit_budget` when it does not fit.
    """
    fitted = fit_budget(rows)
    if fitted is None:
        return [], None
    fit, budget = fitted
    if fit.half_width is None:
        return [], f"budget={budget:g}: fits as configured (estimated {fit.time.total_s / 60:.0f} min)"
    return ([f"precision.half_width={fit.half_width:g}"],
            f"budget={budget:g}: cells sized for +-{fit.half_width:.1%} to fit (precision.half_width="
            f"{fit.half_width:g}; estimated {fit.time.total_s / 60:.0f} min)")


def within_budget(jobs: Sequence[tuple[str, ...]], compose: Callable[[Sequence[str]], Any]
                  ) -> tuple[list[str], str | None]:
    """:func:`budget_overrides` of a sweep's grid points (baselines added here), composed by ``compose``."""
    return budget_overrides(price_cells(composed_cells(with_baselines(jobs), compose)))


def format_plan(rows: Sequence[PlannedRow], alpha: float) -> str:
    """The plan as a table, then the refused cells one line each, then a summary.

    ``runner``: the vLLM model runner the cell's engine gets (V2 on CUDA, V1 where V2 lacks a feature the
    cell needs, and on the CPU build); ``graphs``: the CUDA graphs' memory, taken from the KV cache; ``capture``:
    the largest size (tokens) the cell's engine captures and, in brackets, how
    many sizes (``eager`` where it captures none).
    """
    gb = 1e9
    width = max([34, *(len(r.label) for r in rows)])  # a K schedule's label is longer
    lines = [f"{'cell':<{width}} {'runner':>6} {'weights':>8} {'drafter':>8} {'graphs':>7} {'capture':>10} "
             f"{'KV B/tok':>8} "
             f"{'KV pool':>8} {'fit reqs':>8} {'peak':>7} {'usable':>7} {'speedup':>7}  verdict",
             f"{'':<{width}} {'':>6} {'GB':>8} {'GB':>8} {'GB':>7} {'tokens':>10} {'':>8} {'GB':>8} {'':>8} {'GB':>7} "
             f"{'GB':>7} {f'a={alpha:g}':>7}"]
    for r in rows:
        e = r.estimate
        capture = (f"{e.capture_sizes[-1]} ({len(e.capture_sizes)})" if e.capture_sizes else "eager"
                   ) if e is not None else ""
        memory_cols = (
            f"{e.target_weight_bytes / gb:>8.2f} {e.drafter_weight_bytes / gb:>8.2f} {e.graph_bytes / gb:>7.2f} "
            f"{capture:>10} {e.kv_bytes_per_token:>8} {e.kv_pool_bytes / gb:>8.2f} {e.requests_fit:>8} "
            f"{e.peak_bytes / gb:>7.1f} {e.usable_bytes / gb:>7.1f}"
            if e is not None else f"{'n/a':>8} {'':>8} {'':>7} {'':>10} {'':>8} {'':>8} {'':>8} {'':>7} {'':>7}"
        )
        speedup = f"{r.predicted_decode_speedup:>6.2f}x" if r.predicted_decode_speedup is not None else f"{'n/a':>7}"
        verdict = ("REFUSED: " + _reason_class(r.problems[0]) if r.problems
                   else f"fits, in waves of {e.batch_at_once}" if _in_waves(r) and e is not None else "fits")
        if r.step_over_limit:
            verdict += f"; step {r.largest_step} > max_num_batched_tokens {r.step_limit}, no graph"
        lines.append(f"{r.label:<{width}} {r.model_runner or '':>6} {memory_cols} {speedup}  {verdict}")
    refused = [r for r in rows if r.problems]
    if refused:
        lines.append("")
        lines.append(f"refused ({len(refused)}):")
        lines += [f"  {' '.join(r.overrides)}: {p}" for r in refused for p in r.problems]
    classes = Counter(_reason_class(r.problems[0]) for r in refused)
    waves = sum(1 for r in rows if _in_waves(r))
    lines.append("")
    lines.append(
        f"{len(rows)} cells: {len(rows) - len(refused)} fit, {len(refused)} refused"
        + (" (" + ", ".join(f"{n} {c}" for c, n in classes.most_common()) + ")" if classes else "")
        + (f"; {waves} run their batch in waves (the KV cache holds fewer requests at once)" if waves else "")
    )
    cycling = [r.cycled_prompts for r in rows if r.cycled_prompts is not None and not r.problems]
    if cycling:
        requests, prompts = max(cycling, key=lambda c: c[0] / c[1])
        lines.append(
            f"{len(cycling)} serving cell(s) cycle their prompts (up to {requests} requests through {prompts} "
            f"prompts, load.cycle_prompts=true): a repeated prompt's prefill comes from the prefix cache where "
            "engine.enable_prefix_caching is on, and its TTFT reads low; leave load.cycle_prompts false for a "
            "prompt per request")
    graphed = [r for r in rows if r.largest_step is not None]
    if graphed:
        lines.append(
            "CUDA graphs: each engine captures sizes up to the largest step of the cells it serves "
            f"(batch x (K+1), per K-schedule tier; a baseline's: its batch); largest step "
            f"{max(r.largest_step or 0 for r in graphed)} tokens")
    over = [r for r in rows if r.step_over_limit]
    if over:
        lines.append(
            f"{len(over)} cell(s) step more tokens than max_num_batched_tokens: vLLM splits such a step "
            "(part of the batch waits) and no single graph holds it; raise engine.max_num_batched_tokens")
    if rows and all(r.estimate is None for r in rows):
        lines.append("no memory figures: pass hardware=<name> (conf/hardware) or run python -m specbench.calibrate")
    lines += time_lines(rows, alpha)
    if extrapolated := extrapolated_cells(rows):
        lines.append(extrapolated)
    return "\n".join(lines)


def extrapolated_cells(rows: Sequence[PlannedRow]) -> str | None:
    """The line saying which of the cells the calibrated profile prices lie outside the range its calibration was
    narrowed to (:func:`specbench.analytic.prediction.narrowed_gaps`): their predicted speedups and times are
    extrapolated. The plan times nothing; ``calibrate --complete``, or the sweep before its cells, measures the
    rest. None where every cell is covered."""
    extents = [r.extent for r in rows if r.extent is not None]
    gaps = prediction.narrowed_gaps(extents, None) if extents else []
    return prediction.extrapolated_note(gaps, "cells") if gaps else None


def _in_waves(row: PlannedRow) -> bool:
    """A cell that runs, but whose batch exceeds the KV cache: vLLM serves it in waves."""
    return not row.problems and row.estimate is not None and row.estimate.batch_at_once < row.estimate.batch_size


def _reason_class(problem: str) -> str:
    for needle, name in (("too big for the device", "too big for the device"),
                         ("below one request", "KV below one max_model_len request"),
                         ("below the longest request", "KV below the longest request")):
        if needle in problem:
            return name
    return "invalid setting"


def main(argv: list[str] | None = None) -> int:
    """Print the plan of the grid the given Hydra overrides describe."""
    parser = argparse.ArgumentParser(
        prog="python -m specbench.plan",
        description="Every cell of a sweep with its predicted memory and speedup; starts no engine.",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m specbench")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help=f"assumed per-token acceptance for the predicted speedup (default {DEFAULT_ALPHA})")
    # A sweep's command line pastes in whole: the plan always prices every cell of the grid.
    parser.add_argument("-m", "--multirun", action="store_true",
                        help="accepted as python -m specbench takes it (the plan prices the whole grid either way)")
    parser.add_argument("-cd", "--config-dir", default=None,
                        help="a folder of your own config groups, as for python -m specbench")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.config_dir is not None:
        overrides.append(f"hydra.searchpath=[file://{Path(args.config_dir).resolve()}]")
    try:
        rows = make_plan(overrides, args.alpha)
    except Exception as exc:  # Hydra's own message (and its cause's) names the bad override
        cause = f"\n{exc.__cause__}" if exc.__cause__ is not None else ""
        print(f"error: {exc}{cause}", file=sys.stderr)
        return 2
    try:
        extra, note = budget_overrides(rows)
        if extra:
            rows = make_plan([*args.overrides, *extra], args.alpha)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_plan(rows, args.alpha))
    if note:
        print(note)
    return 1 if any(r.problems for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
