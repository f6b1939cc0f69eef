"""Run one cell as a job: workload -> engine -> measurement -> row -> files.

A job never raises for a cell that fails: the failure (an exception, an engine
crash, a timeout) is recorded as a failed row and the sweep goes on. A cell
whose complete row is already on disk is skipped, which is what makes a
rerun into the same directory a resume.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import multiprocessing
import multiprocessing.util
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from specbench import hub, load, methods, models
from specbench.analytic import footprint, memory
from specbench.load import ServingPlan
from specbench.measure import CellPlan, DistributionPlan, Measurement
from specbench.config import Cell
from specbench.engine import EngineError, EnginePool, EngineSpec, describe_machine, worker_context
from specbench.results.files import CellFiles
from specbench.results import rows
from specbench.results.provenance import (
    CpuTimes,
    machine_state,
    now_iso,
    provenance_differences,
    static_provenance,
)
from specbench.results import distribution, serving
from specbench.results.exactness import TIE, classify, tie_tolerance
from specbench.results.merge import DISTURBED_SHARE
from specbench.results.schema import SCHEMA_VERSION, ResultsError, read_rows, results_path
from specbench.workloads import Workload, load_workload

log = logging.getLogger(__name__)

# One per process: with Hydra's basic launcher every job of a sweep runs in
# this process, so consecutive cells that share an engine reuse it.
POOL = EnginePool()
# atexit runs its handlers last-registered first. multiprocessing's own exit handler (registered when
# multiprocessing.util is first imported, above) terminates daemonic workers with SIGTERM: run before
# this one, it would kill the last engine before it could stop, leaving its semaphores to the
# resource tracker's "leaked semaphore objects" warning after the sweep. Registered after it, the pool
# stops the engine first.
atexit.register(POOL.discard)


def start_engine_server(engine_log: Path | None, start_env: dict[str, str]) -> None:
    """Start the engine workers' fork server now, so that its import of vLLM (9 s on 2 cores, 20 s
    where Python caches no bytecode) runs while the first job prepares its prompts. Only for jobs that
    run in this process; ``engine_log`` as :func:`run_cell` takes it; ``start_env``: what the engines'
    processes start with (:func:`specbench.config.engine_start_environment`)."""
    worker_context(engine_log, start_env)


class SweepProgress:
    """One progress bar over the cells (done of total, elapsed, ETA) and a line per finished cell.

    Set by the sweeper when jobs run in this process (Hydra's basic
    launcher); jobs launched elsewhere report through their launcher. The bar
    is drawn on a terminal only; the lines are printed everywhere.
    """

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc="cells", unit="cell", disable=None, dynamic_ncols=True)

    def done(self, outcome: CellOutcome) -> None:
        """Count one finished (or skipped, or failed) cell and print its line."""
        from tqdm import tqdm

        if outcome.summary:
            tqdm.write(outcome.summary)
        self._bar.update()

    def close(self) -> None:
        """Finish the display."""
        self._bar.close()


PROGRESS: SweepProgress | None = None


@dataclass(frozen=True)
class CellOutcome:
    """What happened to one cell in this job."""

    cell_id: str
    status: str  # ok | failed | skipped (already complete)
    error: str | None = None
    summary: str | None = None  # the cell's line for the terminal


def completed_row(files: CellFiles, cell: Cell) -> dict[str, Any] | None:
    """The cell's row if it is already measured successfully, with this exact config, by this run's setup.

    A stored row stands for the cell only if its schema, vLLM and torch
    versions, git commit and workload fingerprints (source file and exact
    requests) equal this run's (:func:`current_provenance`); otherwise the
    cell is measured again and a warning says why, so a resume after an
    upgrade, a schema change or an edited prompt file never mixes old and
    new measurements. A damaged file is reported and set aside in
    ``cells/replaced/`` (as a re-measured cell's is) so that the cell is
    measured again; it is never merged, and never lost.
    """
    if not files.row.exists():
        return None
    try:
        row = read_rows(files.row)[0]
    except (ResultsError, IndexError) as exc:
        log.warning("corrupt result for %s, kept aside as %s and measuring it again: %s", cell.cell_id,
                    files.set_aside(), exc)
        return None
    if row.get("status") != "ok" or row.get("config_hash") != cell.config_hash:
        return None
    if cell.config.get("remeasure") == "flagged" and (why := _remeasure_reason(files, row)):
        log.info("%s: measuring it again (remeasure=flagged): %s", cell.cell_id, why)
        return None
    try:
        current = current_provenance(cell)
    except Exception as exc:  # noqa: BLE001 - the measurement will fail with the full error
        log.warning("%s: cannot check the stored result against this run (%s), measuring it again",
                    cell.cell_id, exc)
        return None
    stale = provenance_differences(row, current)
    if stale:
        log.warning("%s: stored result is stale (stored vs now: %s), measuring it again",
                    cell.cell_id, "; ".join(stale))
        return None
    return row


def _remeasure_reason(files: CellFiles, row: dict[str, Any]) -> str | None:
    """Why a stored cell counts as flagged for ``remeasure=flagged``, or None.

    Disturbed by other processes (its own row says so), or of a baseline's family the sweep's last merge
    flagged (:func:`_flagged_families`): every engine run of such a cell is measured again.
    """
    share = row.get("other_cpu_share")
    if share is not None and share > DISTURBED_SHARE:
        return f"other processes kept {share:.0%} of the cores busy"
    merged = results_path(files.row.parent.parent)
    if merged.is_file():
        flagged = _flagged_families(merged, merged.stat().st_mtime_ns)
        if row.get("config_hash") in flagged:
            return flagged[row["config_hash"]]
    return None


@lru_cache(maxsize=4)
def _flagged_families(results: Path, mtime_ns: int) -> dict[str, str]:
    """Why each cell is measured again, by config hash: every cell the sweep's last merge flagged, with
    its baseline and every other cell measured against that baseline.

    A speedup is a paired, order-reversed comparison with the baseline of the same engine runs: a
    flagged cell measured again alone would be compared with a baseline measured hours earlier on
    engines long gone, and a baseline measured again alone with its cells' old runs. So the unit
    measured again is a baseline's family, in fresh engine runs of its own (new engine ids, which
    the merge groups apart from the old engines). Read once per version of the results file
    (``mtime_ns`` is the key's part that changes with it), which stays as it was while the sweep
    measures: every stored cell of a resume asks.
    """
    try:
        rows = read_rows(results)
    except ResultsError:
        return {}
    hash_of = {r["cell_id"]: r.get("config_hash") for r in rows}

    def family(r: dict[str, Any]) -> str | None:
        return r.get("config_hash") if r.get("method") == "baseline" else hash_of.get(r.get("baseline_cell_id"))

    why: dict[str, str] = {}
    flagged_families: dict[str, str] = {}
    for r in rows:
        if r.get("flagged") and r.get("config_hash"):
            why[r["config_hash"]] = "; ".join(r.get("flag_reasons") or ["flagged by the last merge"])
            if (name := family(r)) is not None:
                flagged_families.setdefault(name, f"{r['cell_id']} is flagged")
    for r in rows:
        name = family(r)
        if r.get("config_hash") and name in flagged_families and r["config_hash"] not in why:
            why[r["config_hash"]] = f"measured again with its baseline's cells ({flagged_families[name]})"
    return why


def current_provenance(cell: Cell) -> dict[str, Any]:
    """What this run would record in the columns :func:`provenance_differences` compares."""
    workload, plan = _requests(cell)
    static = static_provenance()
    return {
        "schema_version": SCHEMA_VERSION,
        "vllm_version": static["vllm_version"],
        "torch_version": static["torch_version"],
        "git_commit": static["git_commit"],
        "workload_fingerprint": workload.source_fingerprint,
        "requests_fingerprint": plan.fingerprint,
    }


def _requests(cell: Cell) -> tuple[Workload, CellPlan | ServingPlan]:
    """The cell's workload, tokenized with its model's tokenizer, and the requests it submits
    (a serving cell's on their arrival schedule)."""
    workload = workload_of(cell)
    if cell.is_serving:
        return workload, load.serving_plan(cell.identity["load"], workload.token_ids, cell.workload["max_tokens"],
                                           cell.identity["seed"], cell.engine_run, workload.output_tokens)
    return workload, _plan(cell, workload)


def workload_of(cell: Cell) -> Workload:
    """The cell's workload, tokenized with its model's tokenizer (once per process)."""
    return _workload(json.dumps(cell.workload, sort_keys=True), cell.identity["model"]["path"])


@lru_cache(maxsize=16)
def _workload(workload_json: str, model_path: str) -> Workload:
    # Every cell of a workload (and a resume's check of each stored cell)
    # tokenizes the same source: once per process is enough.
    return load_workload(json.loads(workload_json), _tokenizer(models.resolve(model_path)))


def run_cell(
    cell: Cell, cells_dir: Path, *, engine_runs: int, timeout_s: float | None = None, pool: EnginePool = POOL,
    engine_log: Path | None = None,
) -> CellOutcome:
    """Measure ``cell`` (unless already complete) and write its files under ``cells_dir``.

    An engine started for it sends its output to ``engine_log`` (None: the terminal).
    """
    outcome = _run_cell(cell, cells_dir, engine_runs=engine_runs, timeout_s=timeout_s, pool=pool, engine_log=engine_log)
    if PROGRESS is not None:
        PROGRESS.done(outcome)
    return outcome


def _run_cell(
    cell: Cell, cells_dir: Path, *, engine_runs: int, timeout_s: float | None, pool: EnginePool,
    engine_log: Path | None,
) -> CellOutcome:
    files = CellFiles(cells_dir, cell.cell_id)
    if completed_row(files, cell) is not None:
        log.info("%s: already complete, skipped", cell.cell_id)
        return CellOutcome(cell.cell_id, "skipped")

    started_at = now_iso()
    load_before = os.getloadavg()[0]
    provenance = static_provenance() | {"started_at": started_at}
    try:
        workload, plan = _requests(cell)
        spec = cell.engine_spec()
        provenance |= _revisions(spec)
        worker = pool.get(spec, engine_log)
        (measurement, engine_memory), shares = _least_disturbed(
            worker, plan, timeout_s, cell.config.get("attempts") or 1, cell_label(cell))
        memory_columns: dict[str, Any] = {}
        if engine_memory is not None:
            # A request of the cell at its longest: its longest prompt plus max_tokens.
            request_tokens = footprint.request_kv_tokens(
                max(len(p) for p in plan.prompts), plan.max_tokens, cell.k, engine_memory.kv_block_size)
            memory_columns = rows.memory_columns(
                engine_memory, request_tokens=request_tokens, checkpoint_bytes=_checkpoint_bytes(worker.spec))
    except Exception as exc:  # noqa: BLE001 - a failed cell is data, not a crash
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, EngineError):
            try:
                pool.discard()
            except EngineError as teardown:  # the engine did not go: the next one would meet its memory
                error += f"; then {teardown}"
        log.error("%s failed: %s", cell.cell_id, error)
        row = rows.failed_row(cell, engine_runs, provenance, error=error, machine=_local_machine())
        files.set_aside()
        files.write(row, [], [])
        return CellOutcome(cell.cell_id, "failed", error, f"{cell_label(cell)}: FAILED {error.splitlines()[0]}")

    served = None
    if isinstance(measurement, load.ServingMeasurement):
        served, measurement = measurement, serving.as_measurement(measurement, plan)
    row = rows.measured_row(
        cell, engine_runs, provenance, measurement=measurement, info=worker.info, workload=workload, plan=plan,
        machine=machine_state(load_before), memory=memory_columns, other_cpu_share_per_attempt=shares,
    )
    if served is not None:
        row |= serving.cell_columns(served, cell.identity["load"], plan)
    # Measured before (stale, failed or flagged): that measurement is kept aside, never overwritten.
    files.set_aside()
    files.write(row, measurement.token_ids, workload.prompt_ids)
    log.info(
        "%s: %.2f s median, %.1f tok/s, acceptance length %.2f",
        cell.cell_id, row["wall_time_s"], row["tokens_per_s"], row["acceptance_length"],
    )
    return CellOutcome(cell.cell_id, "ok", summary=cell_summary(cell, row, cells_dir))


# Between attempts at a disturbed cell: long enough for a short burst of other
# work (a build step, an editor's indexer) to pass, short against a cell.
DISTURBED_WAIT_S = 5.0


def _least_disturbed(
    worker: Any, plan: CellPlan | ServingPlan, timeout_s: float | None, attempts: int, label: str
) -> tuple[tuple[Measurement, Any], list[float | None]]:
    """Measure ``plan`` until other processes leave the cores alone, at most ``attempts`` times.

    Each attempt runs on the same engine (warm-up included, memory peaks
    reset); the one that other processes disturbed least is kept with the
    engine's memory read right after it (None for a serving engine), and every attempt's share of the
    cores taken by others is returned in order. A share that cannot be read
    (no /proc) ends the attempts: there is nothing to compare.
    """
    best: tuple[Measurement, Any] | None = None
    best_share = math.inf
    shares: list[float | None] = []
    for attempt in range(attempts):
        if attempt:
            time.sleep(DISTURBED_WAIT_S)
        before = CpuTimes.now(worker.pid)
        measurement = worker.measure(plan, timeout_s)
        share = before.other_share(CpuTimes.now(worker.pid))
        shares.append(share)
        if best is None or (share is not None and share < best_share):
            # A serving engine's memory lives in its engine core's process, which the worker cannot read.
            memory = None if isinstance(plan, ServingPlan) else worker.memory()
            best, best_share = (measurement, memory), share if share is not None else math.inf
        if share is None or share <= DISTURBED_SHARE:
            break
        log.warning("%s: other processes kept %.0f%% of the cores busy (attempt %d of %d)%s", label,
                    100 * share, attempt + 1, attempts, ", measuring again" if attempt + 1 < attempts else "")
    assert best is not None  # attempts >= 1
    return best, shares


def cell_label(cell: Cell) -> str:
    """A cell as a reader names it: its method label (the variant and K, as plots and tables
    name it), batch size, workload, engine run."""
    label = methods.label(cell.config["method"], cell.k)
    # A serving cell's batch is what its load makes it: its offered rate names it instead.
    load_point = f"batch {cell.batch_size}"
    if cell.is_serving:
        keys = cell.identity["load"]
        load_point = (f"closed loop c{keys['max_concurrency']}"
                      if load.is_closed_loop(keys["request_rate"], keys["max_concurrency"])
                      else f"at {keys['request_rate']:g} req/s")
    return f"{label} {load_point} {cell.workload['name']} engine run {cell.engine_run}"


def cell_summary(cell: Cell, row: dict[str, Any], cells_dir: Path) -> str:
    """One line on a finished cell: speedup over its baseline in the same engine run (once that is
    measured), tokens/s, acceptance length, and whether the output is exact.

    Odd engine runs measure speculative cells before their baseline, so a baseline's
    line gives the speedups of those measured before it. The sweep's results
    compare all engine runs at the end; this is the running view.
    """
    files = CellFiles(cells_dir, cell.cell_id)
    if cell.is_baseline:
        earlier = []
        for spec in _rows_against(cells_dir, cell):
            speedup, exact = _versus(CellFiles(cells_dir, spec["cell_id"]), spec, files, row)
            earlier.append(f"{spec['method_label']} {speedup}"
                           + (f" {exact}" if exact else ""))
        measured_before = f"; measured before it: {', '.join(earlier)}" if earlier else ""
        attempts = f" ({note})" if (note := _attempts_note(row)) else ""
        return f"{cell_label(cell)}: {row['tokens_per_s']:.1f} tok/s{attempts}{measured_before}"
    parts = [f"{row['tokens_per_s']:.1f} tok/s", f"acceptance length {row['acceptance_length']:.2f}"]
    parts += [attempts] if (attempts := _attempts_note(row)) else []
    base_files = CellFiles(cells_dir, cell.baseline().cell_id)
    base = completed_row(base_files, cell.baseline())
    if base is None:
        parts.append("speedup once its baseline is measured")
    else:
        speedup, exact = _versus(files, row, base_files, base)
        parts = [speedup, *parts, *([exact] if exact else [])]
    return f"{cell_label(cell)}: {', '.join(parts)}"


def _attempts_note(row: dict[str, Any]) -> str | None:
    """``"measured 3 times: others took 39%, 35%, 4% of the cores; kept 4%"``, or None for one attempt."""
    shares = row.get("other_cpu_share_per_attempt") or []
    if len(shares) < 2:
        return None
    taken = ", ".join("?" if s is None else f"{s:.0%}" for s in shares)
    kept = row.get("other_cpu_share")
    still = " (still disturbed)" if kept is not None and kept > DISTURBED_SHARE else ""
    return f"measured {len(shares)} times: others took {taken} of the cores; kept {kept:.0%}{still}"


def _versus(
    spec_files: CellFiles, spec: dict[str, Any], base_files: CellFiles, base: dict[str, Any]
) -> tuple[str, str | None]:
    """Speedup of one engine run (baseline wall time / the cell's) and exactness (None: tokens unreadable).

    Divergences are classified by the baseline's own top-two margins
    (:mod:`specbench.results.exactness`); the merge adds the control of other
    batch sizes, so a mismatch here may still turn out a tie there.
    """
    if serving.is_serving_row(spec) and (paying := serving.run_speedup(base, spec, serving.PAYS_ON)) is not None:
        # At the same offered load the figure that decides whether it pays (serving.pays), not a wall time.
        speedup = f"E2E p50 {paying:.2f}x"
    else:
        speedup = f"{rows.speedup(base, spec):.2f}x"
    if spec.get("temperature"):
        return speedup, None  # sampled outputs differ by design; the merge checks their distribution
    mine, theirs = spec_files.read_tokens(), base_files.read_tokens()
    if mine is None or theirs is None:
        return speedup, None
    found = classify(theirs, mine, tolerance=tie_tolerance(base.get("dtype")),
                     margins=base.get("top2_margins") or [], near_ties=base.get("near_tie_tokens") or [])
    ties = sum(d.kind == TIE for d in found)
    if not found:
        return speedup, "exact"
    if ties == len(found):
        return speedup, f"exact but for {ties} numerical tie(s)"
    return speedup, f"NOT EXACT: {len(found) - ties} request(s) differ at a clear winner" + (
        f", {ties} at ties" if ties else "")


def _rows_against(cells_dir: Path, baseline: Cell) -> list[dict[str, Any]]:
    """Measured speculative rows of the baseline's engine run that compare against it."""
    against = []
    for path in sorted(cells_dir.glob(f"*-r{baseline.engine_run}.parquet")):
        try:
            row = read_rows(path)[0]
        except (ResultsError, IndexError):
            continue
        if row.get("baseline_cell_id") == baseline.cell_id and row.get("status") == "ok":
            against.append(row)
    return against


def _revisions(spec: EngineSpec) -> dict[str, str | None]:
    """The hub commits of the checkpoints an engine loads, read from their snapshot folders (None: not from the hub)."""
    draft = (spec.speculative_config or {}).get("model")
    return {"model_revision": hub.snapshot_revision(spec.model),
            "drafter_revision": hub.snapshot_revision(draft) if isinstance(draft, str) else None}


def _checkpoint_bytes(spec: EngineSpec) -> tuple[int | None, int | None]:
    """Loaded weight bytes of target and draft model from their local checkpoint files (None: not local)."""
    draft = (spec.speculative_config or {}).get("model")
    return (
        memory.checkpoint_weight_bytes(spec.model, spec.dtype),
        memory.checkpoint_weight_bytes(draft, spec.dtype)
        if isinstance(draft, str) and os.path.isdir(draft) else None,
    )


def _plan(cell: Cell, workload: Workload) -> CellPlan:
    """Requests in full batches: the selected prompts, cycled up to a multiple of the batch size."""
    prompts = workload.token_ids
    batch = cell.batch_size
    count = math.ceil(len(prompts) / batch) * batch
    return CellPlan(
        prompts=tuple(prompts[i % len(prompts)] for i in range(count)),
        batch_size=batch,
        max_tokens=cell.workload["max_tokens"],
        repetitions=cell.identity["repetitions"],
        warmup=cell.identity["warmup"],
        reference_pass=methods.entry(cell.method).reference_pass,
        # A baseline is the reference every divergence is classified against:
        # in a dtype whose near-ties can flip it records its top-two margins.
        tie_tolerance=(tie_tolerance(cell.identity["engine"]["dtype"])
                       if cell.is_baseline and cell.sampling.greedy else None),
        sampling=cell.sampling,
        seed=cell.identity["seed"],
        distribution=None if cell.sampling.greedy else _distribution_plan(cell, workload),
    )


def _distribution_plan(cell: Cell, workload: Workload) -> DistributionPlan:
    """A sampled cell's distribution check: its first prompts, seeds from a stream of its own
    (config hash and engine run), so that every cell draws independently of every other."""
    size = cell.identity.get("distribution_check") or {}
    return DistributionPlan(
        prompts=min(size.get("prompts", distribution.PROMPTS), len(workload.token_ids)),
        samples=size.get("samples", distribution.SAMPLES),
        tokens=min(size.get("tokens", distribution.TOKENS), cell.workload["max_tokens"]),
        stream=f"{cell.config_hash}/r{cell.engine_run}",
        prompt_tokens=size.get("prompt_tokens", distribution.PROMPT_TOKENS),
        step_tokens=memory.step_tokens({}, cell.identity["engine"]),
    )


@lru_cache(maxsize=1)
def _local_machine() -> str:
    """The machine a failed cell ran on, read in a child process: torch would otherwise open the device in
    this one, and keep its context for the rest of the sweep, while the next engine needs the free memory."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(describe_machine).result()


@lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
