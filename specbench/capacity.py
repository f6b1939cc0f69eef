"""``python -m specbench.capacity``: the highest request rate each configuration serves within the SLOs.

Takes the overrides of ``python -m specbench`` (composed by Hydra the same
way, grid points such as ``num_speculative_tokens=2,4`` included) and, for
the baseline and each speculative configuration, searches the request rate
(:func:`specbench.analytic.capacity.search`) for the highest rate at which
the Wilson interval of the share of requests meeting every ``load.slo.*``
target lies at or above ``capacity.percentile`` % and the engine keeps up
with the load. Each probe is a serving cell's measurement on the real path
(:mod:`specbench.engine.serving`: the same arrivals, streams and saturation
test as a sweep's serving cells): ``capacity.requests_per_probe`` measured
requests or ``capacity.min_probe_s`` seconds of the rate, whichever is more,
each probe on an arrival draw of its own. The search runs on one engine per
configuration; the bracket's ends are measured again
``capacity.confirmations`` times each, each time on a fresh engine. It prints
a line per probe, a table and a verdict per configuration, and writes
``outputs/<sweep_name>/capacity.json``:

    python -m specbench.capacity method=ngram num_speculative_tokens=4 load.slo.tpot_ms=100

With ``capacity.axis=concurrency`` it searches ``load.max_concurrency`` of a closed loop instead
(every request ready at once, each completion letting the next one go), between
``capacity.min_concurrency`` and ``capacity.max_concurrency``: the most requests in flight at which
the SLOs still hold, with the same probes, decisions and confirmations:

    python -m specbench.capacity method=ngram load.slo.tpot_ms=100 capacity.axis=concurrency

Exits 2 when the configuration is refused (no SLO set, a bad ``capacity.*``
key: one line naming the keys), 1 when an engine failed, else 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from specbench import hub, load, logs, methods
from specbench.analytic import capacity
from specbench.config import ConfigError, Cell, cell_from_config, engine_start_environment
from specbench.results.merge import DISTURBED_SHARE
from specbench.results.provenance import CpuTimes, static_provenance

OUTPUT = "capacity.json"


@dataclass(frozen=True)
class Search:
    """One configuration to search: its label, its cell (at the lowest rate), its SLOs and settings."""

    label: str
    cell: Cell
    targets: dict[str, float]
    settings: capacity.Settings


def searches(overrides: Sequence[str]) -> tuple[list[Search], Any]:
    """The configurations these overrides name, each speculative one's baseline first, and the first composed
    config (its ``sweep_name``, ``verbose`` and engine timeout serve the whole run).

    :class:`specbench.analytic.capacity.CapacityError` without an SLO or with a bad ``capacity.*`` key,
    :class:`ConfigError` for a cell the sweep would refuse.
    """
    from hydra import initialize_config_module

    from specbench.plan import GridComposer, grid_jobs, with_baselines

    found: dict[str, Search] = {}
    first = None
    jobs = with_baselines(grid_jobs(overrides))
    with initialize_config_module("specbench.conf", version_base="1.3"):
        composer = GridComposer()
        for job in jobs:
            cfg = composer(job)
            targets = capacity.slo_targets(OmegaConf.to_container(cfg.load.slo))
            settings = capacity.Settings.of(OmegaConf.to_container(cfg.capacity))
            if cfg.load.get("ramp_up_strategy") is not None:
                raise capacity.CapacityError(
                    f"load.ramp_up_strategy={cfg.load.ramp_up_strategy} in a capacity search: each probe holds one "
                    "rate (or cap) the search sets; leave load.ramp_up_strategy null")
            lowest = settings.span[0]
            # The probe's rate (or cap) is set per probe; the cell stands for the configuration at the lowest.
            if settings.axis == capacity.CONCURRENCY:
                if settings.max_concurrency > cfg.engine.max_num_seqs:
                    raise capacity.CapacityError(
                        f"capacity.max_concurrency={settings.max_concurrency} exceeds "
                        f"engine.max_num_seqs={cfg.engine.max_num_seqs}: the engine would queue what the client "
                        "lets through; lower capacity.max_concurrency or raise engine.max_num_seqs")
                cfg.load.request_rate = float("inf")  # a closed loop: every request ready at once
                cfg.load.max_concurrency = settings.min_concurrency
            else:
                cfg.load.request_rate = lowest
            cfg.load.num_requests = settings.requests(lowest)
            # A probe's 100 requests or more repeat the workload's prompts (a builtin one holds about 40);
            # each probe starts from an empty prefix cache, its warm-up filling it.
            cfg.load.cycle_prompts = True
            cfg.load.warmup_requests = settings.warmup
            cell = cell_from_config(cfg)
            first = first if first is not None else cfg
            found.setdefault(cell.config_hash, Search(methods.label(cell.config["method"], cell.k), cell,
                                                      targets, settings))
    # Several workloads or models (a preset's grid): each label names its own, or the table could not tell them apart.
    for key in ("workload", "model"):
        if len({s.cell.identity[key]["name"] for s in found.values()}) > 1:
            found = {h: dataclasses.replace(s, label=f"{s.label} · {s.cell.identity[key]['name']}")
                     for h, s in found.items()}
    return list(found.values()), first


def _probe(engine: Any, search: Search, prompts: list[tuple[int, ...]], timeout_s: float | None,
           output_tokens: Sequence[int | None] = ()) -> Any:
    """The probe function of one configuration: serve arrival draw ``draw`` at a rate on the engine
    ``engine()`` returns now (a confirmation renews it), and read the probe. ``output_tokens``: each
    prompt's own output length from its record (``load.output_len=dataset``)."""
    cell, axis = search.cell, search.settings.axis

    def probe(rate: float, draw: int) -> capacity.Probe:
        worker = engine()
        # The value searched goes to its load key: the rate, or (a whole number) the closed loop's cap.
        keys = dict(cell.identity["load"], num_requests=search.settings.requests(rate),
                    warmup_requests=search.settings.warmup, **{axis.load_key: int(rate) if axis.integer else rate})
        # Each probe its own arrival draw: a rate measured again meets other arrivals, not the same ones.
        plan = load.serving_plan(keys, prompts, cell.workload["max_tokens"], cell.identity["seed"], draw,
                                 output_tokens)
        started, before = time.perf_counter(), CpuTimes.now(worker.pid)
        measured = worker.measure(plan, timeout_s)
        share = before.other_share(CpuTimes.now(worker.pid))
        found = dataclasses.replace(capacity.probe_of(measured, keys, search.targets, search.settings.percentile,
                                                      time.perf_counter() - started, draw=draw, axis=axis),
                                    other_cpu_share=share)
        outcome = (f"{found.met} of {found.requests} within the SLOs"
                   + (f"; saturated: {found.saturated}" if found.saturated else ""))
        if share is not None and share > DISTURBED_SHARE:
            # Not measured again, unlike a sweep's cell: a probe is one step of a search, and the warning
            # lets a reader weigh the capacity it led to.
            outcome += f"; disturbed: other processes kept {share:.0%} of the cores busy"
        figures = ", ".join(f"{capacity.SLO_METRICS[k]} p{search.settings.percentile:g} {v:.0f} ms"
                            for k, v in sorted(found.figures_ms.items()) if v is not None)
        print(f"  {search.label} at {axis.text(rate)} (draw {draw}): {outcome} [{figures}; {found.duration_s:.0f} s]",
              flush=True)
        return found

    return probe


def run(overrides: Sequence[str]) -> int:
    """Search every configuration; print and write what was found. Returns the exit status."""
    from specbench import job
    from specbench.engine import EngineError, EnginePool
    from specbench.workloads import WorkloadError, check_source

    try:
        todo, cfg = searches(overrides)
        for search in todo:
            hub.fetch_all(search.cell.checkpoints(), search.cell.tokenizer_checkpoints(),
                          search.cell.revisions())
            if problems := check_source(search.cell.workload, search.cell.identity["model"]["path"]):
                raise WorkloadError("\n".join(problems))
    except (capacity.CapacityError, ConfigError, WorkloadError, hub.HubError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_dir = Path("outputs") / str(cfg.sweep_name)
    run_dir.mkdir(parents=True, exist_ok=True)
    engine_log = logs.engine_log(run_dir, bool(cfg.verbose))
    timeout_s = cfg.engine.cell_timeout_s
    first = todo[0]
    settings = first.settings
    if settings.axis == capacity.CONCURRENCY:
        span = (f"a closed loop at {settings.min_concurrency}-{settings.max_concurrency} concurrent requests, "
                f"at most {settings.max_probes} caps per configuration, each probe {settings.requests_per_probe} "
                f"requests")
    else:
        span = (f"{settings.min_rate:g}-{settings.max_rate:g} req/s, at most {settings.max_probes} rates per "
                f"configuration, each probe {settings.requests_per_probe} requests or {settings.min_probe_s:g} s")
    print(f"capacity at {capacity.slo_text(first.targets, settings.percentile)}, "
          f"{span} ({settings.warmup} warm-up first), lengthened up to {settings.max_extensions} times while "
          f"unresolved, the bracket's "
          f"ends measured {settings.confirmations} more times on fresh engines; "
          f"engine log: {engine_log or 'the terminal'}", flush=True)
    job.start_engine_server(engine_log, engine_start_environment(cfg.engine))
    pool = EnginePool()
    results: dict[str, tuple[Search, capacity.Capacity, float]] = {}
    failed: dict[str, str] = {}
    machine = None
    started = time.perf_counter()
    for search in todo:
        workload = job.workload_of(search.cell)
        begun = time.perf_counter()
        try:
            worker = pool.get(search.cell.engine_spec(), engine_log)  # one engine per configuration
            engine_s = time.perf_counter() - begun
            machine = worker.info.machine
            current = [worker]

            def renew(spec: Any = search.cell.engine_spec()) -> None:
                pool.discard()  # a bracket's end measured again: on a fresh engine, as a rerun would be
                current[0] = pool.get(spec, engine_log)

            found = capacity.search(_probe(lambda: current[0], search, list(workload.token_ids), timeout_s,
                                           workload.output_tokens), search.settings, renew=renew)
        except EngineError as exc:
            failed[search.label] = str(exc).splitlines()[0]
            print(f"  {search.label}: FAILED {failed[search.label]}", file=sys.stderr, flush=True)
            continue
        finally:
            pool.discard()
        results[search.cell.config_hash] = (search, found, engine_s)
    lines = _verdicts(results)
    print()
    print(capacity.table([(s.label, c) for s, c, _ in results.values()], first.targets))
    print("\n".join(lines))
    document = {
        "slo": first.targets, "percentile": first.settings.percentile,
        "settings": OmegaConf.to_container(cfg.capacity), "model": first.cell.identity["model"]["name"],
        "workload": first.cell.workload["name"], "axis": settings.axis.name,
        "load_shape": _load_shape(first.cell, settings.axis).text() or None,
        "overrides": list(overrides), "total_s": round(time.perf_counter() - started, 1),
        "configurations": [capacity.as_json(s.label, c) | {"engine_start_s": round(e, 1), "cell_id": s.cell.cell_id,
                                                             "limited_by": c.limited_by(s.targets)}
                           for s, c, e in results.values()],
        "failed": failed, "verdicts": lines, "machine": machine,
        "provenance": static_provenance(),
    }
    (run_dir / OUTPUT).write_text(json.dumps(document, indent=2) + "\n")
    print(f"capacity: {run_dir / OUTPUT}")
    return 1 if failed else 0


def _load_shape(cell: Cell, axis: capacity.Axis = capacity.RATE) -> load.LoadShape:
    """The probes' load shape: concurrency cap, burstiness, and the path (in process, or ``vllm serve``).
    Along the concurrency axis the cap is what is searched and a closed loop has no gaps to shape: the
    path alone."""
    keys = cell.identity["load"]
    if axis == capacity.CONCURRENCY:
        return load.LoadShape(None, 1.0, keys.get("via", "inprocess"))
    return load.LoadShape(keys["max_concurrency"], keys["burstiness"], keys.get("via", "inprocess"))


def _verdicts(results: dict[str, tuple[Search, capacity.Capacity, float]]) -> list[str]:
    """A sentence per speculative configuration whose baseline was searched too."""
    lines = []
    for search, found, _ in results.values():
        if search.cell.is_baseline:
            continue
        base = results.get(search.cell.baseline().config_hash)
        if base is None:
            lines.append(f"{search.label}: no verdict (its baseline's search failed)")
            continue
        lines.append(capacity.verdict(search.label, base[1], found, search.targets, search.settings.percentile))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the searches."""
    parser = argparse.ArgumentParser(
        prog="python -m specbench.capacity",
        description="The highest request rate (or, with capacity.axis=concurrency, the most requests in "
                    "flight) the baseline and each speculative configuration serve within the load.slo.* "
                    "targets (bisection; capacity.* sets the search).",
    )
    parser.add_argument("overrides", nargs="*",
                        help="Hydra overrides, as for python -m specbench, e.g. method=ngram load.slo.tpot_ms=100")
    args = parser.parse_args(argv)
    try:
        return run(args.overrides)
    except Exception as exc:  # Hydra's own message (and its cause's) names the bad override
        from hydra.errors import HydraException

        if not isinstance(exc, HydraException):
            raise
        cause = f"\n{exc.__cause__}" if exc.__cause__ is not None else ""
        print(f"error: {exc}{cause}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
