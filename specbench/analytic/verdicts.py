"""Every decision a sweep's results support, walked over the grid as it was planned.

The one module that decides: whether a cell pays (:func:`pays`), which cell
to name (:func:`best_row`), how far a configuration pays along the batch
sizes (:func:`verdict`, :func:`reach`), the best configuration per batch size
(:func:`best_configs`), break-even batch sizes (:func:`break_evens`), the
evidence a K schedule is built from (:func:`schedule_evidence`) and the
highest request rate at which a serving configuration pays
(:func:`serving_verdict`). The page (:mod:`specbench.report`), the terminal
(``report.verdict_lines``) and ``python -m specbench.analytic.recommend``
read these decisions and decide nothing themselves.

Every walk runs along the grid *as planned* (:class:`Grid`: the sweep's
``plan.json``, or, for sweeps written without one, every batch size and rate
any cell of the sweep has for that workload), not along the cells that
happen to be judged. It stops at the first planned point that was not judged
(a cell flagged, with mismatched outputs, failed, not compared with a
baseline, never measured, or a saturated rate), names it with why
(:class:`Stop`), and claims nothing past it: a configuration that pays at
batch 4, has a failed cell at 8 and pays again at 16 "pays up to batch 4;
batch 8 not judged (failed: ...), 16 not claimed", and a K schedule never
spans batch 8.

Pure Python over result rows (dicts): no vLLM, nothing that measures.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from specbench.analytic import prediction
from specbench.load import LoadShape
from specbench.results import serving as served
from specbench.results.schema import curve_key, exactness_kind, method_label, recommendable, row_config
from specbench.stats import distributions, intervals

# The serving rules are the merge's (specbench.results.serving), stated once there: the share of the offered
# rate below which a baseline has fallen behind, and the speedup whose interval decides whether a rate pays
# (recorded per cell as ``serving_pays``).
SATURATED_SHARE = served.SATURATED_SHARE
PAYS_ON = f"serving_speedup_{served.PAYS_ON}"


# --- one cell -------------------------------------------------------------------------------------


def has_interval(row: Mapping[str, Any]) -> bool:
    """Whether a row's speedup has an interval (never a zero-width one: that is no interval)."""
    return intervals.is_interval(row.get("speedup_ci_low"), row.get("speedup_ci_high"))


def within_engine_only(row: Mapping[str, Any]) -> bool:
    """Whether a row's interval is its repetitions' alone (one engine run: ``speedup_ci_method``
    ``within-only-...``, :func:`specbench.stats.intervals.speedup_interval`): it leaves out the engine-to-engine spread,
    which a fresh pair of engines adds, so it is narrower than the uncertainty of the speedup."""
    return has_interval(row) and str(row.get("speedup_ci_method") or "").startswith("within-only")


def lower_bound(row: Mapping[str, Any]) -> float:
    """The lower end of a row's speedup interval; its point estimate when it has no interval."""
    return intervals.lower_end(row["speedup"], row.get("speedup_ci_low"), row.get("speedup_ci_high"))


def pays(row: Mapping[str, Any], margin: float = 0.0) -> bool:
    """Whether a row pays: its 95% interval's lower end exceeds 1 + margin (:func:`specbench.stats.intervals.clears`).

    Used by every offline "pays" (verdicts, best configuration, K schedule,
    memory table). A row without an interval is judged on its point estimate.
    """
    return intervals.clears(row["speedup"], row.get("speedup_ci_low"), row.get("speedup_ci_high"), 1.0 + margin)


def simultaneous_lower_bound(row: Mapping[str, Any], candidates: int, confidence: float = 0.95) -> float:
    """The lower end of a row's speedup interval widened to hold for ``candidates`` rows at once (Bonferroni).

    ``exp(log speedup - t sd / sqrt(engine runs))`` with t Student's quantile at
    ``1 - (1 - confidence) / (2 candidates)`` on the row's ``speedup_df``: the
    construction of the row's own interval (:func:`specbench.stats.intervals.speedup_interval`, whose
    ingredients the merge stores) at the level that leaves every candidate covered together.
    Choosing the fastest of several and judging it on its own interval
    would read one lucky cell of eight as a win (an 8-way tie at 1.0x says
    "pays" in about a fifth of sweeps). One candidate, or a row without the
    ingredients (results stored before they were), keeps its own lower end (:func:`lower_bound`).
    """
    speedup, sd, dof, runs = (row.get(c) for c in ("speedup", "speedup_log_sd", "speedup_df", "engine_runs"))
    if candidates <= 1 or not has_interval(row) or not all(_known(v) for v in (sd, dof, runs)) \
            or float(dof) < 1 or int(runs) < 1:
        return lower_bound(row)
    t = distributions.student_t_quantile_real(1.0 - (1.0 - confidence) / (2 * candidates), float(dof))
    return float(row["speedup"]) * math.exp(-t * float(sd) / math.sqrt(int(runs)))


def best_row(rows: Sequence[Mapping[str, Any]], margin: float = 0.0) -> tuple[Mapping[str, Any], bool] | None:
    """The configuration to name among rows, and whether it pays: the one chooser of every decision.

    The fastest row (equal speedups: the smaller K) among those that pay
    over all the candidates at once: each judged on its
    :func:`simultaneous_lower_bound` over the rows fit to be judged
    (:func:`specbench.results.recommendable`; the others never count), so the
    best of several pays only if it would have paid had every candidate been
    judged together. When none does, the fastest row overall, with False.
    None when no row is left.
    """
    candidates = [r for r in rows if recommendable(r)]
    if not candidates:
        return None
    paying = [r for r in candidates if simultaneous_lower_bound(r, len(candidates)) > 1.0 + margin]
    chosen = max(paying or candidates, key=lambda r: (r["speedup"], -(r.get("num_speculative_tokens") or 0)))
    return chosen, bool(paying)


def simultaneous_interval(row: Mapping[str, Any], candidates: int, confidence: float = 0.95
                          ) -> tuple[float, float] | None:
    """Both ends of a row's speedup interval widened to hold for ``candidates`` rows at once (Bonferroni), as
    :func:`simultaneous_lower_bound` builds the lower one; None without the ingredients (or ``candidates`` < 1)."""
    speedup, sd, dof, runs = (row.get(c) for c in ("speedup", "speedup_log_sd", "speedup_df", "engine_runs"))
    if candidates < 1 or not all(_known(v) for v in (speedup, sd, dof, runs)) or float(speedup) <= 0 \
            or float(dof) < 1 or int(runs) < 1:
        return None
    t = distributions.student_t_quantile_real(1.0 - (1.0 - confidence) / (2 * candidates), float(dof))
    half = t * float(sd) / math.sqrt(int(runs))
    return float(speedup) * math.exp(-half), float(speedup) * math.exp(half)


@dataclass(frozen=True)
class Overall:
    """The sweep's largest speedup (:func:`best_overall`).

    ``top``: the cell :func:`best_row` names among every cell of the sweep fit to be judged; ``candidates``: how
    many it was chosen from; ``interval``: its speedup interval over all of them at once (None without the
    ingredients); ``pays``: whether it pays even as the best of them all (its lower bound over the candidates
    above 1). A verdict chooses among fewer, the configurations of one workload at one batch size, and its
    bound is over those: the two are different claims, and a cell can pay in its verdict and not here.
    """

    top: Mapping[str, Any]
    candidates: int
    interval: tuple[float, float] | None
    pays: bool


def best_overall(rows: Sequence[Mapping[str, Any]]) -> Overall | None:
    """The sweep's largest speedup, chosen and judged over every cell fit to be judged (:func:`best_row`), with
    its interval over all of those at once; None when no cell is left."""
    chosen = best_row(rows)
    if chosen is None:
        return None
    top, pays_among = chosen
    candidates = sum(recommendable(r) for r in rows)
    return Overall(top, candidates, simultaneous_interval(top, candidates), pays_among)


def why_not_judged(row: Mapping[str, Any]) -> str | None:
    """Why a speculative cell is not judged (failed, not compared, mismatched outputs, flagged); None if it is."""
    if row.get("status") != "ok":
        return f"failed: {_first_line(row.get('error')) or 'no error recorded'}"
    if not _known(row.get("speedup")):
        return f"not compared: {_first_line(row.get('error')) or 'no speedup'}"
    if exactness_kind(row) == "mismatch":
        return "outputs mismatch the baseline's"
    if row.get("flagged"):
        reasons = [str(r) for r in _items(row.get("flag_reasons"))]
        return "flagged: " + "; ".join(reasons) if reasons else "flagged"
    return None


def _first_line(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value).splitlines()[0]


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _items(value: Any) -> list[Any]:
    """A list column's items; [] for a null (pyarrow gives lists as numpy arrays, nulls as None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    return list(value)


def mode_stop(row: Mapping[str, Any]) -> str | None:
    """Why a walk stops at a cell whose engines ran in other modes than its baseline's (the merge's
    ``mode_mismatch``: eager against CUDA graphs, async scheduling, the model runner); None when they ran
    alike, or when the user pinned the mode (``engine.async_scheduling`` set in the cell's config).

    Such a speedup measures the mode as well as the method: the cell is shown with its caveat, but a walk
    from a cell measured alike does not carry a claim onto it. Pinned, the difference is what the user
    asked to measure: the walk goes on and the caveat travels with the verdict (:func:`gathered_caveats`).
    """
    mismatch = row.get("mode_mismatch")
    if not _known(mismatch) or not mismatch:
        return None
    if (row_config(row).get("engine") or {}).get("async_scheduling") is not None:
        return None
    return f"engines ran in other modes than the baseline's: {mismatch}"


def walk_judges(row: Mapping[str, Any], first: bool) -> bool:
    """Whether a walk up the planned batch sizes judges ``row`` (one of its cells): fit to be judged
    (:func:`specbench.results.recommendable`) and, past the walk's first batch size (``first`` False), measured
    in its baseline's engine modes (:func:`mode_stop`). The rule of :func:`reach` and of :func:`verdict`'s
    choice per batch size, which the K schedule, the best-configuration table and break-even follow too: none
    carries a claim onto a batch size whose cells measure the mode as well as the method."""
    return recommendable(row) and (first or mode_stop(row) is None)


def unjudged_why(row: Mapping[str, Any], first: bool) -> str | None:
    """Why a walk does not judge ``row`` (:func:`walk_judges`): :func:`why_not_judged`, else, past the first
    batch size, :func:`mode_stop`; None when it judges it."""
    return why_not_judged(row) or (None if first else mode_stop(row))


def gathered_caveats(cells: Iterable[Mapping[str, Any]]) -> list[tuple[str, tuple[int, ...]]]:
    """Every caveat of the cells a verdict's walk reached (the merge's ``caveats``), each once, with the
    batch sizes whose cells carry it, in the order first met."""
    found: dict[str, set[int]] = {}
    for row in cells:
        for caveat in _items(row.get("caveats")):
            batches = found.setdefault(str(caveat), set())
            if _known(row.get("batch_size")):
                batches.add(int(row["batch_size"]))
    return [(caveat, tuple(sorted(batches))) for caveat, batches in found.items()]


# --- the planned grid -----------------------------------------------------------------------------

# A cell id (specbench.config.Cell.cell_id):
# method-k<K>-b<batch>-<workload>[-t<T>][-rate<R>[-c<C>][-burst<B>][-server][request shapes]]-<hash>-r<run>,
# the request shapes (specbench.load.shape_id_part): [-in<N>][-out<N>|-outdataset][-rr<R>][-ramp<strategy><A>to<B>].
_CELL_ID = re.compile(r"^(?P<method>.+?)-k(?P<k>\d+)-b(?P<batch>\d+)-(?P<rest>.+)-(?P<hash>[0-9a-f]{12})-r\d+$")
_NUMBER = r"(?:inf|\d+(?:\.\d*)?(?:e[+-]?\d+)?)"
_SHAPES = rf"(?:-in\d+)?(?:-out(?:\d+|dataset))?(?:-rr{_NUMBER})?(?:-ramp[a-z]+{_NUMBER}to{_NUMBER})?"
_REST = re.compile(rf"^(?P<workload>.+?)(?:-t(?P<t>{_NUMBER}))?"
                   rf"(?:-rate(?P<rate>{_NUMBER})(?:-c(?P<c>\d+))?(?:-burst(?P<burst>{_NUMBER}))?(?P<server>-server)?"
                   rf"{_SHAPES})?$")


@dataclass(frozen=True)
class CellName:
    """A cell as its id names it: what the plan lists, and what a row that lost its columns still tells."""

    method: str
    k: int
    batch: int
    workload: str
    temperature: float
    rate: float | None
    config_hash: str
    # Serving cells: the load's shape but for its rate (specbench.load.LoadShape); the default offline.
    shape: LoadShape = LoadShape(None)


def cell_name(cell_id: str) -> CellName | None:
    """The cell an id names (:meth:`specbench.config.Cell.cell_id`); None for an id of another form."""
    found = _CELL_ID.match(cell_id)
    rest = _REST.match(found["rest"]) if found else None
    if found is None or rest is None:
        return None
    shape = LoadShape(None if rest["c"] is None else int(rest["c"]), float(rest["burst"] or 1.0),
                      "server" if rest["server"] else "inprocess")
    return CellName(found["method"], int(found["k"]), int(found["batch"]), rest["workload"],
                    float(rest["t"] or 0.0), None if rest["rate"] is None else float(rest["rate"]), found["hash"],
                    shape)


GridKey = tuple[str, str, float]
"""(sweep name, workload, temperature): the cells whose batch sizes (or rates) one walk runs along."""


def _sweep(row: Mapping[str, Any]) -> str:
    return str(row_config(row).get("sweep_name") or "")


def _cell(row: Mapping[str, Any]) -> CellName | None:
    """A row's identity from its columns, or from its cell id where they are lost (an unreadable cell file)."""
    named = cell_name(str(row.get("cell_id") or ""))
    # A failed serving cell has no load columns (they are measured): its id names its rate.
    rate = row.get("load_request_rate") if _known(row.get("load_request_rate")) else named and named.rate
    if (row.get("workload") is not None and _known(row.get("batch_size"))) or _known(rate):
        temperature = row.get("temperature")
        batch = row.get("batch_size")
        # The load columns where the cell measured them; its id's where it failed before.
        shape = served.load_shape(row) if _known(row.get("load_request_rate")) or named is None else named.shape
        return CellName(
            str(row.get("method")), int(row.get("num_speculative_tokens") or 0), int(batch) if _known(batch) else 1,
            str(row.get("workload")), float(temperature) if _known(temperature) else 0.0,
            float(rate) if _known(rate) else None, str(row.get("config_hash") or (named and named.config_hash) or ""),
            shape if _known(rate) else LoadShape(None))
    return named


@dataclass(frozen=True)
class Grid:
    """The grid as planned: per (sweep, workload, temperature) the batch sizes and request rates of its cells.

    Built by :meth:`of` from a results file's rows and its sweep's
    ``plan.json``; :attr:`unmeasured` are planned cells no row carries (an
    interrupted sweep), named where a walk meets them.
    """

    batches: Mapping[GridKey, tuple[int, ...]] = field(default_factory=dict)
    # Per grid key and load shape: a walk runs along the rates of one shape.
    rates: Mapping[tuple[GridKey, LoadShape], tuple[float, ...]] = field(default_factory=dict)
    unmeasured: tuple[CellName, ...] = ()

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, Any]], plan: Sequence[str] | None = None) -> Grid:
        """The planned grid of one sweep: its rows' points (failed cells and baselines included) and, with the
        cell ids of its ``plan.json``, the planned cells no row carries.

        A planned cell's sweep name is not in its id: it joins every sweep name
        the rows carry (one, unless grids were merged into one directory).
        """
        batches: dict[GridKey, set[int]] = {}
        rates: dict[tuple[GridKey, LoadShape], set[float]] = {}
        hashes: set[str] = set()
        sweeps: set[str] = set()
        for row in rows:
            cell = _cell(row)
            if cell is None:
                continue
            sweeps.add(_sweep(row))
            hashes.add(cell.config_hash)
            _add(batches, rates, (_sweep(row), cell.workload, cell.temperature), cell)
        unmeasured = []
        for cell_id in plan or ():
            cell = cell_name(cell_id)
            if cell is None or cell.config_hash in hashes:
                continue
            unmeasured.append(cell)
            for sweep in sweeps or {""}:
                _add(batches, rates, (sweep, cell.workload, cell.temperature), cell)
        return cls({k: tuple(sorted(v)) for k, v in batches.items()}, {k: tuple(sorted(v)) for k, v in rates.items()},
                   tuple(unmeasured))

    def union(self, other: Grid) -> Grid:
        """Two sweeps' grids as one (the K schedule reads a sweep beside its verification sweep)."""
        def merged(a: Mapping[Any, tuple[Any, ...]], b: Mapping[Any, tuple[Any, ...]]) -> dict[Any, Any]:
            return {k: tuple(sorted(set(a.get(k, ())) | set(b.get(k, ())))) for k in set(a) | set(b)}

        return Grid(merged(self.batches, other.batches), merged(self.rates, other.rates),
                    self.unmeasured + other.unmeasured)

    def batch_sizes(self, rows: Iterable[Mapping[str, Any]]) -> list[int]:
        """The planned batch sizes of the sweeps, workloads and temperatures of ``rows``, with the rows' own."""
        found: set[int] = set()
        for row in rows:
            cell = _cell(row)
            if cell is not None and cell.rate is None:
                found |= {cell.batch, *self.batches.get((_sweep(row), cell.workload, cell.temperature), ())}
        return sorted(found)

    def request_rates(self, rows: Iterable[Mapping[str, Any]]) -> list[float]:
        """The planned request rates of the sweeps, workloads and load shapes of ``rows`` (serving cells), with
        the rows' own."""
        found: set[float] = set()
        for row in rows:
            cell = _cell(row)
            if cell is not None and cell.rate is not None:
                found |= {cell.rate, *self.rates.get(((_sweep(row), cell.workload, cell.temperature), cell.shape), ())}
        return sorted(found)

    def absent(self, like: Mapping[str, Any], batch: int | None = None, rate: float | None = None,
               across_k: bool = False) -> str:
        """Why a configuration (``like``'s; any K with ``across_k``) has no row at a planned point: planned and
        never measured, or not planned for it."""
        cell = _cell(like)
        for planned in self.unmeasured:
            if cell is not None and (planned.method, planned.workload, planned.temperature) == (
                    cell.method, cell.workload, cell.temperature) and (across_k or planned.k == cell.k) and (
                    planned.rate == rate and planned.shape == cell.shape if rate is not None
                    else planned.batch == batch and planned.rate is None):
                return "planned, never measured"
        return "not measured for this configuration"


def _add(batches: dict[GridKey, set[int]], rates: dict[tuple[GridKey, LoadShape], set[float]], key: GridKey,
         cell: CellName) -> None:
    if cell.rate is None:
        batches.setdefault(key, set()).add(cell.batch)
    else:
        rates.setdefault((key, cell.shape), set()).add(cell.rate)


@dataclass(frozen=True)
class Stop:
    """The first planned point a walk could not judge: where, why, and the planned points past it, not claimed."""

    at: float
    why: str
    unclaimed: tuple[float, ...] = ()

    def text(self, unit: str = "batch") -> str:
        """``"batch 8 not judged (failed: ...), 16 not claimed"`` (``unit`` "req/s": ``"6 req/s not judged ..."``)."""
        at, rest = f"{self.at:g}", ", ".join(f"{p:g}" for p in self.unclaimed)
        head = f"batch {at}" if unit == "batch" else f"{at} {unit}"
        tail = "" if not rest else f", {rest} not claimed" if unit == "batch" else f", {rest} {unit} not claimed"
        return f"{head} not judged ({self.why}){tail}"


def _speculative(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r.get("method") not in ("baseline", None)]


def is_serving(row: Mapping[str, Any]) -> bool:
    """Whether a row is a serving cell's: it met an offered load, or (failed before measuring it) its id names one."""
    cell = _cell(row)
    return _known(row.get("load_request_rate")) or (cell is not None and cell.rate is not None)


def _column_why(rows: Sequence[Mapping[str, Any]], grid: Grid, batch: int, first: bool = True) -> str:
    """Why no cell of a workload is judged at a batch size (``first``: the walk's first, where a cell measured
    in other engine modes is judged, :func:`unjudged_why`): each reason once, or why none is there."""
    at = [r for r in _speculative(rows) if (cell := _cell(r)) is not None and cell.batch == batch]
    reasons = list(dict.fromkeys(why for r in at if (why := unjudged_why(r, first)) is not None))
    if reasons:
        return "; ".join(reasons)
    if any(p.batch == batch and p.rate is None and p.method != "baseline" for p in grid.unmeasured):
        return "planned, never measured"
    return "no speculative cell measured"


# --- offline: how far a configuration pays --------------------------------------------------------


@dataclass(frozen=True)
class Reach:
    """How far one configuration pays, walked along its planned batch sizes from a paying cell on."""

    top: Mapping[str, Any]  # the paying cell the walk starts from
    planned: tuple[int, ...]  # the planned batch sizes from top's on
    reached: tuple[int, ...]  # the batch sizes it pays at without a break, top's first
    loss: Mapping[str, Any] | None = None  # the first judged cell past them that does not pay
    stop: Stop | None = None  # the first planned batch size past them not judged
    cells: tuple[Mapping[str, Any], ...] = ()  # the judged cells at the reached batch sizes: their caveats travel


def reach(curve: Sequence[Mapping[str, Any]], top: Mapping[str, Any], planned: Sequence[int], grid: Grid) -> Reach:
    """How far ``top``'s configuration pays: its planned batch sizes from ``top``'s on, until one does not pay or
    is not judged (``curve``: the rows of ``top``'s :func:`specbench.results.curve_key`, any status).

    At a batch size with several rows (two sweeps in one file) every judged one must pay. A cell whose
    engines ran in other modes than its baseline's (:func:`mode_stop`) ends the walk as one not judged.
    """
    start = int(top["batch_size"])
    ahead = tuple(b for b in planned if b >= start)
    reached = [start]
    cells: list[Mapping[str, Any]] = [top]
    for i, batch in enumerate(ahead[1:], start=1):
        here = [r for r in curve if _known(r.get("batch_size")) and int(r["batch_size"]) == batch]
        judged = [r for r in here if recommendable(r) and mode_stop(r) is None]
        if not judged:
            why = next((w for r in here if (w := why_not_judged(r) or mode_stop(r))), None) or grid.absent(
                top, batch=batch)
            return Reach(top, ahead, tuple(reached), stop=Stop(batch, why, ahead[i + 1:]), cells=tuple(cells))
        loss = next((r for r in judged if not pays(r)), None)
        if loss is not None:
            return Reach(top, ahead, tuple(reached), loss=loss, cells=tuple(cells))
        reached.append(batch)
        cells += judged
    return Reach(top, ahead, tuple(reached), cells=tuple(cells))


@dataclass(frozen=True)
class Verdict:
    """Whether speculation pays on one workload, from the smallest planned batch size on, and up to where."""

    compared: list[Mapping[str, Any]]  # speculative cells with a speedup
    judged: list[Mapping[str, Any]]  # ... fit to be judged (recommendable)
    start: int | None = None  # the smallest planned batch size
    top: Mapping[str, Any] | None = None  # the cell best_row names there
    pays: bool = False
    reach: Reach | None = None  # how far top's configuration pays (when it pays)
    start_stop: Stop | None = None  # the smallest planned batch size has no judged cell: nothing is claimed
    per_batch: int | None = None  # choosing the configuration per batch size, it pays up to here (past reach)
    per_batch_stop: Stop | None = None  # ... where that run met a batch size with no judged cell
    per_batch_cells: tuple[Mapping[str, Any], ...] = ()  # the cells that run names, one per batch size

    @property
    def caveats(self) -> list[tuple[str, tuple[int, ...]]]:
        """The caveats of every cell the verdict's walks reached (:func:`gathered_caveats`), not its top's
        alone: a claim up to batch 16 carries batch 16's."""
        walked = self.reach.cells if self.reach is not None else (self.top,) if self.top is not None else ()
        return gathered_caveats([*walked, *self.per_batch_cells])

    @property
    def left_out(self) -> list[Mapping[str, Any]]:
        """Compared cells not judged (mismatched outputs or flagged)."""
        judged = {id(r) for r in self.judged}
        return [r for r in self.compared if id(r) not in judged]


def verdict(rows: Sequence[Mapping[str, Any]], grid: Grid) -> Verdict:
    """The verdict on one workload (``rows``: all its offline cells, failed ones and baselines included).

    It follows the cell :func:`best_row` names at the smallest planned batch
    size, where speculation has its best chance, and walks that
    configuration's planned batch sizes (:func:`reach`). When choosing the
    configuration per batch size pays further, it says so, up to the first
    batch size that has no judged cell or whose best does not pay.
    """
    compared = [r for r in _speculative(rows) if r.get("status") == "ok" and _known(r.get("speedup"))]
    judged = [r for r in compared if recommendable(r)]
    if not judged:
        return Verdict(compared, judged)
    planned = grid.batch_sizes(rows)
    start = planned[0]
    at_start = [r for r in judged if int(r["batch_size"]) == start]
    if not at_start:
        return Verdict(compared, judged, start, start_stop=Stop(start, _column_why(rows, grid, start),
                                                                tuple(planned[1:])))
    chosen = best_row(at_start)
    assert chosen is not None  # judged rows only
    top, paying = chosen
    if not paying:
        return Verdict(compared, judged, start, top)
    key = curve_key(top)
    walked = reach([r for r in _speculative(rows) if curve_key(r) == key], top, planned, grid)
    per_batch, per_batch_stop, per_batch_cells = None, None, []
    for i, batch in enumerate(planned):
        # Past the start, as in reach: a cell measured in other engine modes than its baseline is not judged.
        here = best_row([r for r in judged if int(r["batch_size"]) == batch
                         and (batch == start or mode_stop(r) is None)])
        if here is None:
            at = [r for r in judged if int(r["batch_size"]) == batch]
            why = next((w for r in at if (w := mode_stop(r))), None) or _column_why(rows, grid, batch)
            per_batch_stop = Stop(batch, why, tuple(planned[i + 1:]))
            break
        if not here[1]:
            break
        per_batch = batch
        per_batch_cells.append(here[0])
    if per_batch is None or per_batch <= walked.reached[-1]:
        per_batch, per_batch_stop, per_batch_cells = None, None, []
    return Verdict(compared, judged, start, top, True, walked, None, per_batch, per_batch_stop,
                   tuple(per_batch_cells))


# --- offline: per batch size, break-even ----------------------------------------------------------


@dataclass(frozen=True)
class BestAt:
    """The configuration best_row names at one planned batch size of a workload, or why none is judged there."""

    batch: int
    top: Mapping[str, Any] | None
    cells: int  # the workload's compared cells: the simultaneous interval covers them all
    why: str | None = None  # no judged cell here: why
    # Configurations measured here but not judged (label, why): the choice was made without them (passed_over).
    passed_over: tuple[tuple[str, str], ...] = ()


def best_configs(rows: Sequence[Mapping[str, Any]], grid: Grid) -> list[BestAt]:
    """Per planned batch size of one workload (``rows``: all its offline cells), the cell :func:`best_row` names
    (the fastest judged cell that pays, which is the K the schedule picks there, else the fastest), or why no
    cell is judged there. Nothing past an unjudged batch size is dropped: each entry stands on its own cells.
    Past the smallest planned batch size a cell whose engines ran in other modes than its baseline's is not
    judged (:func:`walk_judges`), as in the K schedule this table shows the choices of; pinned, it is judged
    and its row carries the merge's mode caveat."""
    compared = [r for r in _speculative(rows) if r.get("status") == "ok" and _known(r.get("speedup"))]
    if not any(recommendable(r) for r in compared):
        return []
    out = []
    for i, batch in enumerate(grid.batch_sizes(rows)):
        chosen = best_row([r for r in compared if int(r["batch_size"]) == batch and walk_judges(r, i == 0)])
        out.append(BestAt(batch, chosen[0], len(compared), passed_over=tuple(
            passed_over([r for r in rows if _at_batch(r, batch)], first=i == 0))) if chosen else
                   BestAt(batch, None, len(compared), _column_why(rows, grid, batch, first=i == 0)))
    return out


def passed_over(here: Sequence[Mapping[str, Any]], first: bool = True) -> list[tuple[str, str]]:
    """The configurations among ``here`` (one batch size's cells, any status) with no judged cell, each once
    with why (:func:`unjudged_why`; ``first``: the walk's first batch size): a choice among the rest was made
    without them, so a K picked at batch 8 because K=4 failed there says so rather than read as K=2 beating K=4."""
    judged = {str(method_label(r)) for r in here if walk_judges(r, first)}
    out: dict[str, str] = {}
    for row in _speculative(here):
        label = str(method_label(row))
        if label not in judged and label not in out and (why := unjudged_why(row, first)) is not None:
            out[label] = why
    return sorted(out.items())


def _at_batch(row: Mapping[str, Any], batch: int) -> bool:
    cell = _cell(row)
    return cell is not None and cell.rate is None and cell.batch == batch


@dataclass(frozen=True)
class BreakEven:
    """Where one configuration's speedup first falls below 1×, measured over its judged planned batch sizes."""

    rows: list[Mapping[str, Any]]  # the curve's compared cells
    batch_sizes: list[int]  # its planned batch sizes walked, up to the first not judged
    speedups: list[float | None]  # the measured speedup at each
    measured: float | str | None  # prediction.break_even's crossing over them (None: not reached)
    predicted_sizes: list[int]  # the model's batch sizes: every compared cell's (a prediction needs no judgement)
    predicted_speedups: list[float | None]
    predicted: float | str | None
    stop: Stop | None  # the first planned batch size not judged: the measured crossing is not sought past it
    # The crossing's bracket from the intervals (break_even_bracket): the last walked batch size up to which every
    # cell is shown to pay, and the first whose cells are all shown below 1×; None where there is none.
    pays_through: int | None = None
    below_from: int | None = None
    # The caveats of the walked cells (gathered_caveats): a pinned difference in engine modes travels this way.
    caveats: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)


def break_even_bracket(walked: Sequence[Mapping[str, Any]]) -> tuple[int | None, int | None]:
    """Where a curve's break-even lies by its cells' 95% intervals rather than their point estimates: after
    the largest batch size up to which every cell pays (:func:`pays`), and no later than the smallest
    batch size whose cells' intervals all lie below 1×. Between the two the intervals do not decide, so an
    interpolated crossing there is a point estimate, not a finding. ``walked``: the curve's judged cells
    along its planned batch sizes (as :func:`break_evens` walks them)."""
    by_batch: dict[int, list[Mapping[str, Any]]] = {}
    for row in walked:
        by_batch.setdefault(int(row["batch_size"]), []).append(row)
    pays_through = None
    for batch in sorted(by_batch):
        if not all(pays(r) for r in by_batch[batch]):
            break
        pays_through = batch
    below_from = next((b for b in sorted(by_batch) if all(
        intervals.clears(1.0 / float(r["speedup"]), *_inverse_interval(r), 1.0) for r in by_batch[b])), None)
    return pays_through, below_from


def _inverse_interval(row: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """A row's interval on the inverse speedup (1 / high, 1 / low): below 1× there is above 1× here."""
    if not has_interval(row):
        return None, None
    return 1.0 / float(row["speedup_ci_high"]), 1.0 / float(row["speedup_ci_low"])


def break_evens(rows: Sequence[Mapping[str, Any]], grid: Grid) -> list[BreakEven]:
    """Measured and predicted break-even batch size per curve (:func:`specbench.analytic.prediction.break_even`).

    The measured crossing is sought along the curve's planned batch sizes up
    to the first one not judged (:func:`walk_judges`: past the first, a cell
    whose engines ran in other modes than its baseline's is not judged unless
    the modes were pinned): a speedup measured past a gap may not join the one
    before it. The predicted crossing reads every compared cell.
    """
    compared = [r for r in _speculative(rows) if r.get("status") == "ok" and _known(r.get("speedup"))]
    every = _speculative(rows)
    out = []
    for curve in prediction.break_even(compared):
        key = curve_key(curve["rows"][0])
        mine = [r for r in every if curve_key(r) == key]
        planned = grid.batch_sizes(mine)
        walked, stop = [], None
        for i, batch in enumerate(planned):
            here = [r for r in mine if _known(r.get("batch_size")) and int(r["batch_size"]) == batch]
            if not any(walk_judges(r, i == 0) for r in here):
                why = next((w for r in here if (w := unjudged_why(r, i == 0))), None) or grid.absent(
                    mine[0], batch=batch)
                stop = Stop(batch, why, tuple(planned[i + 1:]))
                break
            walked += [r for r in here if walk_judges(r, i == 0)]
        measured = prediction.break_even(walked) if walked else []
        pays_through, below_from = break_even_bracket(walked)
        out.append(BreakEven(
            rows=curve["rows"],
            batch_sizes=measured[0]["batch_sizes"] if measured else [],
            speedups=measured[0]["series"]["speedup"] if measured else [],
            measured=measured[0]["measured"] if measured else "n/a",
            predicted_sizes=curve["batch_sizes"],
            predicted_speedups=curve["series"]["predicted_speedup"],
            predicted=curve["predicted"],
            stop=stop,
            pays_through=pays_through,
            below_from=below_from,
            caveats=gathered_caveats(walked),
        ))
    return out


# --- offline: across temperatures ----------------------------------------------------------------


@dataclass(frozen=True)
class TemperatureVerdict:
    """How far one configuration pays at one batch size of a workload, walked up its planned temperatures."""

    workload: str
    config: str  # the method label (specbench.results.schema.method_label): "ngram K=4"
    batch: int
    planned: tuple[float, ...]  # the workload's planned temperatures at this batch size, the lowest first
    reached: tuple[float, ...]  # the temperatures it pays at without a break, the lowest first
    loss: Mapping[str, Any] | None = None  # the first judged cell past them that does not pay
    stop: Stop | None = None  # the first planned temperature past them not judged (failed, flagged, ...)


def temperature_verdicts(rows: Sequence[Mapping[str, Any]], grid: Grid) -> list[TemperatureVerdict]:
    """Per workload, configuration and batch size planned at several temperatures (``rows``: every offline
    cell, any status): how far it pays from the lowest planned temperature up (:func:`pays`).

    The walk is :func:`reach`'s along temperatures: the first planned
    temperature whose cell failed, was flagged, has mismatched outputs or was
    never measured ends it, named (:class:`Stop`), and nothing past it is
    claimed; so does the first judged cell that does not pay.
    """
    groups: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for row in _speculative(rows):
        cell = _cell(row)
        if cell is None or cell.rate is not None:
            continue
        groups.setdefault((cell.workload, str(method_label(row)), cell.batch), []).append(row)
    out = []
    for (workload, config, batch), cells in sorted(groups.items()):
        sweeps = {_sweep(r) for r in cells}
        planned = tuple(sorted({t for (sweep, w, t), sizes in grid.batches.items()
                                if sweep in sweeps and w == workload and batch in sizes}
                               | {c.temperature for r in cells if (c := _cell(r)) is not None}))
        if len(planned) < 2:
            continue
        reached: list[float] = []
        loss, stop = None, None
        for i, temperature in enumerate(planned):
            here = [r for r in cells if (c := _cell(r)) is not None and c.temperature == temperature]
            judged = [r for r in here if recommendable(r)]
            if not judged:
                why = next((w for r in here if (w := why_not_judged(r))), None) or _absent_at(
                    grid, cells[0], batch, temperature)
                stop = Stop(temperature, why, planned[i + 1:])
                break
            loss = next((r for r in judged if not pays(r)), None)
            if loss is not None:
                break
            reached.append(temperature)
        out.append(TemperatureVerdict(workload, config, batch, planned, tuple(reached), loss, stop))
    return out


def _absent_at(grid: Grid, like: Mapping[str, Any], batch: int, temperature: float) -> str:
    """Why ``like``'s configuration has no row at a planned (batch size, temperature)."""
    cell = _cell(like)
    if cell is not None and any((p.method, p.k, p.workload, p.batch, p.temperature, p.rate) == (
            cell.method, cell.k, cell.workload, batch, temperature, None) for p in grid.unmeasured):
        return "planned, never measured"
    return "not measured for this configuration"


# --- the K schedule's evidence --------------------------------------------------------------------


def schedule_evidence(
    evidence: Mapping[int, Sequence[Mapping[str, Any]]], every: Sequence[Mapping[str, Any]], grid: Grid,
    margin: float = 0.0,
) -> tuple[dict[int, tuple[int, float | None]], Stop | None]:
    """The K to run at each planned batch size of one family of curves over K, and where the evidence stops.

    ``evidence``: batch size -> the family's judged fixed-K cells there;
    ``every``: the family's cells of the same sweeps, any status (to name why
    a batch size is not judged). Per planned batch size, from the smallest
    up: the K of the cell :func:`best_row` names when it pays, else 0, until
    the first batch size with no judged cell (:func:`walk_judges`: past the
    first, a cell whose engines ran in other modes than its baseline's is not
    judged unless the modes were pinned). That one gets K = 0 (no
    evidence: plain decoding) and nothing past it is claimed, so the schedule
    built from the result (:func:`specbench.analytic.speedup.num_speculative_tokens_per_batch_size`)
    never spans it: vLLM carries the last range's K on to larger batches.
    """
    planned = grid.batch_sizes(every)
    best: dict[int, tuple[int, float | None]] = {}
    for i, batch in enumerate(planned):
        chosen = best_row([r for r in evidence.get(batch, ()) if walk_judges(r, i == 0)], margin)
        if chosen is None:
            here = [r for r in every if _known(r.get("batch_size")) and int(r["batch_size"]) == batch]
            why = "; ".join(dict.fromkeys(w for r in here if (w := unjudged_why(r, i == 0)))) or (
                grid.absent(every[0], batch=batch, across_k=True) if every else "not measured")
            return best, Stop(batch, why, tuple(planned[i + 1:]))
        top, paying = chosen
        best[batch] = (int(top["num_speculative_tokens"]), float(top["speedup"])) if paying else (0, None)
    return best, None


def schedule_caveats(evidence: Mapping[int, Sequence[Mapping[str, Any]]],
                     best: Mapping[int, tuple[int, float | None]]) -> list[tuple[str, tuple[int, ...]]]:
    """The caveats of the cells a K schedule stands on (:func:`gathered_caveats`): at each batch size of
    ``best`` (:func:`schedule_evidence`'s) with K > 0, ``evidence``'s cells of that K. A pinned difference in
    engine modes, which the walk goes on through, travels with the schedule this way."""
    return gathered_caveats([r for batch, (k, _) in sorted(best.items()) if k
                             for r in evidence.get(batch, ()) if int(r["num_speculative_tokens"]) == k])


@dataclass(frozen=True)
class AgainstFixed:
    """A measured K schedule over one fixed K at one batch size: the ratio of their speedups and its interval."""

    k: int
    ratio: float  # the schedule's speedup over the fixed K's (> 1: the schedule is faster)
    low: float | None  # the interval, simultaneous over the fixed Ks compared at this batch size; None: none
    high: float | None
    paired_runs: int  # engine runs the interval is paired over (0: unpaired, both cells' own intervals)


def schedule_against_fixed(schedule: Mapping[str, Any], fixed: Mapping[int, Mapping[str, Any]],
                           confidence: float = 0.95) -> dict[int, AgainstFixed]:
    """The schedule's cell against each fixed K's cell at one batch size, on the ratio of their speedups.

    Paired where the two share their baseline cell and each has a speedup per
    engine run (``speedup_per_engine_run``, two or more, as many on each side):
    run by run the baseline engine cancels, and the interval is Student's on
    the mean log difference over the runs. Otherwise both cells' own
    intervals are combined (their log half-widths as standard errors, in
    quadrature, on the fewer degrees of freedom): a shared baseline makes
    that wider than the truth, never narrower. No interval where a side has
    none. Either way the interval is simultaneous over the fixed Ks
    (Bonferroni): the best fixed K is picked by the same estimates it is
    compared on, so each comparison pays for the choice.
    """
    level = (1.0 - confidence) / max(len(fixed), 1)
    out = {}
    for k, row in fixed.items():
        ratio = float(schedule["speedup"]) / float(row["speedup"])
        paired = _paired_logs(schedule, row)
        low = high = None
        if paired is not None:
            diffs = [a - b for a, b in paired]
            mean = sum(diffs) / len(diffs)
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
            half = distributions.student_t_quantile(1.0 - level / 2, len(diffs) - 1) * sd / math.sqrt(len(diffs))
            ratio, low, high = math.exp(mean), math.exp(mean - half), math.exp(mean + half)
        else:
            sides = [_log_se(schedule, confidence), _log_se(row, confidence)]
            if all(side is not None for side in sides):
                se = math.sqrt(sum(side[0] ** 2 for side in sides if side is not None))
                dofs = [side[1] for side in sides if side is not None and side[1] is not None]
                half = _quantile(1.0 - level / 2, min(dofs) if dofs else None) * se
                low, high = ratio * math.exp(-half), ratio * math.exp(half)
        out[k] = AgainstFixed(k, ratio, low, high, len(paired) if paired is not None else 0)
    return out


def schedule_loses_to(against: Mapping[int, AgainstFixed]) -> list[int]:
    """The fixed Ks the schedule is shown slower than: the whole interval of its ratio lies below 1."""
    return sorted(k for k, a in against.items() if a.high is not None and a.high < 1.0)


def _paired_logs(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[float, float]] | None:
    """Two cells' log speedups run by run, where they can be paired (see :func:`schedule_against_fixed`)."""
    runs_a, runs_b = _items(a.get("speedup_per_engine_run")), _items(b.get("speedup_per_engine_run"))
    if len(runs_a) < 2 or len(runs_a) != len(runs_b) or not _known(a.get("baseline_cell_id")) \
            or a.get("baseline_cell_id") != b.get("baseline_cell_id"):
        return None
    if any(not _known(r) or float(r) <= 0 for r in [*runs_a, *runs_b]):
        return None
    return [(math.log(float(x)), math.log(float(y))) for x, y in zip(runs_a, runs_b)]


def _log_se(row: Mapping[str, Any], confidence: float) -> tuple[float, float | None] | None:
    """A cell's standard error of log speedup, read back from its interval, and its degrees of freedom."""
    if not has_interval(row) or float(row["speedup_ci_low"]) <= 0:
        return None
    dof = float(row["speedup_df"]) if _known(row.get("speedup_df")) and float(row["speedup_df"]) >= 1 else None
    half = (math.log(float(row["speedup_ci_high"])) - math.log(float(row["speedup_ci_low"]))) / 2
    return half / _quantile((1.0 + confidence) / 2, dof), dof


def _quantile(p: float, dof: float | None) -> float:
    """Student's quantile on ``dof`` degrees of freedom; the normal one where they are unknown."""
    return distributions.student_t_quantile_real(p, dof) if dof is not None else NormalDist().inv_cdf(p)


# --- serving: the highest rate at which a configuration pays --------------------------------------


def shape(row: Mapping[str, Any]) -> LoadShape:
    """A serving row's load shape: its load columns, or (a cell that failed before measuring) its id's."""
    cell = _cell(row)
    return cell.shape if cell is not None else LoadShape(None)


def saturation_rate(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """The lowest finite offered rate at which one workload's baseline falls behind the load; None: never.

    A baseline row's ``saturated`` decides where the merge recorded it (the realised offered rate, the
    completions and the queue's growth: :func:`specbench.results.serving.saturation`); a row stored before
    it is read by its achieved rate against the nominal one, under :data:`SATURATED_SHARE`.
    """
    behind = [float(r["load_request_rate"]) for r in rows
              if r.get("method") == "baseline" and r.get("status") == "ok" and _known(r.get("load_request_rate"))
              and math.isfinite(float(r["load_request_rate"])) and _behind(r)]
    return min(behind, default=None)


def _behind(baseline: Mapping[str, Any]) -> bool:
    """Whether a serving baseline fell behind its load (see :func:`saturation_rate`)."""
    if _known(baseline.get("saturated")):
        return bool(baseline["saturated"])
    return _known(baseline.get("achieved_request_rate")) and \
        baseline["achieved_request_rate"] < SATURATED_SHARE * baseline["load_request_rate"]


def _serving_why(row: Mapping[str, Any]) -> str | None:
    """Why a serving cell is not judged at its rate; None when it is."""
    if row.get("status") != "ok":
        return f"failed: {_first_line(row.get('error')) or 'no error recorded'}"
    if _known(row.get("saturated")) and row["saturated"]:
        # Named as saturated even where it is flagged too: it would not be judged either way.
        return f"saturated: {row.get('saturation_reason') or 'it or its baseline fell behind the load'}"
    if not _known(row.get(PAYS_ON)) or row.get("serving_pays") is None:
        return "not compared with a baseline at the same load"
    if row.get("exactness") == "mismatch":
        return "mismatched outputs"
    if row.get("flagged"):
        reasons = [str(r) for r in _items(row.get("flag_reasons"))]
        return "flagged: " + "; ".join(reasons) if reasons else "flagged"
    return None


@dataclass(frozen=True)
class ServingVerdict:
    """How far one serving configuration pays, walked up its workload's planned request rates."""

    cells: list[Mapping[str, Any]]  # its cells, any status, by rate
    planned: tuple[float, ...]
    reached: tuple[float, ...]  # the rates it pays at without a break, the lowest first
    loss: Mapping[str, Any] | None = None  # the first judged cell past them that does not pay
    stop: Stop | None = None  # the first planned rate past them not judged

    @property
    def highest(self) -> float | None:
        """The highest rate it pays at, counted up from the lowest planned; None: it does not pay at the lowest."""
        return self.reached[-1] if self.reached else None


def serving_verdict(cells: Sequence[Mapping[str, Any]], workload_rows: Sequence[Mapping[str, Any]],
                    grid: Grid | None = None) -> ServingVerdict:
    """How far one configuration pays (``cells``: its serving cells; ``workload_rows``: every serving cell of
    its workload, baselines included, for saturation and the planned rates).

    From the lowest planned rate up: a rate past saturation
    (:func:`saturation_rate`) or whose cell failed, was not compared, has
    mismatched outputs, is flagged or was never measured ends the walk, named;
    so does the first rate at which it does not pay (``serving_pays``, the
    merge's :func:`specbench.results.serving.pays`): a noisy win past a loss
    does not extend it.

    The walk runs along the rates of one load shape (:func:`shape`: concurrency cap and burstiness):
    ``cells`` of several shapes are refused (:class:`ValueError`), and only ``workload_rows`` of the
    cells' shape count towards its rates and its saturation.
    """
    shapes = {shape(r) for r in cells}
    if len(shapes) > 1:
        raise ValueError("a serving verdict walks the rates of one load shape; these cells mix "
                         + " and ".join(sorted(s.text() or "no cap, Poisson" for s in shapes))
                         + ": group them by load shape (specbench.analytic.verdicts.shape) first")
    if shapes:
        workload_rows = [r for r in workload_rows if shape(r) in shapes]
    grid = grid or Grid.of(workload_rows)
    planned = tuple(grid.request_rates([*workload_rows, *cells]))
    knee = saturation_rate(workload_rows)
    reached: list[float] = []
    for i, rate in enumerate(planned):
        here = [r for r in cells if (cell := _cell(r)) is not None and cell.rate == rate]
        why = None
        if knee is not None and rate >= knee:
            base = next((b for b in workload_rows if b.get("method") == "baseline" and _known(
                b.get("load_request_rate")) and float(b["load_request_rate"]) == rate), None)
            achieved = (f"baseline: {base['saturation_reason']}" if base and base.get("saturation_reason")
                        else f"the baseline achieved {base['achieved_request_rate']:.2g} req/s"
                        if base and _known(base.get("achieved_request_rate"))
                        else f"the baseline fell behind from {knee:g} req/s")
            why = f"saturated: {achieved}"
        elif not here:
            why = grid.absent(cells[0], rate=rate) if cells else "not measured"
        elif all(_serving_why(r) for r in here):
            why = "; ".join(dict.fromkeys(str(_serving_why(r)) for r in here))
        if why is not None:
            return ServingVerdict(list(cells), planned, tuple(reached), stop=Stop(rate, why, planned[i + 1:]))
        loss = next((r for r in here if _serving_why(r) is None and not r["serving_pays"]), None)
        if loss is not None:
            return ServingVerdict(list(cells), planned, tuple(reached), loss=loss)
        reached.append(rate)
    return ServingVerdict(list(cells), planned, tuple(reached))


def highest_paying_rate(cells: Sequence[Mapping[str, Any]], workload_rows: Sequence[Mapping[str, Any]] = (),
                        grid: Grid | None = None) -> float | None:
    """The highest offered rate at which one configuration's cells still pay, walked up the planned rates
    (:func:`serving_verdict`); None when it does not pay at the lowest."""
    return serving_verdict(cells, [*workload_rows, *cells], grid).highest


@dataclass(frozen=True)
class RateJudgement:
    """What a configuration's verdict under load (:func:`serving_verdict`) says of one of its cells' rates."""

    kind: str  # "pays", "does not pay", "not judged" (why: the walk's stop) or "not claimed" (past the walk's end)
    why: str | None = None


def rate_judgement(decided: ServingVerdict, row: Mapping[str, Any]) -> RateJudgement | None:
    """The verdict line's decision at ``row``'s rate, for a table that lists cells one by one: the rates it
    pays at, the rate it does not, the rate its walk stopped at (saturated, failed, flagged, ...) and the
    rates past that, which it does not claim either way. None for a row of no rate the walk planned."""
    cell = _cell(row)
    rate = cell.rate if cell is not None else None
    if rate is None or rate not in decided.planned:
        return None
    if rate in decided.reached:
        return RateJudgement("pays")
    if decided.stop is not None:
        if rate == decided.stop.at:
            return RateJudgement("not judged", decided.stop.why)
        return RateJudgement("not claimed", f"past {decided.stop.at:g} req/s, not judged")
    if decided.loss is not None:
        at = float(decided.loss["load_request_rate"])
        if rate == at:
            return RateJudgement("does not pay")
        return RateJudgement("not claimed", f"past {at:g} req/s, where it does not pay")
    return None


def pareto_front(points: Sequence[tuple[float | None, float | None]]) -> list[bool]:
    """Which (latency, throughput) points are on the Pareto front: no other point is as fast or faster
    (latency <=) and serves as much or more (throughput >=), better in one of the two. A point missing either
    figure (or with one not finite) is on no front and dominates nothing; equal points are both on it."""
    known = [(i, float(lat), float(thr)) for i, (lat, thr) in enumerate(points)
             if _known(lat) and _known(thr) and math.isfinite(float(lat)) and math.isfinite(float(thr))]
    front = [False] * len(points)
    for i, lat, thr in known:
        front[i] = not any(lat2 <= lat and thr2 >= thr and (lat2 < lat or thr2 > thr) for _, lat2, thr2 in known)
    return front


# --- offline: the chosen configuration measured again (confirm=true) ------------------------------


def confirmation_targets(rows: Sequence[Mapping[str, Any]], grid: Grid) -> list[Mapping[str, Any]]:
    """The cells a confirmation run measures again (``confirm=true``, :mod:`specbench.confirm`): per model, workload
    and temperature of the offline rows, the cell :func:`verdict` names (its ``top``: at the smallest planned batch
    size, the fastest judged cell that pays over all the candidates at once, else the fastest), paying or not.
    Chosen as the fastest of several, its grid speedup leans high (the winner's curse); measured again on fresh
    engines, it does not. A workload whose verdict names no cell (none judged at its smallest batch size) has none.
    """
    panels: dict[tuple[Any, Any, float], list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("workload") is None or is_serving(row):
            continue
        temperature = row.get("temperature")
        key = (row.get("model"), row.get("workload"), float(temperature) if _known(temperature) else 0.0)
        panels.setdefault(key, []).append(row)
    return [top for panel in panels.values() if (top := verdict(panel, grid).top) is not None]


@dataclass(frozen=True)
class Confirmation:
    """A verdict's chosen cell measured again with its baseline on fresh engines, judged on those runs alone."""

    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    pays: bool  # by the rule of every "pays" (:func:`pays`), on the confirmation's own interval: no choice to pay for
    why_not: str | None = None  # the confirmation cannot judge (failed, flagged, mismatched outputs): why


def confirmation(row: Mapping[str, Any]) -> Confirmation | None:
    """The confirmation of a grid cell (its ``confirmation_*`` columns), None where it was not measured again.

    One cell measured again is no choice among several: its own interval decides (:func:`pays`), not a
    simultaneous one. A confirmation that failed, was flagged or mismatched its baseline's outputs judges
    nothing (``confirmation_not_judged`` says why) and confirms nothing.
    """
    if not row.get("confirmation_cell_id"):
        return None
    speedup, low, high = (row.get(f"confirmation_{c}") for c in ("speedup", "ci_low", "ci_high"))
    speedup, low, high = (float(v) if _known(v) else None for v in (speedup, low, high))
    why = row.get("confirmation_not_judged")
    if why or speedup is None:
        return Confirmation(speedup, low, high, False, str(why or "no speedup"))
    return Confirmation(speedup, low, high, pays({"speedup": speedup, "speedup_ci_low": low, "speedup_ci_high": high}))
