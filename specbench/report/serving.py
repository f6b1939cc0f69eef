"""The report's serving section: speedup, latency, goodput and SLO attainment against request rate, throughput
against latency with its Pareto front, the running batch, verdicts.

Serving cells (``load.request_rate`` set; :mod:`specbench.results.serving`)
are kept out of the offline figures and tables, whose axis is the batch size
a cell chose; here the axis is the offered request rate, and the batch is
what the load made it. A rate is marked *saturated* where its baseline's row
says so (``saturated``: :func:`specbench.results.serving.saturation`, from the
realised offered rate, the completions and the queue's growth; rows stored
before it, where the baseline achieved under 85% of the offered rate): from
there on the queue grows and TTFT measures waiting, not the engine.
Saturation, the highest paying rate and the Pareto front are decided in
:mod:`specbench.analytic.verdicts`, over the planned rates; this module words and draws them.

A closed loop (rate inf under ``load.max_concurrency``) names its load by its cap: the figures draw the
closed loops of one workload as one curve against the cap (:data:`CURVE`), as open loops are drawn against
their rate, while the tables and verdicts keep each cap the load shape it is.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import pandas as pd
from matplotlib.ticker import PercentFormatter

from specbench.analytic import capacity
from specbench.analytic import verdicts as decide
from specbench.analytic.verdicts import SATURATED_SHARE, Grid  # noqa: F401 - the page states the share
from specbench.load import is_closed_loop
from specbench.report import plots
from specbench.report.tables import CONFIG, PANEL, VARIANT, fmt_ci, fmt_number, fmt_speedup, grid_of, records
from specbench.results import serving
from specbench.results.schema import row_config


def split(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The results frame's offline rows and its serving rows (a failed serving cell by the rate its id names).

    A serving row's panel names its load shape where it is not the default (no cap, Poisson): every
    serving figure, table and verdict groups by panel, so cells of two shapes are never drawn or judged
    along one rate axis.
    """
    mask = pd.Series([decide.is_serving(r) for r in records(df)], index=df.index, dtype=bool)
    served = df[mask].copy()
    served[CURVE] = [panel + curve_suffix(r) for panel, r in zip(served[PANEL], records(served))]
    served[PANEL] = [panel + shape_suffix(r) for panel, r in zip(served[PANEL], records(served))]
    return df[~mask], served


# The panel a serving curve is drawn in: the row's PANEL, except that closed loops of every cap on one workload
# (and one shape otherwise) share one, whose axis is the concurrency cap (:func:`_along`).
CURVE = "serving_curve"


def curve_suffix(row: Mapping[str, Any]) -> str:
    """:func:`shape_suffix`, but `` · closed loop`` for a closed loop of any cap: a sweep over
    ``load.max_concurrency`` at rate inf is one curve, drawn against the cap as an open loop is against its rate."""
    if not _closed_loop(row):
        return shape_suffix(row)
    rest = dataclasses.replace(decide.shape(row), max_concurrency=None).text()
    return " · closed loop" + (f", {rest}" if rest else "")


def _closed_loop(row: Mapping[str, Any]) -> bool:
    cell = decide.cell_name(str(row.get("cell_id") or ""))
    rate = row.get("load_request_rate") if _known(row.get("load_request_rate")) else cell and cell.rate
    return rate is not None and is_closed_loop(rate, decide.shape(row).max_concurrency)


def shape_suffix(row: Mapping[str, Any]) -> str:
    """`` · c8``, `` · burstiness 0.5``, `` · closed loop c8``, `` · ramp linear 1→8 req/s``: a serving panel's
    load shape; '' for the default."""
    text = ", ".join(t for t in (decide.shape(row).text(), ramp_text(row)) if t)
    if _closed_loop(row):
        text = "closed loop " + text
    return f" · {text}" if text else ""


# A ramp-up's part of a cell id (specbench.load.shape_id_part): ``-ramplinear1to8``.
_RAMP_ID = re.compile(r"-ramp(?P<strategy>linear|exponential)(?P<start>[0-9.e+]+?)to(?P<end>[0-9.e+]+?)-")


def ramp(row: Mapping[str, Any]) -> tuple[str, float, float] | None:
    """A serving row's ramp-up (``load.ramp_up_strategy``, start and end rate in req/s), from its config or,
    for a row without one, its cell id; None for a cell served at one rate.

    A ramp's ``load.request_rate`` is ``inf`` (the ramp sets the rate), so without this a ramp cell and an
    all-at-once cell of one workload would read alike on every figure and table row.
    """
    load = row_config(row).get("load") or {}
    if load.get("ramp_up_strategy") is not None:
        return str(load["ramp_up_strategy"]), float(load["ramp_up_start_rps"]), float(load["ramp_up_end_rps"])
    found = _RAMP_ID.search(str(row.get("cell_id") or ""))
    return (found["strategy"], float(found["start"]), float(found["end"])) if found else None


def ramp_text(row: Mapping[str, Any]) -> str:
    """``"ramp linear 1→8 req/s"``: the ramp-up a row's requests climbed; '' for one rate."""
    climbed = ramp(row)
    return "" if climbed is None else f"ramp {climbed[0]} {climbed[1]:g}→{climbed[2]:g} req/s"


def _panel_grid(grid: Grid, served: pd.DataFrame, panel_rows: pd.DataFrame) -> Grid:
    """The planned grid one panel's verdicts walk.

    A ramp-up is served at rate inf, as an all-at-once cell of its load shape is, so the grid holds its rate
    among that shape's planned ones: a ramp's panel walks its own points alone (from 1 req/s it would find
    nothing measured), and a panel beside it keeps inf only where one of its own cells, measured or planned,
    is at it.
    """
    cells = records(served)
    ramped = [r for r in cells if ramp(r) is not None]
    if not ramped:
        return grid
    if ramp(records(panel_rows)[0]) is not None:
        return Grid.of(records(panel_rows))
    plain = Grid.of([r for r in cells if ramp(r) is None]).rates
    ramp_only = {(key, rate) for key, rates in Grid.of(ramped).rates.items() for rate in rates
                 if rate not in plain.get(key, ()) and not any(
                     (c.workload, c.temperature, c.shape, c.rate) == (key[0][1], key[0][2], key[1], rate)
                     for c in grid.unmeasured)}
    rates = {key: tuple(r for r in rates if (key, r) not in ramp_only) for key, rates in grid.rates.items()}
    return dataclasses.replace(grid, rates=rates)


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"]


def _recorded(df: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """The measured serving rows that recorded every one of ``columns`` (none where the frame lacks one: rows
    stored before a column was added)."""
    rows = _ok(df)
    if not all(c in rows for c in columns):
        return rows[0:0]
    return rows[rows[list(columns)].notna().all(axis=1)]


def saturation_rate(panel_rows: pd.DataFrame) -> float | None:
    """The lowest finite offered rate at which one workload's baseline falls behind the load; None: never
    (:func:`specbench.analytic.verdicts.saturation_rate`)."""
    return decide.saturation_rate(records(panel_rows))


@dataclass(frozen=True)
class ServingRow:
    """One line of the serving table: a configuration at one rate on one workload."""

    panel: str
    config: str
    rate: str
    realised: str
    saturated: bool
    running_batch: str
    achieved: str
    slo_attainment: str
    acceptance: str
    tpot_p50_ms: str
    tpot_p90_ms: str
    tpot_mean_ms: str
    queue_p50_ms: str
    wait_ms: str
    e2e_from_arrival_p50_ms: str
    tpot_speedup: str
    e2e_p50_speedup: str
    e2e_p90_speedup: str
    goodput_speedup: str
    predicted: str
    pays: str
    exactness: str


def _ms(value: Any) -> str:
    return fmt_number(value * 1000.0, 1) if value is not None and not pd.isna(value) else "–"


def _speedup(row: Mapping[str, Any], name: str) -> str:
    point = row.get(f"serving_speedup_{name}")
    if point is None or pd.isna(point):
        return "–"
    return f"{fmt_speedup(point)} {fmt_ci(row.get(f'serving_speedup_{name}_ci_low'), row.get(f'serving_speedup_{name}_ci_high'))}"


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and not pd.isna(value)


def _attainment(row: Mapping[str, Any]) -> str:
    share = row.get("slo_attainment")
    if not _known(share):
        return "–"
    low, high = row.get("slo_attainment_ci_low"), row.get("slo_attainment_ci_high")
    return f"{share:.0%}" + (f" [{low:.0%}, {high:.0%}]" if _known(low) and _known(high) else "")


def _tpot_mean(row: Mapping[str, Any]) -> str:
    mean, std = row.get("tpot_s_request_mean"), row.get("tpot_s_std")
    if not _known(mean):
        return "–"
    return _ms(mean) + (f" ± {_ms(std)}" if _known(std) else "")


def table(df: pd.DataFrame, grid: Grid | None = None) -> list[ServingRow]:
    """Every measured serving cell, by workload, configuration and rate (baselines first).

    The verdict column is the verdict line's decision at the cell's rate
    (:func:`specbench.analytic.verdicts.rate_judgement` of its configuration's
    :func:`specbench.analytic.verdicts.serving_verdict`), not the cell's own
    interval: a saturated rate is "not judged" here as there.
    """
    grid = grid or grid_of(df)
    decided = {}
    for panel, panel_rows in df.groupby(PANEL, sort=True):
        spec = panel_rows[panel_rows["method"] != "baseline"]
        for config, group in spec.groupby(CONFIG, sort=True):
            decided[(panel, config)] = decide.serving_verdict(records(group), records(panel_rows),
                                                              _panel_grid(grid, df, panel_rows))
    rows = _ok(df)
    out = []
    for panel, panel_rows in rows.groupby(PANEL, sort=True):
        ordered = panel_rows.assign(_base=panel_rows["method"] != "baseline").sort_values(
            ["_base", CONFIG, "load_request_rate"])
        for row in ordered.to_dict("records"):
            walked = decided.get((panel, row[CONFIG]))
            judged = decide.rate_judgement(walked, row) if walked is not None else None
            out.append(ServingRow(
                panel=str(panel), config=str(row[CONFIG]), rate=_offered(row),
                realised=fmt_number(row.get("offered_rate_realised"), 2),
                saturated=bool(row.get("saturated")) if _known(row.get("saturated")) else False,
                running_batch=fmt_number(row.get("running_batch_mean"), 2),
                achieved=fmt_number(row.get("achieved_request_rate"), 2),
                slo_attainment=_attainment(row),
                acceptance=fmt_number(row.get("acceptance_length"), 2) if row["method"] != "baseline" else "–",
                tpot_p50_ms=_ms(row.get("tpot_s_p50")), tpot_p90_ms=_ms(row.get("tpot_s_p90")),
                tpot_mean_ms=_tpot_mean(row),
                queue_p50_ms=_ms(row.get("queue_s_p50")),
                wait_ms=(f"{_ms(row.get('wait_to_send_s_p50'))} / {_ms(row.get('wait_to_send_s_p90'))}"
                         if _known(row.get("wait_to_send_s_p50")) else "–"),
                e2e_from_arrival_p50_ms=_ms(row.get("e2e_from_arrival_s_p50")),
                tpot_speedup=_speedup(row, "tpot_p50"), e2e_p50_speedup=_speedup(row, "e2e_p50"),
                e2e_p90_speedup=_speedup(row, "e2e_p90"), goodput_speedup=_speedup(row, "goodput"),
                predicted=fmt_speedup(row["serving_predicted_speedup"])
                if row.get("serving_predicted_speedup") is not None and not pd.isna(row["serving_predicted_speedup"])
                else "–",
                pays="" if judged is None else judged.kind + (f" ({judged.why})" if judged.why else ""),
                exactness=str(row.get("exactness") or "–") if row["method"] != "baseline" else "reference",
            ))
    return out


def verdicts(df: pd.DataFrame, grid: Grid | None = None) -> list[str]:
    """One line per workload and configuration: the highest rate at which it still pays, walked up the planned
    rates (:func:`specbench.analytic.verdicts.serving_verdict`), and the first rate not judged, named."""
    grid = grid or grid_of(df)
    lines = []
    for panel, panel_rows in df.groupby(PANEL, sort=True):
        workload = records(panel_rows)
        spec = panel_rows[panel_rows["method"] != "baseline"]
        for config, group in spec.groupby(CONFIG, sort=True):
            cells = records(group)
            decided = decide.serving_verdict(cells, workload, _panel_grid(grid, df, panel_rows))
            compared = [r for r in cells if r.get("status") == "ok" and r.get("serving_speedup_e2e_p50") is not None]
            if not compared:
                lines.append(f"{panel}, {config}: not compared with a baseline at the same load")
                continue
            by_rate = ", ".join(f"{_load_name(r)} {fmt_speedup(r['serving_speedup_e2e_p50'])}"
                                for r in sorted(compared, key=lambda r: r["load_request_rate"]))
            mismatched = [r for r in compared if r.get("exactness") == "mismatch"]
            flagged = [r for r in compared if r.get("exactness") != "mismatch" and r.get("flagged")]
            left = "".join(
                f"; {_rates(out)} req/s left out: {why}"
                for out, why in ((mismatched, "mismatched outputs"), (flagged, "flagged (see Flagged cells)")) if out)
            stop = "" if decided.stop is None else f"; {decided.stop.text('req/s')}"
            if decided.highest is not None and math.isinf(decided.highest):
                head = "pays"  # all at once, or a closed loop: one point, which the panel names
            elif decided.highest is not None:
                head = f"pays up to {decided.highest:g} req/s"
            elif decided.loss is not None:
                head = f"does not pay at {decided.planned[0]:g} req/s, the lowest rate"
            else:
                head = "no verdict"
            lines.append(f"{panel}, {config}: {head} (E2E p50 speedup: {by_rate}){stop}{left}")
    return lines


@dataclass(frozen=True)
class OfflinePair:
    """One line of the offline-beside-serving table: a serving cell and the offline cell nearest its batch."""

    panel: str
    config: str
    rate: str
    running_batch: str
    serving: str
    serving_model: str
    offline_batch: str
    offline: str
    offline_model: str
    left_out: bool


def _relative_errors(pairs: list[tuple[Any, Any]]) -> list[float]:
    """|a / b - 1| for each pair where both are known and b is positive."""
    return [abs(a / b - 1.0) for a, b in pairs
            if a is not None and b is not None and not pd.isna(a) and not pd.isna(b) and b > 0]


def offline_beside(offline: pd.DataFrame, served: pd.DataFrame) -> tuple[list[OfflinePair], str | None]:
    """Each speculative serving cell beside the offline cell of its configuration and workload at the batch
    size nearest its mean running batch (:func:`specbench.results.serving.offline_beside_serving`), and the
    answer the data give: does the offline speedup at batch B predict the serving speedup at the rate whose
    mean running batch is B? ``([], None)`` where the results hold no offline cell to pair with.
    """
    table = serving.offline_beside_serving(_ok(offline).to_dict("records"), _ok(served).to_dict("records"))
    table = [t for t in table if t["offline_decode_speedup"] is not None]
    if not table:
        return [], None
    rows = [OfflinePair(
        panel=str(t["workload"]), config=str(t["config"]), rate=f"{float(t['request_rate']):g}",
        running_batch=fmt_number(t["running_batch_mean"], 2), serving=fmt_speedup(t["serving_tpot_speedup"]),
        serving_model=fmt_speedup(t["serving_predicted"]), offline_batch=str(int(t["offline_batch"])),
        offline=fmt_speedup(t["offline_decode_speedup"]), offline_model=fmt_speedup(t["offline_predicted"]),
        left_out=bool(t["left_out"]),
    ) for t in sorted(table, key=lambda t: (str(t["workload"]), str(t["config"]), float(t["request_rate"])))]
    judged = [t for t in table if not t["left_out"]]
    offline_error = _relative_errors([(t["offline_decode_speedup"], t["serving_tpot_speedup"]) for t in judged])
    if not offline_error:
        return rows, None
    above = sum(t["offline_decode_speedup"] > t["serving_tpot_speedup"] for t in judged)
    answer = (f"Over {len(offline_error)} serving cells, the offline decode speedup at the batch size nearest the "
              f"mean running batch is within {np.median(offline_error):.0%} of the serving TPOT p50 speedup at the "
              f"median and {max(offline_error):.0%} at worst; it is the higher of the two in {above} of "
              f"{len(judged)}.")
    for name, errors in (
        ("offline", _relative_errors([(t["offline_predicted"], t["offline_decode_speedup"]) for t in judged])),
        ("serving", _relative_errors([(t["serving_predicted"], t["serving_tpot_speedup"]) for t in judged])),
    ):
        if errors:
            answer += f" The model is off the {name} speedup by {np.median(errors):.0%} at the median ({max(errors):.0%} at worst)."
    return rows, answer


def _load_name(row: Mapping[str, Any]) -> str:
    """A row's offered load in words: ``"2 req/s"``, ``"all at once"`` for rate inf (every request ready at the
    start; a closed loop too), ``"ramp linear 1→8 req/s"`` for a ramp-up, whose rate is inf as well."""
    return ramp_text(row) or _rate(float(row["load_request_rate"]))


def _rate(rate: float) -> str:
    """``"2 req/s"``; ``"all at once"`` for rate inf (every request ready at the start)."""
    return f"{rate:g} req/s" if math.isfinite(rate) else "all at once"


def _offered(row: Mapping[str, Any]) -> str:
    """The table's offered load (its column counts req/s): ``2``, ``all at once``, ``ramp linear 1→8 req/s``."""
    rate = float(row["load_request_rate"])
    return ramp_text(row) or (f"{rate:g}" if math.isfinite(rate) else "all at once")


def _rates(rows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['load_request_rate']:g}" for r in rows)


def _rates_axis(ax: Any, rates: list[float], inf_label: str = "all") -> dict[float, float]:
    """Rates on a log-2 axis; ``inf`` (all at once, or a ramp-up) drawn one step past the highest finite rate,
    labelled ``inf_label``."""
    finite = sorted(r for r in rates if math.isfinite(r))
    top = (finite[-1] * 2) if finite else 1.0
    where = {r: (r if math.isfinite(r) else top) for r in rates}
    ticks = sorted(set(where.values()))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(plots.FixedLocator(ticks))
    ax.xaxis.set_minor_locator(plots.NullLocator())
    ax.set_xticklabels([f"{t:g}" if any(r == t and math.isfinite(r) for r in rates) else inf_label for t in ticks])
    ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)
    ax.set_xlabel("offered request rate (req/s)")
    return where


def _along(ax: Any, curve: pd.DataFrame) -> pd.Series:
    """Each row's place on one curve's load axis, set up on ``ax``: its offered rate (log 2, "all" for all at
    once), or, on a curve of closed loops, its concurrency cap (log 2): the load a closed loop names."""
    if _closed_curve(curve):
        caps = _load_values(curve)
        ticks = sorted(set(caps))
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(plots.FixedLocator(ticks))
        ax.xaxis.set_minor_locator(plots.NullLocator())
        ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)
        ax.set_xlabel("max concurrency (closed loop)")
        return caps
    # A ramp-up's rate is inf as well; its curve holds that ramp alone (the panel names it, :func:`shape_suffix`).
    ramps = [_load_label(r) for r in records(curve) if ramp(r) is not None]
    where = _rates_axis(ax, [float(r) for r in curve["load_request_rate"]], ramps[0] if ramps else "all")
    return curve["load_request_rate"].astype(float).map(where)


def _closed_curve(curve: pd.DataFrame) -> bool:
    """Whether every row of a curve is a closed loop: its load is the concurrency cap, not a rate."""
    return all(_closed_loop(r) for r in records(curve))


def _load_values(curve: pd.DataFrame) -> pd.Series:
    """The load each row of one curve was measured at: its offered rate, or its cap on a closed-loop curve."""
    column = "load_max_concurrency" if _closed_curve(curve) else "load_request_rate"
    return curve[column].astype(float)


def _load_label(row: Mapping[str, Any]) -> str:
    """A point's load, as its curve's axis names it: ``2`` (req/s), ``all`` (all at once), ``ramp 1→8`` (a ramp-up
    from 1 to 8 req/s) or ``c16`` (closed loop)."""
    if _closed_loop(row):
        return f"c{int(row['load_max_concurrency'])}"
    climbed = ramp(row)
    if climbed is not None:
        return f"ramp {climbed[1]:g}→{climbed[2]:g}"
    rate = float(row["load_request_rate"])
    return f"{rate:g}" if math.isfinite(rate) else "all"


def _mark_saturation(ax: Any, knee: float | None, where: Mapping[float, float]) -> None:
    if knee is not None and knee in where:
        ax.axvspan(where[knee] / 1.2, ax.get_xlim()[1], color="0.9", zorder=0)
        ax.text(where[knee], ax.get_ylim()[1], " saturated", va="top", ha="left", fontsize=8, color="0.35")


def _configurations(cells: pd.DataFrame, x: pd.Series) -> Iterator[tuple[str, str, int, pd.DataFrame, np.ndarray]]:
    """Each configuration's cells in order along the load axis (``x``: each row's place, by index): its label,
    variant, K, the cells and their places."""
    for (config, variant, k), s in cells.groupby([CONFIG, VARIANT, "num_speculative_tokens"], sort=True):
        s = s.assign(_x=x.loc[s.index]).sort_values("_x")
        yield str(config), str(variant), int(k), s, s["_x"].to_numpy(dtype=float)


def _places(curve: pd.DataFrame, x: pd.Series) -> dict[float, float]:
    """Offered rate to place on the axis, for marking saturation (a closed-loop curve has no finite rate)."""
    return dict(zip(curve["load_request_rate"].astype(float), x.loc[curve.index]))


def _two_rows(panels: list[str]) -> tuple[Any, Any]:
    """A figure of two rows of axes (two figures on one load axis), a column per panel: the figure and its
    axes, ``grid[row][column]``."""
    fig = plots.Figure(figsize=(max(plots._PANEL_W * len(panels), plots._MIN_WIDTH), plots._PANEL_H * 2),
                       layout="constrained")
    return fig, fig.subplots(2, len(panels), squeeze=False)


def _handles(cells: pd.DataFrame, enc: plots.Encoding) -> list[Any]:
    """Legend entries for the configurations drawn: variant colours, K markers."""
    ks = sorted(int(k) for k in cells["num_speculative_tokens"].unique())
    return enc.legend(sorted(cells[VARIANT].unique()), ks)


def _with_legend(plot: plots.Plot, fig: Any, cells: pd.DataFrame, enc: plots.Encoding) -> plots.Plot:
    """The plot with its figure, under the legend of the configurations drawn (variant colours, K markers)."""
    plots._legend(fig, _handles(cells, enc))
    return plots.replace(plot, image=plots._png(fig))


Draw = Callable[[Any, pd.DataFrame, Any, Any, str], None]


class Figure(Protocol):
    """A serving figure as the page draws it, ``figure(df, enc)``, with its section declared (``figure.plot``:
    anchor, title and caption, which the page keeps where drawing fails)."""

    plot: plots.Plot
    __name__: str

    def __call__(self, df: pd.DataFrame, enc: plots.Encoding) -> plots.Plot: ...


def _figure(anchor: str, title: str, caption: str
            ) -> Callable[[Callable[[plots.Plot, pd.DataFrame, plots.Encoding], plots.Plot]], Figure]:
    """Declares a figure's section of the page: the decorated ``draw(plot, df, enc)`` gets it to fill in (or say
    why it is empty), and the figure it becomes keeps it as ``.plot``."""
    declared = plots.Plot(anchor=anchor, title=title, caption=caption)

    def declare(draw: Callable[[plots.Plot, pd.DataFrame, plots.Encoding], plots.Plot]) -> Figure:
        @functools.wraps(draw)
        def figure(df: pd.DataFrame, enc: plots.Encoding) -> plots.Plot:
            return draw(declared, df, enc)

        figure.plot = declared  # type: ignore[attr-defined]
        return cast(Figure, figure)

    return declare


def _against_rate(anchor: str, title: str, caption: str, column: str, ylabel: str, missing: str
                  ) -> Callable[[Draw], Figure]:
    """Declares a figure that :func:`_per_configuration_against_rate` draws with the decorated ``draw(ax, cells, x,
    colour, marker)``, one configuration at a time."""
    def declare(draw: Draw) -> Figure:
        @_figure(anchor, title, caption)
        @functools.wraps(draw)
        def figure(plot: plots.Plot, df: pd.DataFrame, enc: plots.Encoding) -> plots.Plot:
            return _per_configuration_against_rate(plot, df, enc, column, draw, ylabel, missing)

        return figure

    return declare


def _per_configuration_against_rate(
    plot: plots.Plot, df: pd.DataFrame, enc: plots.Encoding, column: str,
    draw: Draw, ylabel: str, missing: str,
) -> plots.Plot:
    """One panel per workload and load shape (:data:`CURVE`) of the speculative serving cells that have ``column``:
    ``draw(ax, cells, x, colour, marker)`` per configuration against the offered load (:func:`_along`), a line
    at 1 and saturation marked."""
    rows = _ok(df)
    comp = _recorded(rows, column)
    comp = comp[comp["method"] != "baseline"]
    if comp.empty:
        return plots._without(plot, missing)
    panels = sorted(comp[CURVE].unique())
    with plots._style():
        fig, axes = plots._facets(panels)
        for ax, panel in zip(axes, panels):
            curve = rows[rows[CURVE] == panel]
            x = _along(ax, curve)
            for _, variant, k, s, xs in _configurations(comp[comp[CURVE] == panel], x):
                draw(ax, s, xs, enc.colour(variant), enc.marker(k))
            ax.axhline(1.0, color="0.3", ls=":", lw=1)
            ax.set_ylabel(ylabel)
            _mark_saturation(ax, saturation_rate(curve), _places(curve, x))
        return _with_legend(plot, fig, comp, enc)


@_against_rate(
    anchor="serving-speedup", title="Serving: speedup against request rate",
    caption=("Speedup at the same offered load (same arrival times and prompts as the baseline) on the "
             "median end-to-end latency (filled, with 95% intervals across engine runs) and the median time "
             "per output token (hollow); dashed: the analytic model's decode speedup at the measured mean "
             "running batch. Grey: past saturation, where the baseline falls behind the load."),
    column="serving_speedup_e2e_p50", ylabel="speedup (×)",
    missing="No serving cell was compared with a baseline at the same load.")
def speedup_vs_rate(ax: Any, s: pd.DataFrame, x: Any, colour: Any, marker: str) -> None:
    """Serving speedup against request rate, with intervals, the model's prediction and saturation marked."""
    y = s["serving_speedup_e2e_p50"].to_numpy(dtype=float)
    low = (y - s["serving_speedup_e2e_p50_ci_low"].to_numpy(dtype=float, na_value=np.nan)).clip(min=0)
    high = (s["serving_speedup_e2e_p50_ci_high"].to_numpy(dtype=float, na_value=np.nan) - y).clip(min=0)
    ax.errorbar(x, y, yerr=np.nan_to_num([low, high]), color=colour, marker=marker,
                ms=6, lw=1.6, capsize=3, elinewidth=1)
    ax.plot(x, s["serving_speedup_tpot_p50"].to_numpy(dtype=float), color=colour,
            marker=marker, mfc="white", ls=":", lw=1)
    if "serving_predicted_speedup" in s and s["serving_predicted_speedup"].notna().any():
        ax.plot(x, s["serving_predicted_speedup"].to_numpy(dtype=float), color=colour, ls="--", lw=1)


@_figure(anchor="serving-latency", title="Serving: TPOT and TTFT against request rate",
         caption=("Time per output token (top) and time to first token (bottom), p50 solid and p90 dashed, per "
                  "configuration; the dotted grey line under TTFT is the baseline's median queueing delay (arrival "
                  "to first scheduling), the part of TTFT that is waiting. Grey: past saturation."))
def latency_vs_rate(plot: plots.Plot, df: pd.DataFrame, enc: plots.Encoding) -> plots.Plot:
    """TPOT and TTFT percentiles against request rate, baseline and each configuration, saturation marked."""
    rows = _ok(df)
    if rows.empty:
        return plots._without(plot, "No serving cell was measured.")
    panels = sorted(rows[CURVE].unique())
    with plots._style():
        fig, grid = _two_rows(panels)
        for col, panel in enumerate(panels):
            these = rows[rows[CURVE] == panel]
            knee = saturation_rate(these)
            for row_index, (figure, label) in enumerate((("tpot_s", "TPOT (ms)"), ("ttft_s", "TTFT (ms)"))):
                ax = grid[row_index][col]
                where = _along(ax, these)
                for _, variant, k, s, x in _configurations(these, where):
                    colour = enc.colour(variant)
                    ax.plot(x, 1000 * s[f"{figure}_p50"].to_numpy(dtype=float), color=colour,
                            marker=enc.marker(k), lw=1.6)
                    ax.plot(x, 1000 * s[f"{figure}_p90"].to_numpy(dtype=float), color=colour, ls="--", lw=1)
                    if figure == "ttft_s" and variant == "baseline":
                        ax.plot(x, 1000 * s["queue_s_p50"].to_numpy(dtype=float), color="0.55", ls=":", lw=1.2)
                ax.set_yscale("log")
                ax.set_ylabel(label)
                ax.set_title(plots._text(panel) if row_index == 0 else "")
                _mark_saturation(ax, knee, _places(these, where))
        return _with_legend(plot, fig, rows, enc)


@_figure(anchor="serving-batch", title="Serving: running batch over time",
         caption=("Requests the engine ran at each step (vLLM's scheduler statistics) over each baseline cell's "
                  "measured window, one line per offered rate; the dashed level is the time-weighted mean, the "
                  "batch size the offline axis stands for at that rate (Little's law)."))
def running_batch_over_time(plot: plots.Plot, df: pd.DataFrame, enc: plots.Encoding) -> plots.Plot:
    """The running batch over time: the baseline's cell at each rate (engine run 0), per workload."""
    base = _recorded(df, "running_batch")
    base = base[base["method"] == "baseline"]
    if base.empty:
        return plots._without(plot, "No serving baseline recorded its running batch.")
    panels = sorted(base[CURVE].unique())
    with plots._style():
        fig, axes = plots._facets(panels)
        for ax, panel in zip(axes, panels):
            these = base[base[CURVE] == panel]
            these = these.assign(_load=_load_values(these)).sort_values("_load")
            palette = plots.sns.color_palette("rocket_r", len(these))
            for colour, row in zip(palette, these.to_dict("records")):
                ax.step(list(row["running_batch_t_s"]), list(row["running_batch"]), where="pre", color=colour,
                        lw=1.2, label=_load_label(row) if _closed_loop(row) else _load_name(row))
                if row.get("running_batch_mean") is not None:
                    ax.axhline(row["running_batch_mean"], color=colour, ls="--", lw=0.8)
            ax.set_xlabel("seconds into the measured window")
            ax.set_ylabel("running requests")
            ax.legend(frameon=False, fontsize=7)
        return plots.replace(plot, image=plots._png(fig))


@_against_rate(
    anchor="serving-acceptance", title="Serving: acceptance length against request rate",
    caption=("Mean acceptance length (1 + accepted draft tokens per verification) over the measured "
             "requests alone, each counted from its own speculative counts (warm-up and requests outside "
             "the measured ones left out), per configuration. With load.ignore_eos the text past each "
             "EOS is the model's invention and its acceptance is not the workload's. Grey: past saturation."),
    column="acceptance_length", ylabel="acceptance length",
    missing="No speculative serving cell recorded its acceptance.")
def acceptance_vs_rate(ax: Any, s: pd.DataFrame, x: Any, colour: Any, marker: str) -> None:
    """Acceptance length against request rate, per configuration, from the measured requests' own counts."""
    ax.plot(x, s["acceptance_length"].to_numpy(dtype=float), color=colour, marker=marker, lw=1.6)


# --- the curves an operator reads: throughput against latency, goodput and attainment against load -------------

_SLO_COLOUR = "#b2182b"


def _slo_targets(rows: pd.DataFrame, key: str) -> list[float]:
    """The distinct ``load.slo.<key>`` targets (ms) the rows were measured under."""
    found = {float(v) for r in records(rows)
             if _known(v := ((row_config(r).get("load") or {}).get("slo") or {}).get(key))}
    return sorted(found)


def _attainment_targets(rows: pd.DataFrame) -> list[float]:
    """The distinct shares of requests within the SLOs the rows' configs ask for (``capacity.percentile`` / 100)."""
    found = {float(v) / 100.0 for r in records(rows)
             if _known(v := (row_config(r).get("capacity") or {}).get("percentile"))}
    return sorted(found)


def _slo_notes(rows: pd.DataFrame) -> list[str]:
    """Per curve, the load.slo.* targets its cells were measured under, in words."""
    notes = []
    for curve, these in rows.groupby(CURVE, sort=True):
        targets = [f"{metric} <= {t:g} ms" for key, metric in capacity.SLO_METRICS.items()
                   for t in _slo_targets(these, key)]
        if targets:
            notes.append(f"{curve}: a request meets the SLO with {' and '.join(targets)}.")
    return notes


@_figure(anchor="serving-pareto", title="Serving: throughput against latency",
         caption=("Output tokens per second over the send span against the 90th-percentile time per output token, "
                  "one line per configuration through its offered loads (each point labelled with its rate in req/s, "
                  "or its concurrency cap in a closed loop; ▲: saturated). Filled points are the configuration's Pareto front: no "
                  "other load of it served more tokens per second at a lower or equal TPOT p90; hollow points are "
                  "dominated (past saturation throughput stops rising while latency does). The wide grey line is "
                  "the front of every configuration together: for a latency budget, the most throughput any of "
                  "them gave. The dashed red line is the TPOT SLO (load.slo.tpot_ms) where one was set: a point "
                  "left of it had 90% of its requests within it."))
def throughput_vs_latency(plot: plots.Plot, df: pd.DataFrame, enc: plots.Encoding) -> plots.Plot:
    """Output throughput against TPOT p90 per configuration across its loads, the Pareto front marked."""
    known = _recorded(df, "achieved_output_tokens_per_s", "tpot_s_p90")
    if known.empty:
        return plots._without(plot, "No serving cell recorded both its output throughput and its TPOT p90.")
    panels = sorted(known[CURVE].unique())
    with plots._style():
        fig, axes = plots._facets(panels, sharey=False)
        for ax, panel in zip(axes, panels):
            these = known[known[CURVE] == panel]
            latency = 1000.0 * these["tpot_s_p90"].astype(float)
            throughput = these["achieved_output_tokens_per_s"].astype(float)
            on_front = np.array(decide.pareto_front(list(zip(latency, throughput))), dtype=bool)
            order = np.argsort(latency.to_numpy()[on_front])
            ax.plot(latency.to_numpy()[on_front][order], throughput.to_numpy()[on_front][order], color="0.5", lw=7,
                    alpha=0.25, solid_capstyle="round", zorder=1, gid="front: every configuration")
            for config, variant, k, s, _ in _configurations(these, _load_values(these)):
                x = 1000.0 * s["tpot_s_p90"].to_numpy(dtype=float)
                y = s["achieved_output_tokens_per_s"].to_numpy(dtype=float)
                own = np.array(decide.pareto_front(list(zip(x, y))), dtype=bool)
                colour, marker = enc.colour(variant), enc.marker(k)
                ax.plot(x, y, color=colour, lw=1.4, zorder=2, gid=f"line: {config}")
                ax.plot(x[own], y[own], color=colour, marker=marker, ms=7, ls="none", zorder=3,
                        gid=f"front: {config}")
                ax.plot(x[~own], y[~own], color=colour, marker=marker, mfc="white", ms=7, ls="none", zorder=3,
                        gid=f"dominated: {config}")
                # Loads that landed on one point (an engine past saturation serves each alike) share a label.
                labels: dict[tuple[float, float], list[str]] = {}
                for xi, yi, row in zip(x, y, records(s)):
                    saturated = _known(row.get("saturated")) and bool(row["saturated"])
                    labels.setdefault((xi, yi), []).append(_load_label(row) + (" ▲" if saturated else ""))
                for (xi, yi), names in labels.items():
                    ax.annotate(", ".join(names), (xi, yi), xytext=(4, 4), textcoords="offset points", fontsize=7,
                                color="0.3")
            for target in _slo_targets(these, "tpot_ms"):
                ax.axvline(target, color=_SLO_COLOUR, ls="--", lw=1.2, gid=f"slo: TPOT {target:g} ms")
            ax.set_xlabel("TPOT p90 (ms)")
            ax.set_ylabel("output tokens/s")
            ax.margins(x=0.12)  # room right of the last point for its label
            ax.set_ylim(bottom=0)
        handles = _handles(known, enc)
        handles += [
            plots.Line2D([], [], color="0.35", marker="o", ls="none", label="on its front"),
            plots.Line2D([], [], color="0.35", marker="o", mfc="white", ls="none", label="dominated"),
            plots.Line2D([], [], color="0.5", lw=7, alpha=0.25, label="front of all"),
        ]
        if _slo_targets(known, "tpot_ms"):
            handles.append(plots.Line2D([], [], color=_SLO_COLOUR, ls="--", label="TPOT SLO"))
        plots._legend(fig, handles)
        return plots.replace(plot, image=plots._png(fig), notes=_slo_notes(known))


@_figure(anchor="serving-goodput", title="Serving: goodput and SLO attainment against offered load",
         caption=("Top: goodput, the requests per second completed within every load.slo.* target, per "
                  "configuration; the dotted grey diagonal is the offered rate, which goodput meets when every "
                  "request meets the SLO. Bottom: the share of measured requests within the SLO, with its Wilson "
                  "95% band; the dashed red line is the share the capacity search asks for (capacity.percentile). "
                  "A load whose band lies wholly above the line meets the SLO; one whose band straddles it is not "
                  "resolved. A closed-loop curve is drawn against its concurrency cap. Grey: past saturation."))
def goodput_vs_rate(plot: plots.Plot, df: pd.DataFrame, enc: plots.Encoding) -> plots.Plot:
    """Goodput and SLO attainment (with its Wilson interval) against offered load, the attainment target drawn."""
    rows = _ok(df)
    known = _recorded(rows, "slo_attainment")
    if known.empty:
        return plots._without(plot, "No serving cell was measured against an SLO (load.slo.*): no goodput or "
                                    "attainment to draw.")
    panels = sorted(known[CURVE].unique())
    targets = _attainment_targets(known)
    notes = _slo_notes(known)
    if not targets:
        notes.append("No attainment target is drawn: the cells' configs record no capacity.percentile.")
    with plots._style():
        fig, grid = _two_rows(panels)
        for col, panel in enumerate(panels):
            these = known[known[CURVE] == panel]
            knee = saturation_rate(rows[rows[CURVE] == panel])
            top, bottom = grid[0][col], grid[1][col]
            x = _along(top, these)
            _along(bottom, these)
            for config, variant, k, s, xs in _configurations(these, x):
                colour, marker = enc.colour(variant), enc.marker(k)
                top.plot(xs, s["goodput"].to_numpy(dtype=float, na_value=np.nan), color=colour, marker=marker,
                         lw=1.6, gid=f"goodput: {config}")
                share = s["slo_attainment"].to_numpy(dtype=float)
                low = s["slo_attainment_ci_low"].to_numpy(dtype=float, na_value=np.nan)
                high = s["slo_attainment_ci_high"].to_numpy(dtype=float, na_value=np.nan)
                bottom.fill_between(xs, low, high, color=colour, alpha=0.18, lw=0, gid=f"band: {config}")
                bottom.plot(xs, share, color=colour, marker=marker, lw=1.6, gid=f"attainment: {config}")
            finite = sorted({float(r) for r in these["load_request_rate"] if math.isfinite(float(r))})
            if finite and not _closed_curve(these):
                top.plot(finite, finite, color="0.55", ls=":", lw=1.2, gid="offered")
            for target in targets:
                bottom.axhline(target, color=_SLO_COLOUR, ls="--", lw=1.2, gid=f"target: {target:g}")
            top.set_ylim(bottom=0)
            top.set_ylabel("goodput (req/s)")
            top.set_xlabel("")
            top.set_title(plots._text(panel))
            bottom.set_ylim(0, 1.03)
            bottom.yaxis.set_major_formatter(PercentFormatter(1.0))
            bottom.set_ylabel("requests within the SLO")
            if not _closed_curve(these):
                for ax in (top, bottom):
                    _mark_saturation(ax, knee, _places(these, x))
        handles = _handles(known, enc)
        handles.append(plots.Line2D([], [], color="0.55", ls=":", label="offered rate"))
        handles += [plots.Line2D([], [], color=_SLO_COLOUR, ls="--", label=f"target {t:.0%}") for t in targets]
        plots._legend(fig, handles)
        return plots.replace(plot, image=plots._png(fig), notes=notes)


FIGURES = (speedup_vs_rate, latency_vs_rate, throughput_vs_latency, goodput_vs_rate, acceptance_vs_rate,
           running_batch_over_time)
