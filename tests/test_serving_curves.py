"""The curves an operator reads on the serving section: throughput against latency with its Pareto front,
goodput and SLO attainment (with Wilson's band and the attainment target) against offered load, and a
closed-loop sweep over ``load.max_concurrency`` drawn as one curve against the cap."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from specbench.analytic import verdicts
from specbench.report import plots, serving, tables

# (offered rate, TPOT p90 in ms, output tokens/s): the baseline's throughput falls at 8 req/s while its
# latency rises; ngram is faster and serves more at every load, so it alone makes the front of all.
BASELINE = ((1.0, 20.0, 100.0), (2.0, 25.0, 190.0), (4.0, 40.0, 300.0), (8.0, 90.0, 280.0))
NGRAM = ((1.0, 12.0, 110.0), (2.0, 15.0, 200.0), (4.0, 30.0, 320.0), (8.0, 60.0, 330.0))


def _row(method: str, rate: float, tpot_p90_ms: float, tokens_per_s: float, *, cap: int | None = None,
         attainment: tuple[float, float, float] = (0.9, 0.82, 0.95), slo_ms: float | None = 50.0,
         percentile: float = 90.0) -> dict[str, Any]:
    """A measured serving row at ``rate`` (under a cap of ``cap``), measured against load.slo.tpot_ms=slo_ms."""
    from rows import make_row

    row = make_row(method, 4)
    tag = f"-rate{rate:g}" + (f"-c{cap}" if cap is not None else "")
    config = json.loads(row["config_json"]) | {
        "load": {"request_rate": rate, "max_concurrency": cap, "burstiness": 1.0,
                 "slo": {"tpot_ms": slo_ms, "ttft_ms": None, "e2e_ms": None}},
        "capacity": {"percentile": percentile}}
    share, low, high = attainment if slo_ms is not None else (None, None, None)
    achieved = (cap or 1) * 0.5 if math.isinf(rate) else rate * 0.95
    return row | {
        "cell_id": row["cell_id"].replace("-r0", f"{tag}-r0"),
        "baseline_cell_id": None if method == "baseline" else row["baseline_cell_id"].replace("-r0", f"{tag}-r0"),
        "load_request_rate": rate, "load_burstiness": 1.0, "load_max_concurrency": cap, "served_requests": 100,
        "achieved_request_rate": achieved, "offered_rate_realised": achieved if math.isinf(rate) else rate,
        "saturated": False, "saturation_reason": None,
        "tpot_s_p90": tpot_p90_ms / 1000.0, "achieved_output_tokens_per_s": tokens_per_s,
        "slo_attainment": share, "slo_attainment_ci_low": low, "slo_attainment_ci_high": high,
        "goodput": None if share is None else achieved * share,
        "exactness": None if method == "baseline" else "exact",
        "config_json": json.dumps(config),
    }


def _served(tmp_path, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The serving part of the results frame, as the page reads it."""
    from rows import write_results

    frame, _ = tables.load_frame(write_results(tmp_path, rows))
    return serving.split(frame)[1]


def _drawn(monkeypatch, figure, served: pd.DataFrame) -> tuple[plots.Plot, list[Any]]:
    """The plot and the matplotlib figure behind its image."""
    figures: list[Any] = []

    def keep(fig: Any) -> str:
        figures.append(fig)
        return "data:image/png;base64,"

    monkeypatch.setattr(plots, "_png", keep)
    plot = figure(served, plots.Encoding.for_frame(served))
    return plot, figures


def _artists(fig: Any, gid: str) -> list[Any]:
    return [a for ax in fig.axes for a in (*ax.lines, *ax.collections) if a.get_gid() == gid]


def _line(fig: Any, gid: str) -> tuple[list[float], list[float]]:
    (line,) = _artists(fig, gid)
    return [float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()]


def _grid_rows(**kwargs: Any) -> list[dict[str, Any]]:
    return [_row("baseline", rate, tpot, tokens, **kwargs) for rate, tpot, tokens in BASELINE] + [
        _row("ngram", rate, tpot, tokens, **kwargs) for rate, tpot, tokens in NGRAM]


# --- the Pareto front -----------------------------------------------------------------------------


def test_the_pareto_front_is_exactly_the_points_no_other_beats_on_both_latency_and_throughput():
    points = [(10.0, 100.0), (20.0, 180.0), (30.0, 170.0), (40.0, 250.0), (50.0, 250.0), (None, 300.0),
              (40.0, 250.0), (float("nan"), 1.0), (5.0, float("inf"))]
    # (30, 170) loses to (20, 180); (50, 250) to (40, 250), which is there twice (equal points both stay);
    # a point missing a figure, or with one not finite, is on no front and beats nothing.
    assert verdicts.pareto_front(points) == [True, True, False, True, False, False, True, False, False]
    rng = np.random.default_rng(0)
    for _ in range(50):
        cloud = [(float(a), float(b)) for a, b in rng.uniform(1, 100, size=(12, 2))]
        front = sorted(p for p, on in zip(cloud, verdicts.pareto_front(cloud)) if on)
        # Along the front, more latency buys strictly more throughput; every point off it has a point on it
        # at least as good on both.
        assert all(b[1] > a[1] for a, b in zip(front, front[1:]))
        for p, on in zip(cloud, verdicts.pareto_front(cloud)):
            assert on or any(q[0] <= p[0] and q[1] >= p[1] for q in front)


def test_throughput_against_latency_marks_each_configurations_front_and_the_front_of_all(tmp_path, monkeypatch):
    rows = _grid_rows()
    rows[3] |= {"saturated": True, "saturation_reason": "completions behind"}  # the baseline at 8 req/s
    # ngram's 8 req/s served what its 4 did at the same TPOT: one point, one label naming both loads.
    rows[-1] |= {"tpot_s_p90": rows[-2]["tpot_s_p90"], "achieved_output_tokens_per_s": 320.0}
    served = _served(tmp_path, rows)
    plot, (fig,) = _drawn(monkeypatch, serving.throughput_vs_latency, served)
    assert plot.image and plot.missing is None
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert sorted(labels) == ["1", "1", "2", "2", "4", "4, 8", "8 ▲"]
    served = _served(tmp_path, _grid_rows())
    plot, (fig,) = _drawn(monkeypatch, serving.throughput_vs_latency, served)
    base, ngram = "baseline", "ngram K=4"
    assert set(served[tables.CONFIG]) == {base, ngram}
    # The baseline's 8 req/s served fewer tokens at a higher TPOT than its 4 req/s: dominated, drawn hollow.
    assert _line(fig, f"front: {base}") == ([20.0, 25.0, 40.0], [100.0, 190.0, 300.0])
    assert _line(fig, f"dominated: {base}") == ([90.0], [280.0])
    assert _line(fig, f"front: {ngram}") == ([12.0, 15.0, 30.0, 60.0], [110.0, 200.0, 320.0, 330.0])
    assert _line(fig, f"dominated: {ngram}") == ([], [])
    # Each configuration's line runs through its loads in order of rate.
    assert _line(fig, f"line: {base}")[0] == [20.0, 25.0, 40.0, 90.0]
    # ngram beats the baseline at every load: the front of both is ngram's alone.
    assert _line(fig, "front: every configuration") == ([12.0, 15.0, 30.0, 60.0], [110.0, 200.0, 320.0, 330.0])
    # The TPOT SLO the cells were measured under, where it was set.
    assert _line(fig, "slo: TPOT 50 ms")[0] == [50.0, 50.0]
    assert plot.notes == ["summarize: a request meets the SLO with TPOT <= 50 ms."]
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert sorted(labels) == sorted(["1", "2", "4", "8"] * 2)  # each point names its rate


# --- goodput and attainment ------------------------------------------------------------------------


@pytest.mark.parametrize("percentile", [90.0, 95.0])
def test_attainment_is_drawn_with_its_wilson_band_and_the_configured_target(tmp_path, monkeypatch, percentile):
    shares = {1.0: (0.98, 0.93, 0.99), 2.0: (0.94, 0.88, 0.97), 4.0: (0.7, 0.6, 0.78), 8.0: (0.2, 0.13, 0.29)}
    rows = [_row(method, rate, tpot, tokens, attainment=shares[rate], percentile=percentile)
            for method, points in (("baseline", BASELINE), ("ngram", NGRAM)) for rate, tpot, tokens in points]
    served = _served(tmp_path, rows)
    plot, (fig,) = _drawn(monkeypatch, serving.goodput_vs_rate, served)
    assert plot.image and plot.missing is None
    target = percentile / 100.0
    assert _line(fig, f"target: {target:g}")[1] == [target, target]
    for config in ("baseline", "ngram K=4"):
        rates, share = _line(fig, f"attainment: {config}")
        assert rates == [1.0, 2.0, 4.0, 8.0] and share == [shares[r][0] for r in rates]
        (band,) = _artists(fig, f"band: {config}")
        vertices = band.get_paths()[0].vertices
        for rate in rates:
            at = {round(float(y), 9) for x, y in vertices if math.isclose(x, rate)}
            assert at == {shares[rate][1], shares[rate][2]}, (rate, at)  # the row's own interval, both ends
        own = served[served[tables.CONFIG] == config].sort_values("load_request_rate")
        assert _line(fig, f"goodput: {config}")[1] == pytest.approx(list(own["goodput"]))
    assert _line(fig, "offered") == ([1.0, 2.0, 4.0, 8.0], [1.0, 2.0, 4.0, 8.0])


def test_without_an_slo_the_goodput_figure_says_so_and_the_pareto_figure_still_draws(tmp_path, monkeypatch):
    served = _served(tmp_path, _grid_rows(slo_ms=None))
    plot, figures = _drawn(monkeypatch, serving.goodput_vs_rate, served)
    assert plot.image is None and figures == []
    assert plot.missing and "load.slo" in plot.missing
    plot, (fig,) = _drawn(monkeypatch, serving.throughput_vs_latency, served)
    assert plot.image and _artists(fig, "slo: TPOT 50 ms") == [] and plot.notes == []


def test_the_page_carries_both_curves_and_a_figure_that_fails_costs_only_itself(tmp_path, monkeypatch):
    from rows import write_results

    from specbench.report import write_report

    write_results(tmp_path, _grid_rows())
    page = write_report(tmp_path).read_text()
    for anchor in ("img-serving-pareto", "img-serving-goodput", "img-serving-latency", "img-serving-acceptance"):
        assert anchor in page

    def broken(df: pd.DataFrame, enc: plots.Encoding) -> plots.Plot:
        """Serving: a figure that breaks."""
        raise RuntimeError("no such column")

    monkeypatch.setattr(serving, "FIGURES", (broken, *serving.FIGURES))
    page = write_report(tmp_path).read_text()
    assert "This figure could not be drawn: RuntimeError: no such column" in page
    assert "img-serving-pareto" in page and "img-serving-goodput" in page



def test_a_serving_figure_that_fails_keeps_its_declared_section(tmp_path, monkeypatch):
    # Each serving figure declares its anchor, title and caption once (serving._figure); where drawing fails the
    # page keeps them, so that the section and links to it stay where a reader expects them.
    from specbench.report.page import _draw

    def fails(*args: object) -> plots.Plot:
        raise RuntimeError("no such column")

    monkeypatch.setattr(serving, "_per_configuration_against_rate", fails)
    served = _served(tmp_path, _grid_rows())
    plot = _draw(serving.speedup_vs_rate, served, plots.Encoding.for_frame(served))
    assert (plot.anchor, plot.title) == ("serving-speedup", "Serving: speedup against request rate")
    assert plot.caption.startswith("Speedup at the same offered load") and plot.image is None
    assert plot.missing == "This figure could not be drawn: RuntimeError: no such column"
    assert len({figure.plot.anchor for figure in serving.FIGURES}) == len(serving.FIGURES)

# --- a concurrency axis ----------------------------------------------------------------------------


def test_a_closed_loop_sweep_over_concurrency_is_one_curve_against_the_cap(tmp_path, monkeypatch):
    caps = (1, 4, 16, 64)
    rows = [_row(method, math.inf, tpot * (1 + cap / 8), 50.0 * cap ** 0.5, cap=cap)
            for method, tpot in (("baseline", 20.0), ("ngram", 12.0)) for cap in caps]
    # An open-loop rate beside them stays a curve of its own, against its rate.
    rows += [_row("baseline", 2.0, 25.0, 190.0), _row("ngram", 2.0, 15.0, 200.0)]
    served = _served(tmp_path, rows)
    assert sorted(set(served[serving.CURVE])) == ["summarize", "summarize · closed loop"]
    # Tables and verdicts still walk each cap as the shape it is.
    assert "summarize · closed loop c16" in set(served[tables.PANEL])
    plot, (fig,) = _drawn(monkeypatch, serving.goodput_vs_rate, served)
    closed = [ax for ax in fig.axes if ax.get_xlabel() == "max concurrency (closed loop)"]
    assert len(closed) == 1  # the attainment axis of the closed-loop curve (goodput's sits above it, unlabelled)
    caps_drawn = [line.get_xdata().tolist() for line in closed[0].lines if line.get_gid() == "attainment: baseline"]
    assert caps_drawn == [[1.0, 4.0, 16.0, 64.0]]
    plot, (fig,) = _drawn(monkeypatch, serving.throughput_vs_latency, served)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["summarize", "summarize · closed loop"]
    loop = fig.axes[1]
    assert sorted(t.get_text() for t in loop.texts) == sorted([f"c{c}" for c in caps] * 2)
    # Along the caps, in order: throughput and TPOT both rise, so every cap is on its configuration's front.
    assert _artists(fig, "dominated: baseline")[1].get_xdata().tolist() == []
    assert [round(v, 6) for v in _artists(fig, "line: baseline")[1].get_xdata()] == \
        [round(20.0 * (1 + c / 8), 6) for c in caps]


def test_the_rate_figures_draw_a_closed_loop_sweep_against_its_cap(tmp_path, monkeypatch):
    caps = (1, 4, 16, 64)
    speedups = dict(zip(caps, (1.6, 1.4, 1.1, 0.9)))
    rows = []
    for cap in caps:
        spec = _row("ngram", math.inf, 12.0, 100.0, cap=cap)
        spec |= {f"serving_speedup_{n}": speedups[cap] for n in ("tpot_p50", "e2e_p50", "e2e_p90")}
        spec |= {"serving_speedup_e2e_p50_ci_low": speedups[cap] * 0.95,
                 "serving_speedup_e2e_p50_ci_high": speedups[cap] * 1.05,
                 "running_batch_t_s": [0.0, 1.0], "running_batch": [cap, cap]}
        rows += [_row("baseline", math.inf, 20.0, 90.0, cap=cap) | {"running_batch_t_s": [0.0, 1.0],
                                                                    "running_batch": [cap, cap]}, spec]
    served = _served(tmp_path, rows)
    for figure in (serving.speedup_vs_rate, serving.latency_vs_rate, serving.acceptance_vs_rate,
                   serving.goodput_vs_rate):
        plot, (fig,) = _drawn(monkeypatch, figure, served)
        assert {ax.get_title() for ax in fig.axes} - {""} == {"summarize · closed loop"}, figure.__name__
        labelled = [ax for ax in fig.axes if ax.get_xlabel() == "max concurrency (closed loop)"]
        assert labelled and all([t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16", "64"]
                                for ax in labelled), figure.__name__
    plot, (fig,) = _drawn(monkeypatch, serving.speedup_vs_rate, served)
    drawn = [(np.asarray(line.get_xdata(), dtype=float).tolist(), np.asarray(line.get_ydata(), dtype=float).tolist())
             for line in fig.axes[0].lines]
    assert ([1.0, 4.0, 16.0, 64.0], [speedups[c] for c in caps]) in drawn
    plot, (fig,) = _drawn(monkeypatch, serving.running_batch_over_time, served)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [f"c{c}" for c in caps]


# --- a ramp-up ---------------------------------------------------------------------------------------


def _ramped(row: dict[str, Any], start: float, end: float, *, in_config: bool = True) -> dict[str, Any]:
    """``row`` (rate inf) as a cell whose requests climbed from ``start`` to ``end`` req/s (load.ramp_up_*):
    its id's part, and its config's keys unless ``in_config`` is false (a row that kept only its id)."""
    part = f"-ramplinear{start:g}to{end:g}"
    config = json.loads(row["config_json"])
    if in_config:
        config["load"] |= {"ramp_up_strategy": "linear", "ramp_up_start_rps": start, "ramp_up_end_rps": end}
    return row | {"cell_id": row["cell_id"].replace("-rateinf", f"-rateinf{part}"),
                  "baseline_cell_id": row["baseline_cell_id"] and row["baseline_cell_id"].replace(
                      "-rateinf", f"-rateinf{part}"),
                  "config_json": json.dumps(config)}


def _compared(rows: list[dict[str, Any]], speedup: float = 1.2) -> list[dict[str, Any]]:
    """``rows`` with each speculative cell compared with its baseline, paying ``speedup`` on every figure."""
    from specbench.results.serving import pays

    for row in rows:
        if row["method"] != "baseline":
            row |= {f"serving_speedup_{n}": speedup for n in ("tpot_p50", "e2e_p50", "e2e_p90")}
            row |= {"serving_speedup_e2e_p50_ci_low": speedup * 0.9, "serving_speedup_e2e_p50_ci_high": speedup * 1.1}
            row["serving_pays"] = pays(row)
    return rows


def test_a_ramp_up_cell_is_told_apart_from_an_all_at_once_cell_on_every_figure_and_table_row(
        tmp_path, monkeypatch):
    from rows import write_results

    from specbench.report import write_report

    # Both are served at rate inf without a cap: the ramp (its config, or only its id) is what sets it apart.
    rows = _grid_rows()
    rows += [_row("baseline", math.inf, 95.0, 260.0), _row("ngram", math.inf, 70.0, 300.0)]
    rows += [_ramped(_row("baseline", math.inf, 50.0, 240.0), 1.0, 8.0),
             _ramped(_row("ngram", math.inf, 35.0, 290.0), 1.0, 8.0)]
    rows += [_ramped(_row(method, math.inf, 40.0, 200.0), 0.5, 4.0, in_config=False)
             for method in ("baseline", "ngram")]
    served = _served(tmp_path, _compared(rows))
    ramp, slower = "summarize · ramp linear 1→8 req/s", "summarize · ramp linear 0.5→4 req/s"
    assert sorted(set(served[serving.CURVE])) == sorted(set(served[tables.PANEL])) == sorted(
        ["summarize", ramp, slower])

    # The table's load column names the ramp; the all-at-once cell keeps its words.
    table = serving.table(served)
    assert {(r.panel, r.rate) for r in table if r.config == "ngram K=4" and r.rate.startswith(("ramp", "all"))} == {
        ("summarize", "all at once"), (ramp, "ramp linear 1→8 req/s"), (slower, "ramp linear 0.5→4 req/s")}
    # Each ramp is judged at its own point, not walked from the Poisson cells' lowest rate.
    lines = serving.verdicts(served)
    assert f"{ramp}, ngram K=4: pays (E2E p50 speedup: ramp linear 1→8 req/s 1.20×)" in lines, lines
    assert [r.pays for r in table if r.panel == ramp and r.config == "ngram K=4"] == ["pays"]

    # The figures draw the ramp in a panel of its own, its point and its tick named by the ramp.
    plot, (fig,) = _drawn(monkeypatch, serving.throughput_vs_latency, served)
    by_title = {ax.get_title(): ax for ax in fig.axes}
    assert set(by_title) == {"summarize", ramp, slower}
    assert sorted(t.get_text() for t in by_title[ramp].texts) == ["ramp 1→8", "ramp 1→8"]
    assert "all" in [t.get_text() for t in by_title["summarize"].texts]
    plot, (fig,) = _drawn(monkeypatch, serving.goodput_vs_rate, served)
    ticks = {ax.get_title(): [t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes[:3]}
    assert ticks == {"summarize": ["1", "2", "4", "8", "all"], ramp: ["ramp 1→8"], slower: ["ramp 0.5→4"]}
    write_results(tmp_path, rows)
    page = write_report(tmp_path).read_text()
    assert "<td>ramp linear 1→8 req/s</td>" in page and "<td>all at once</td>" in page


def test_a_ramp_up_beside_poisson_rates_adds_no_rate_to_their_walk(tmp_path):
    # The ramp's rate is inf; the Poisson cells of the same shape were planned at 1-8 req/s only.
    rows = _grid_rows() + [_ramped(_row(method, math.inf, 40.0, 200.0), 1.0, 8.0) for method in ("baseline", "ngram")]
    served = _served(tmp_path, _compared(rows))
    lines = serving.verdicts(served)
    assert "summarize, ngram K=4: pays up to 8 req/s (E2E p50 speedup: 1 req/s 1.20×, 2 req/s 1.20×, "\
        "4 req/s 1.20×, 8 req/s 1.20×)" in lines, lines
