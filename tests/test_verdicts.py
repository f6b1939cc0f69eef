"""Verdicts walk the grid as planned: they stop at the first point not judged, name it, and claim nothing past it.

The grid: ngram K=2 and K=4 on summarize at batch sizes 1, 4, 8 and 16, every
cell paying, but batch 8's cells failed, or flagged (a shifted baseline flags
the baseline and every cell measured against it), or planned and never
measured. The page's verdict, the terminal's, the best-configuration table,
break-even and the K schedule must all stop at batch 8.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from rows import make_row, write_results

from specbench.analytic import recommend
from specbench.report import verdict_lines
from specbench.stats import distributions

BATCHES = (1, 4, 8, 16)
# K=4 is the fastest up to batch 8; at 16 its interval includes 1x and K=2 pays: {1: 4, 4: 4, 8: 4, 16: 2}.
SPEEDUPS = {2: {1: 1.5, 4: 1.4, 8: 1.3, 16: 1.2}, 4: {1: 1.8, 4: 1.5, 8: 1.4, 16: 1.1}}
SHIFT = "baseline engine run 1 went off alone (shifted baseline)"


def grid(batch8: str) -> list[dict[str, Any]]:
    """The sweep's rows with batch 8's cells ``"failed"``, ``"flagged"``, ``"missing"`` (never measured) or ``"ok"``."""
    rows = [make_row("baseline", batch=b) for b in BATCHES]
    for k, by_batch in SPEEDUPS.items():
        for batch, speedup in by_batch.items():
            row = make_row("ngram", k, batch, speedup=speedup)
            if batch == 16 and k == 4:
                row |= {"speedup_ci_low": 0.95, "speedup_ci_high": 1.25}
            if batch == 8 and batch8 == "failed":
                row |= {"status": "failed", "error": "engine died at batch 8 (on purpose)\ntraceback", "speedup": None,
                        "speedup_ci_low": None, "speedup_ci_high": None, "decode_speedup": None}
            if batch == 8 and batch8 == "flagged":
                row |= {"flagged": True, "flag_reasons": [SHIFT]}
            if not (batch == 8 and batch8 == "missing"):
                rows.append(row)
    if batch8 == "flagged":
        rows[2] |= {"flagged": True, "flag_reasons": [SHIFT]}
    if batch8 == "missing":
        rows = [r for r in rows if r["batch_size"] != 8]
    return rows


def _plan(directory: Path, cell_ids: list[str]) -> None:
    (directory / "plan.json").write_text(json.dumps([{"cell_id": c, "overrides": []} for c in cell_ids]))


def _cell_id(method: str, k: int, batch: int) -> str:
    """A cell id of the form the sweep writes (specbench.config.Cell.cell_id)."""
    return f"{method}-k{k}-b{batch}-summarize-{batch:012x}-r0"


@pytest.mark.parametrize("batch8, why", [
    ("failed", "failed: engine died at batch 8 (on purpose)"),
    ("flagged", f"flagged: {SHIFT}"),
])
def test_the_verdict_stops_at_the_first_batch_size_not_judged_and_names_it(tmp_path, batch8, why):
    write_results(tmp_path, grid(batch8))
    verdict = verdict_lines(tmp_path)[0]
    # Before, failed: "pays up to batch 4 (...), not at batch 16 (1.10×, ...); choosing the configuration per
    # batch size, speculation pays up to batch 16": batch 8 skipped, 16 judged and claimed past the gap;
    # flagged: "...; batch 8 not judged (flagged: ...); choosing the configuration per batch size, speculation
    # pays up to batch 16".
    assert verdict.startswith(
        f"verdict: summarize: ngram K=4 pays up to batch 4 (1.80×, CI [1.62, 1.98] at batch 1); "
        f"batch 8 not judged ({why}), 16 not claimed")
    assert "16 (" not in verdict and "up to batch 16" not in verdict and "every measured" not in verdict


def test_a_failed_cell_is_not_skipped_by_a_curve_that_pays_everywhere_else(tmp_path):
    rows = [r for r in grid("failed") if r["num_speculative_tokens"] != 2]
    for row in rows:
        if row["batch_size"] == 16 and row["method"] == "ngram":
            row |= {"speedup": 1.25, "speedup_ci_low": 1.1, "speedup_ci_high": 1.4}
    write_results(tmp_path, rows)
    # Before: "ngram K=4 pays at every measured batch size, up to 16 (1.80×, CI [1.62, 1.98] at batch 1)".
    assert verdict_lines(tmp_path)[0] == (
        "verdict: summarize: ngram K=4 pays up to batch 4 (1.80×, CI [1.62, 1.98] at batch 1); "
        "batch 8 not judged (failed: engine died at batch 8 (on purpose)), 16 not claimed")
    (rec,) = recommend.recommend(rows)
    assert rec.schedule == [(1, 7, 4), (8, 8, 0)]  # before: [(1, 16, 4)]


@pytest.mark.parametrize("batch8", ["failed", "flagged"])
def test_a_k_schedule_never_spans_a_batch_size_not_judged(tmp_path, batch8):
    rows = grid(batch8)
    (rec,) = recommend.recommend(rows)
    # Before: {1: 4, 4: 4, 16: 2} -> [(1, 15, 4), (16, 16, 2)], K=4 run at batch 8 with no evidence there.
    assert {b: k for b, (k, _) in rec.best.items()} == {1: 4, 4: 4}
    assert rec.schedule == [(1, 7, 4), (8, 8, 0)]  # vLLM carries the last K on: plain decoding from batch 8
    text = recommend.format_recommendation(rec)
    assert "batch 8 not judged (" in text and "16 not claimed: K=0 from batch 8 on (no evidence there)" in text
    write_results(tmp_path, rows)
    from specbench.report import render_report

    page = render_report(tmp_path / "results.parquet")
    assert "[8, 8, 0]" in page and "16 not claimed: K=0 from batch 8 on" in page
    assert "<td>not judged (" in page  # the best-configuration table's row at batch 8 says why


def test_with_every_cell_judged_the_walk_runs_the_whole_grid(tmp_path):
    write_results(tmp_path, grid("ok"))
    assert verdict_lines(tmp_path)[0].startswith(
        "verdict: summarize: ngram K=4 pays up to batch 8 (1.80×, CI [1.62, 1.98] at batch 1), not at batch 16 "
        "(1.10×, CI [0.95, 1.25]); choosing the configuration per batch size, speculation pays up to batch 16")
    (rec,) = recommend.recommend(grid("ok"))
    assert rec.schedule == [(1, 15, 4), (16, 16, 2)] and rec.stop is None


def test_a_planned_cell_never_measured_is_a_gap_only_the_plan_shows(tmp_path):
    rows = grid("missing")
    write_results(tmp_path, rows)
    # Without plan.json the rows imply batch sizes 1, 4 and 16: nothing says 8 was meant to be measured.
    assert "batch 8" not in verdict_lines(tmp_path)[0]
    _plan(tmp_path, [r["cell_id"] for r in rows] + [_cell_id(m, k, 8) for m, k in (("baseline", 0), ("ngram", 2),
                                                                                    ("ngram", 4))])
    assert verdict_lines(tmp_path)[0].startswith(
        "verdict: summarize: ngram K=4 pays up to batch 4 (1.80×, CI [1.62, 1.98] at batch 1); "
        "batch 8 not judged (planned, never measured), 16 not claimed")
    # The CLI reads the plan beside the results as the page does.
    assert recommend.main([str(tmp_path)]) == 0


def test_the_cli_schedule_stops_where_the_plan_has_a_gap(tmp_path, capsys):
    rows = grid("missing")
    write_results(tmp_path, rows)
    _plan(tmp_path, [r["cell_id"] for r in rows] + [_cell_id("ngram", 4, 8)])
    assert recommend.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "schedule (start, end, K): [(1, 7, 4), (8, 8, 0)]" in out
    assert "batch 8 not judged (planned, never measured), 16 not claimed" in out


def test_best_configuration_and_break_even_name_the_gap(tmp_path):
    from specbench.analytic import verdicts

    rows = grid("failed")
    planned = verdicts.Grid.of(rows)
    best = verdicts.best_configs(rows, planned)
    assert [(b.batch, b.top and b.top["num_speculative_tokens"]) for b in best] == [(1, 4), (4, 4), (8, None), (16, 2)]
    assert best[2].why == "failed: engine died at batch 8 (on purpose)"
    curves = {c.rows[0]["num_speculative_tokens"]: c for c in verdicts.break_evens(rows, planned)}
    # K=2 stays above 1x through batch 4; its 1.2x at 16 lies past the gap and joins nothing.
    assert curves[2].batch_sizes == [1, 4] and curves[2].measured is None
    assert curves[2].stop is not None and curves[2].stop.at == 8 and curves[2].stop.unclaimed == (16,)


def test_cell_ids_name_the_planned_cell():
    from specbench.analytic.verdicts import cell_name

    offline = cell_name("draft_model-k4-b16-my-data-28abaf57d9bd-r1")
    assert (offline.method, offline.k, offline.batch, offline.workload, offline.rate) == (
        "draft_model", 4, 16, "my-data", None)
    sampled = cell_name("ngram-k2-b8-creative-t0.7-0123456789ab-r0")
    assert (sampled.workload, sampled.temperature) == ("creative", 0.7)
    served = cell_name("baseline-k0-b1-summarize-rate2.5-c4-0123456789ab-r0")
    assert (served.workload, served.rate, served.config_hash) == ("summarize", 2.5, "0123456789ab")
    assert cell_name("rateinf-k0-b1-x-rateinf-0123456789ab-r0").rate == float("inf")
    assert cell_name("not-a-cell") is None
    # Request shapes (specbench.load.shape_id_part) follow the load's part and are no part of the workload's name.
    for shaped in ("ngram-k4-b1-summarize-rateinf-ramplinear1to8-0123456789ab-r0",
                   "ngram-k4-b1-summarize-rate2-in256-out64-rr0.5-0123456789ab-r0",
                   "ngram-k4-b1-summarize-rate2-c4-server-outdataset-0123456789ab-r0"):
        name = cell_name(shaped)
        assert name is not None and name.workload == "summarize" and name.rate is not None, shaped


# --- serving ------------------------------------------------------------------------------------------


def _served(method: str, rate: float, *, speedup: float = 1.5, achieved: float | None = None,
            **overrides: Any) -> dict[str, Any]:
    from specbench.results.serving import pays

    baseline = method == "baseline"
    row = make_row(method, 4, speedup=1.0)
    digest = f"{int(rate * 10):012x}"  # the ids the sweep writes: the rate, then the config's digest
    row |= {"cell_id": f"{method}-k{0 if baseline else 4}-b1-summarize-rate{rate:g}-{digest}-r0",
            "baseline_cell_id": None if baseline else f"baseline-k0-b1-summarize-rate{rate:g}-{digest}-r0",
            "load_request_rate": rate, "served_requests": 8,
            "achieved_request_rate": achieved if achieved is not None else rate * 0.95}
    if not baseline:
        row |= {"serving_speedup_e2e_p50": speedup, "serving_speedup_e2e_p50_ci_low": speedup * 0.9,
                "serving_speedup_e2e_p50_ci_high": speedup * 1.1}
        row["serving_pays"] = pays(row)
    return row | overrides


def _serving_grid(**at_rate: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for rate in (0.5, 1.0, 2.0, 4.0):
        changes = at_rate.get(f"r{rate:g}".replace(".", "_"), {})
        rows += [_served("baseline", rate, achieved=changes.pop("achieved", None)),
                 _served("ngram", rate, **changes)]
    return rows


@pytest.mark.parametrize("changes, why", [
    ({"r1": {"flagged": True, "flag_reasons": ["engine runs disagree: 1.90x, 0.80x"]}},
     "flagged: engine runs disagree: 1.90x, 0.80x"),
    ({"r1": {"status": "failed", "error": "engine died", "serving_speedup_e2e_p50": None, "serving_pays": None}},
     "failed: engine died"),
    ({"r1": {"achieved": 0.5}}, "saturated: the baseline achieved 0.5 req/s"),
])
def test_the_highest_paying_rate_stops_at_the_first_rate_not_judged(tmp_path, changes, why):
    from specbench.analytic import verdicts

    rows = _serving_grid(**changes)
    spec = [r for r in rows if r["method"] == "ngram"]
    decided = verdicts.serving_verdict(spec, rows)
    # Before: flagged and failed rates were dropped and 4 req/s named; a saturated rate was judged as any other.
    assert decided.highest == 0.5 and verdicts.highest_paying_rate(spec, rows) == 0.5
    assert decided.stop is not None and decided.stop.text("req/s") == f"1 req/s not judged ({why}), 2, 4 req/s not claimed"
    write_results(tmp_path, rows)
    line = next(line for line in verdict_lines(tmp_path) if line.startswith("verdict under load: "))
    assert f"ngram K=4: pays up to 0.5 req/s (E2E p50 speedup: " in line
    assert line.endswith(f"; 1 req/s not judged ({why}), 2, 4 req/s not claimed") or "left out" in line


def test_a_failed_serving_cell_without_its_load_columns_is_still_a_serving_cell(tmp_path):
    # A cell that failed before it met its load has no load columns: its id names the rate.
    rows = _serving_grid()
    failed = next(r for r in rows if r["method"] == "ngram" and r["load_request_rate"] == 2.0)
    for column in ("load_request_rate", "achieved_request_rate", "serving_speedup_e2e_p50",
                   "serving_speedup_e2e_p50_ci_low", "serving_speedup_e2e_p50_ci_high", "serving_pays"):
        failed[column] = None
    failed |= {"status": "failed", "error": "out of memory", "speedup": None}
    write_results(tmp_path, rows)
    lines = verdict_lines(tmp_path)
    assert not any(line.startswith("verdict: ") for line in lines)  # not an offline cell at batch 1
    assert any(line.endswith("pays up to 1 req/s (E2E p50 speedup: 0.5 req/s 1.50×, 1 req/s 1.50×, 4 req/s 1.50×); "
                             "2 req/s not judged (failed: out of memory), 4 req/s not claimed") for line in lines)


def test_the_serving_table_decides_each_rate_as_the_verdict_line_does(tmp_path):
    from specbench.report import serving, tables

    # 1 req/s: the baseline fell behind, so the verdict line stops there; the cell's own interval clears 1x.
    rows = _serving_grid(r1={"achieved": 0.5})
    assert next(r for r in rows if r["method"] == "ngram" and r["load_request_rate"] == 1.0)["serving_pays"]
    write_results(tmp_path, rows)
    df, _ = tables.load_frame(tmp_path / "results.parquet")
    _, served = serving.split(df)
    column = {r.rate: r.pays for r in serving.table(served) if r.config == "ngram K=4"}
    # Before: {"0.5": "pays", "1": "pays", "2": "pays", "4": "pays"}: the raw serving_pays of each cell.
    assert column == {"0.5": "pays", "1": "not judged (saturated: the baseline achieved 0.5 req/s)",
                      "2": "not claimed (past 1 req/s, not judged)", "4": "not claimed (past 1 req/s, not judged)"}
    line = next(line for line in verdict_lines(tmp_path) if line.startswith("verdict under load: "))
    assert "pays up to 0.5 req/s" in line and "1 req/s not judged (saturated: the baseline achieved 0.5 req/s)" in line
    # A loss ends the walk too: the rates past it are not claimed though their cells pay.
    rows = _serving_grid(r1={"speedup": 0.8})
    write_results(tmp_path, rows)
    df, _ = tables.load_frame(tmp_path / "results.parquet")
    _, served = serving.split(df)
    column = {r.rate: r.pays for r in serving.table(served) if r.config == "ngram K=4"}
    assert column == {"0.5": "pays", "1": "does not pay", "2": "not claimed (past 1 req/s, where it does not pay)",
                      "4": "not claimed (past 1 req/s, where it does not pay)"}


# --- caveats travel, modes stop a walk ------------------------------------------------------------------

MODES = "cudagraph_mode: baseline FULL_AND_PIECEWISE, cell NONE"
MODE_CAVEAT = (f"baseline and cell engines ran in different modes ({MODES}): the speedup measures the mode as well "
               "as the method")
UNTESTED = ("not checked in distribution: no draft reached verification in the check's draws, so they compared the "
            "target with itself and could not fail")
TIES = "2 of 4 requests diverge from the baseline at numerical ties"


def _modes_grid(pinned: bool) -> list[dict[str, Any]]:
    """ngram K=4 paying at batch 1, 4, 8 and 16; batch 4 with ties, batch 16 run eager against a baseline on
    CUDA graphs with exactness untested. ``pinned``: the sweep set engine.async_scheduling."""
    rows = [make_row("baseline", batch=b) for b in BATCHES]
    for batch, speedup in SPEEDUPS[4].items():
        row = make_row("ngram", 4, batch, speedup=speedup)
        if batch == 16:
            row |= {"speedup": 1.25, "speedup_ci_low": 1.1, "speedup_ci_high": 1.4, "mode_mismatch": MODES,
                    "exactness": "untested", "caveats": [UNTESTED, MODE_CAVEAT]}
        if batch == 4:
            row |= {"exactness": "ties", "caveats": [TIES]}
        rows.append(row)
    if pinned:
        for row in rows:
            config = json.loads(row["config_json"])
            row["config_json"] = json.dumps(config | {"engine": {"async_scheduling": False}})
    return rows


def test_a_walk_stops_at_a_cell_whose_engines_ran_in_other_modes_than_its_baseline(tmp_path):
    write_results(tmp_path, _modes_grid(pinned=False))
    # Before: "ngram K=4 pays at every measured batch size, up to 16 (1.80×, CI [1.62, 1.98] at batch 1)", with no
    # word of batch 16's eager engines, its untested exactness or batch 4's ties.
    assert verdict_lines(tmp_path)[0] == (
        "verdict: summarize: ngram K=4 pays up to batch 8 (1.80×, CI [1.62, 1.98] at batch 1); batch 16 not judged "
        f"(engines ran in other modes than the baseline's: {MODES}); caveat: {TIES} (batch 4)")


def test_with_the_modes_pinned_the_walk_goes_on_and_carries_every_cells_caveats(tmp_path):
    write_results(tmp_path, _modes_grid(pinned=True))
    # Before: "ngram K=4 pays at every measured batch size, up to 16 (1.80×, CI [1.62, 1.98] at batch 1)".
    assert verdict_lines(tmp_path)[0] == (
        "verdict: summarize: ngram K=4 pays at every measured batch size, up to 16 (1.80×, CI [1.62, 1.98] at "
        f"batch 1); caveats: {TIES} (batch 4); {UNTESTED} (batch 16); {MODE_CAVEAT} (batch 16)")


def test_the_schedule_best_configuration_and_break_even_stop_where_the_verdict_does(tmp_path):
    from specbench.analytic import verdicts
    from specbench.report import tables

    rows = _modes_grid(pinned=False)
    why = f"engines ran in other modes than the baseline's: {MODES}"
    (rec,) = recommend.recommend(rows)
    # Before: {1: 4, 4: 4, 8: 4, 16: 4} -> [(1, 16, 4)], K=4 claimed at batch 16 on eager engines against graphs.
    assert {b: k for b, (k, _) in rec.best.items()} == {1: 4, 4: 4, 8: 4}
    assert rec.schedule == [(1, 15, 4), (16, 16, 0)]
    assert rec.stop is not None and rec.stop.at == 16 and rec.stop.why == why
    assert f"batch 16 not judged ({why}): K=0 from batch 16 on" in recommend.format_recommendation(rec)
    grid = verdicts.Grid.of(rows)
    best = {b.batch: b for b in verdicts.best_configs(rows, grid)}
    assert best[8].top is not None and best[16].top is None and best[16].why == why  # before: K=4 at 16
    (curve,) = verdicts.break_evens(rows, grid)
    assert curve.batch_sizes == [1, 4, 8] and curve.stop is not None and curve.stop.why == why  # before: to 16
    df, _ = tables.load_frame(write_results(tmp_path, rows))
    (row,) = [b for b in tables.best_configs(df) if b.batch_size == 16]
    assert row.config == "–" and row.caveats == f"not judged ({why})"


def test_with_the_modes_pinned_the_schedule_and_break_even_carry_the_mode_caveat(tmp_path):
    from specbench.analytic import verdicts
    from specbench.report import tables

    rows = _modes_grid(pinned=True)
    (rec,) = recommend.recommend(rows)
    assert rec.schedule == [(1, 16, 4)] and rec.stop is None
    # Before: the schedule said nothing of the cells it stands on.
    assert rec.caveats == [(TIES, (4,)), (UNTESTED, (16,)), (MODE_CAVEAT, (16,))]
    assert f"caveats: {TIES} (batch 4); {UNTESTED} (batch 16); {MODE_CAVEAT} (batch 16)" in (
        recommend.format_recommendation(rec))
    grid = verdicts.Grid.of(rows)
    best = {b.batch: b for b in verdicts.best_configs(rows, grid)}
    assert best[16].top is not None and best[16].top["num_speculative_tokens"] == 4
    (curve,) = verdicts.break_evens(rows, grid)
    assert curve.batch_sizes == [1, 4, 8, 16] and curve.stop is None
    assert (MODE_CAVEAT, (16,)) in curve.caveats
    df, _ = tables.load_frame(write_results(tmp_path, rows))
    (row,) = [b for b in tables.best_configs(df) if b.batch_size == 16]
    assert MODE_CAVEAT in row.caveats
    (measured,) = [b.measured for b in tables.break_even(df)]
    assert f"{MODE_CAVEAT} (batch 16)" in measured
    (schedule,) = tables.schedules(df)
    assert f"{MODE_CAVEAT} (batch 16)" in schedule.caveats


def test_a_choice_per_batch_size_made_without_a_rival_measured_in_other_modes_says_so():
    from specbench.analytic import verdicts

    # K=2 measured alike at every batch size beside _modes_grid's K=4, slower at 16 than K=4's eager engines.
    rows = _modes_grid(pinned=False) + [make_row("ngram", 2, b, speedup=1.2) for b in BATCHES]
    why = f"engines ran in other modes than the baseline's: {MODES}"
    best = {b.batch: b for b in verdicts.best_configs(rows, verdicts.Grid.of(rows))}
    # Before: K=4 (1.25x on eager engines) named at batch 16, K=2 passed over in silence.
    assert best[16].top["num_speculative_tokens"] == 2 and best[16].passed_over == (("ngram K=4", why),)
    (rec,) = recommend.recommend(rows)
    assert rec.best[16][0] == 2 and rec.passed_over[16] == [("ngram K=4", why)] and rec.stop is None


def test_a_per_batch_choice_made_because_a_rival_failed_there_says_so(tmp_path):
    from specbench.analytic import verdicts
    from specbench.report import render_report

    rows = grid("ok")
    k4 = next(r for r in rows if r["num_speculative_tokens"] == 4 and r["batch_size"] == 8)
    k4 |= {"status": "failed", "error": "engine died at batch 8 (on purpose)", "speedup": None,
           "speedup_ci_low": None, "speedup_ci_high": None, "decode_speedup": None}
    best = {b.batch: b for b in verdicts.best_configs(rows, verdicts.Grid.of(rows))}
    assert best[8].top["num_speculative_tokens"] == 2
    assert best[8].passed_over == (("ngram K=4", "failed: engine died at batch 8 (on purpose)"),)
    assert best[4].passed_over == ()
    (rec,) = recommend.recommend(rows)
    assert rec.best[8][0] == 2
    # Before: "batch    8: K=2 (1.30x) ... measured: K=2 1.30x", as if K=2 had beaten K=4 there.
    line = next(line for line in recommend.format_recommendation(rec).splitlines() if "batch    8:" in line)
    assert line.endswith("; ngram K=4 not judged here (failed: engine died at batch 8 (on purpose)): chosen without it")
    write_results(tmp_path, rows)
    page = render_report(tmp_path / "results.parquet")
    assert "chosen without ngram K=4 (not judged: failed: engine died at batch 8 (on purpose))" in page


def _eight_ties(lucky: float = 1.1) -> list[dict[str, Any]]:
    """8 ngram configurations at batch 1 and 4 over 3 engine runs (the merge's interval ingredients: sd 0.0538
    on 4 df), all 1.0x but K=3 at batch 1, ``lucky``x: 1.10x has CI [1.01, 1.20] on its own, [0.93, 1.30] over
    the 8 at once."""
    rows = [make_row("baseline", batch=b) for b in (1, 4)]
    half = distributions.student_t_quantile(0.975, 4) * 0.0538 / 3 ** 0.5
    for batch in (1, 4):
        for k in range(1, 9):
            speedup = lucky if (k, batch) == (3, 1) else 1.0
            rows.append(make_row("ngram", k, batch, speedup=speedup, engine_runs=3, speedup_log_sd=0.0538,
                                 speedup_df=4.0, speedup_ci_low=speedup * math.exp(-half),
                                 speedup_ci_high=speedup * math.exp(half)))
    return rows


def test_the_best_of_eight_ties_does_not_pay_on_its_own_interval(tmp_path):
    from specbench.analytic import verdicts

    rows = _eight_ties()
    lucky = next(r for r in rows if r["num_speculative_tokens"] == 3 and r["batch_size"] == 1)
    assert (round(lucky["speedup_ci_low"], 2), round(lucky["speedup_ci_high"], 2)) == (1.01, 1.20)
    assert verdicts.simultaneous_lower_bound(lucky, 8) == pytest.approx(0.93, abs=0.005)
    # Before: "ngram K=3 pays at batch 1 (1.10x, CI [1.01, 1.20])" and the K schedule shipped K=3.
    write_results(tmp_path, rows)
    line = verdict_lines(tmp_path)[0]
    assert line == ("verdict: summarize: nothing is shown to pay at batch 1: the fastest of 8 configurations, "
                    "ngram K=3 (1.10×, CI [1.01, 1.20]), has a lower bound of 0.93 over the 8 at once "
                    "(the best of several is judged as one of them)")
    (rec,) = recommend.recommend(rows)
    assert {b: k for b, (k, _) in rec.best.items()} == {1: 0, 4: 0}
    grid = verdicts.Grid.of(rows)
    assert not any(verdicts.best_row([r for r in rows if r["batch_size"] == b.batch])[1]
                   for b in verdicts.best_configs(rows, grid))
    # Alone it would pay; a win clear of the 8 at once pays, and its verdict shows the simultaneous bound.
    assert verdicts.best_row([lucky]) == (lucky, True)
    write_results(tmp_path, _eight_ties(1.3))
    assert verdict_lines(tmp_path)[0].startswith(
        "verdict: summarize: ngram K=3 pays at batch 1 (1.30×, CI [1.19, 1.42]; simultaneous lower bound 1.10 "
        "over 8 configurations)")


def test_sound_sweeps_of_eight_ties_seldom_say_anything_pays():
    # tests/benchmarks/interval_coverage_sim.py: of 1,000 sweeps of 8 configurations at batch 1 and 4, all truly
    # 1.0x, through the merge and the verdicts, at most 5% have a verdict that says one pays (before: each
    # chosen cell judged on its own interval, 10-17% said something paid at either batch size). Asserted on
    # 150 sweeps with their simulation error.
    from benchmarks import interval_coverage_sim

    verdict, anything = interval_coverage_sim.false_pays(150, 5)
    assert verdict <= 0.05 + 2 * (0.05 * 0.95 / 150) ** 0.5
    assert anything <= 0.10


def test_the_best_speedup_is_judged_over_the_cells_it_was_chosen_from_and_says_so(tmp_path):
    # The summary's best speedup is chosen from every judged cell of the sweep (16 here: a flagged 17th is none of
    # them), the verdict's configuration from the 8 at batch 1. A win clear of the 8 and not of the 16 reads so in
    # both, each line naming the set its bound is over. Before: "1.20× (CI [1.10, 1.31]; simultaneous over 17
    # cells [0.98, 1.47])" beside "pays at batch 1 (...; simultaneous lower bound 1.02 over 8 configurations)".
    from specbench.analytic import verdicts
    from specbench.report import tables

    rows = _eight_ties(1.2)
    sd, half = rows[-1]["speedup_log_sd"], math.log(rows[-1]["speedup_ci_high"])
    rows.append(make_row("ngram", 9, 4, speedup=1.0, engine_runs=3, speedup_log_sd=sd, speedup_df=4.0,
                         speedup_ci_low=math.exp(-half), speedup_ci_high=math.exp(half), flagged=True,
                         flag_reasons=["engine runs disagree: 0.80x, 1.25x, 1.00x"]))
    lucky = next(r for r in rows if r["num_speculative_tokens"] == 3 and r["batch_size"] == 1)
    overall = verdicts.best_overall(rows)
    assert overall is not None and overall.top is lucky and overall.candidates == 16 and not overall.pays
    assert overall.interval == pytest.approx(verdicts.simultaneous_interval(lucky, 16))
    assert overall.interval[0] == pytest.approx(verdicts.simultaneous_lower_bound(lucky, 16))
    assert overall.interval[0] < 1.0
    assert verdicts.simultaneous_lower_bound(lucky, 8) > 1.0
    path = write_results(tmp_path, rows)
    assert ("ngram K=3 pays at batch 1 (1.20×, CI [1.10, 1.31]; simultaneous lower bound 1.02 over 8 "
            "configurations)") in verdict_lines(tmp_path)[0]
    frame, missing = tables.load_frame(path)
    assert tables.summary(frame, missing).best == (
        "1.20× (CI [1.10, 1.31]; the largest of 16 judged cells: over all 16 at once [0.98, 1.46], not shown above "
        "1× as the best of them all (each workload's verdict chooses among the configurations at one batch size, "
        "and judges over those)) with ngram K=3 at batch 1 on summarize")
    # Clear of all 16, the summary says so too.
    write_results(tmp_path, _eight_ties(1.3))
    frame, missing = tables.load_frame(path)
    assert "above 1× even as the best of them) with ngram K=3 at batch 1" in tables.summary(frame, missing).best
