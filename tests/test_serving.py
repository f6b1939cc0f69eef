"""Serving cells without an engine: arrivals, identities, refusals, and the figures a cell records."""

from __future__ import annotations

import math
import statistics

import pytest

from specbench import grid, load
from specbench.analytic import verdicts
from specbench.config import ConfigError, cell_from_config, validate
from specbench.load import EngineStep, ServedRequest, ServingMeasurement, ServingPlan
from specbench.results import serving


# --- arrivals -------------------------------------------------------------------------------------


def test_arrivals_are_seeded_and_average_the_offered_rate():
    times = load.arrival_times(rate=4.0, burstiness=1.0, count=4001, seed=7)
    assert times == load.arrival_times(rate=4.0, burstiness=1.0, count=4001, seed=7)
    assert times != load.arrival_times(rate=4.0, burstiness=1.0, count=4001, seed=8)
    assert times[0] == 0.0 and all(b >= a for a, b in zip(times, times[1:]))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.05)
    # Poisson: exponential gaps, whose coefficient of variation is 1.
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.08)


def test_burstiness_sets_the_gaps_spread_as_vllm_bench_serve_does():
    def gaps(burstiness: float) -> list[float]:
        times = load.arrival_times(2.0, burstiness, 4001, 0)
        return [b - a for a, b in zip(times, times[1:])]

    even = gaps(4.0)
    # Gamma with shape b: mean 1/rate whatever b, coefficient of variation 1/sqrt(b).
    assert statistics.fmean(even) == pytest.approx(0.5, rel=0.05)
    assert statistics.stdev(even) / statistics.fmean(even) == pytest.approx(0.5, rel=0.08)
    assert gaps(math.inf) == pytest.approx([0.5] * 4000)
    assert load.arrival_times(math.inf, 1.0, 5, 0) == [0.0] * 5


def test_a_plan_cycles_the_prompts_and_keeps_the_warm_up_apart():
    plan = load.serving_plan({"num_requests": 5, "request_rate": 2.0, "burstiness": 1.0, "max_concurrency": None,
                              "warmup_requests": 1}, [(1, 2), (3,)], max_tokens=8, seed=0)
    assert plan.prompts == ((1, 2), (3,), (1, 2), (3,), (1, 2))
    assert list(plan.arrivals_s) == load.arrival_times(2.0, 1.0, 5, 0)
    other = load.serving_plan({"num_requests": 5, "request_rate": 3.0, "burstiness": 1.0, "max_concurrency": None,
                               "warmup_requests": 1}, [(1, 2), (3,)], max_tokens=8, seed=0)
    assert other.fingerprint != plan.fingerprint  # another schedule is other requests


# --- identity and refusals ------------------------------------------------------------------------


def test_offline_cells_keep_their_ids_and_serving_cells_name_their_load(compose_cell):
    # Computed before load.* existed: an offline cell's id and file must not move. repetitions=3 and a
    # 2 GiB KV pool: the defaults then (identity keys).
    offline = cell_from_config(compose_cell(["load.num_requests=32", "load.burstiness=0.5", "repetitions=3",
                                             "engine.cpu_kvcache_space_gib=2"]))
    assert offline.cell_id == "ngram-k4-b1-summarize-28abaf57d9bd-r0"
    assert not offline.is_serving and "load" not in offline.identity
    cell = cell_from_config(compose_cell(["load.request_rate=2", "load.max_concurrency=4"]))
    assert cell.is_serving
    assert cell.cell_id.startswith("ngram-k4-b1-summarize-rate2-c4-")
    assert cell.engine_spec(prepare=False).serving
    # The baseline meets the same offered load: same load keys, same seed, so the same arrivals.
    assert cell.baseline().identity["load"] == cell.identity["load"]
    assert cell.baseline().cell_id.startswith("baseline-k0-b1-summarize-rate2-c4-")
    faster = cell_from_config(compose_cell(["load.request_rate=4"]))
    assert faster.config_hash != cell.config_hash


def test_all_at_once_is_a_rate(compose_cell):
    cell = cell_from_config(compose_cell(["load.request_rate=inf", "method=baseline"]))
    assert cell.cell_id.startswith("baseline-k0-b1-summarize-rateinf-")
    assert validate(compose_cell(["load.request_rate=inf", "load.burstiness=inf"])) == []


def test_the_grid_gives_each_rate_its_own_baseline():
    job = ("method=ngram", "num_speculative_tokens=2", "load.request_rate=2", "workload=creative")
    assert grid.baseline_overrides(job) == ("load.request_rate=2", "workload=creative", "method=baseline")


@pytest.mark.parametrize("overrides, message", [
    (["load.request_rate=0"], "load.request_rate=0.0 must be > 0"),
    (["load.request_rate=-1"], "load.request_rate=-1.0 must be > 0"),
    (["load.request_rate=1", "load.max_concurrency=0"], "load.max_concurrency=0 must be null or an integer >= 1"),
    (["load.request_rate=1", "load.num_requests=3", "load.warmup_requests=2"],
     "load.num_requests=3 is too few for load.warmup_requests=2: at least 4"),
    (["load.request_rate=1", "method=controlled"], "method=controlled cannot serve under load"),
    (["load.request_rate=1", "temperature=0.7"], "serving cells decode greedily"),
    (["load.request_rate=1", "batch_size=4"], "batch_size=4 with load.request_rate"),
    (["load.request_rate=1", "load.burstiness=0"], "load.burstiness=0.0 must be > 0"),
    (["load.request_rate=1", "load.slo.ttft_ms=-5"], "load.slo.ttft_ms=-5.0 must be null or > 0"),
])
def test_bad_load_is_refused_in_one_line_naming_the_key(compose_cell, overrides, message):
    errors = validate(compose_cell(overrides))
    assert [e for e in errors if message in e], errors
    with pytest.raises(ConfigError, match="invalid cell configuration"):
        cell_from_config(compose_cell(overrides))


def test_load_keys_are_ignored_by_offline_cells(compose_cell):
    assert validate(compose_cell(["load.max_concurrency=0", "load.num_requests=1"])) == []


# --- figures --------------------------------------------------------------------------------------


def _request(sent: float, chunks: list[float], tokens: list[int], queue: float | None = 0.01,
             histogram: tuple[int, ...] = ()) -> ServedRequest:
    ids = tuple(range(sum(tokens)))
    drafts = sum(histogram) if histogram else None
    accepted = sum(j * n for j, n in enumerate(histogram)) if histogram else None
    return ServedRequest(sent, tuple(chunks), tuple(tokens), queue, ids, drafts, accepted, histogram)


def test_latencies_follow_vllm_bench_serve():
    # Sent at 1 s; chunks at 1.5 (1 token), 1.7 (3 tokens), 2.1 (1 token): 5 tokens.
    ttft, tpot, e2e, itl = serving.request_latencies(_request(1.0, [1.5, 1.7, 2.1], [1, 3, 1]))
    assert ttft == pytest.approx(0.5)
    assert e2e == pytest.approx(1.1)
    assert tpot == pytest.approx(0.6 / 4)  # (e2e - ttft) / (tokens - 1): per token, not per chunk
    assert itl == pytest.approx([0.2, 0.4])  # per chunk: a speculative chunk carries several tokens
    single = serving.request_latencies(_request(0.0, [0.3], [1]))
    assert single[1] is None  # one token: no TPOT


def test_goodput_counts_the_measured_requests_meeting_every_target():
    fast = _request(0.0, [0.1, 0.2], [1, 1])    # ttft 100 ms, tpot 100 ms
    slow = _request(0.5, [1.5, 1.6], [1, 1])    # ttft 1000 ms
    m = ServingMeasurement((fast, fast, slow), (), warmup_requests=1)
    columns = serving.cell_columns(m, {"request_rate": 2.0, "burstiness": 1.0, "slo": {"ttft_ms": 500}})
    start, end = serving.window(m)
    assert (start, end) == (0.0, 1.6)
    assert columns["served_requests"] == 2
    assert columns["goodput"] == pytest.approx(1 / 1.6)  # fast met it, slow did not
    assert columns["achieved_request_rate"] == pytest.approx(2 / 1.6)
    assert serving.cell_columns(m, {"request_rate": 2.0, "burstiness": 1.0, "slo": {}})["goodput"] is None
    assert not serving.meets_slo(fast, {"tpot_ms": 50})


def test_the_running_batch_is_averaged_over_time_not_steps():
    # A step reports what it ran as it ends: 1 request from 0 to 3 s, then 4 until 4 s: 7/4, though half
    # the steps ran 4.
    mean, p90 = serving.time_weighted([3.0, 4.0], [1, 4], start=0.0)
    assert mean == pytest.approx(1.75)
    assert p90 == 4
    requests = (_request(0.0, [4.0], [1]), _request(0.5, [1.0, 4.0], [1, 1]), _request(0.5, [4.0], [1]))
    steps = (EngineStep(0.5, 9, 0), EngineStep(1.5, 1, 0), EngineStep(4.0, 4, 2), EngineStep(9.0, 9, 0))
    # The window opens with the first measured send (0.5 s) and closes with the last token (4 s).
    columns = serving.cell_columns(ServingMeasurement(requests, steps, 1), {"request_rate": 1.0, "burstiness": 1.0})
    assert columns["running_batch"] == [9, 1, 4]
    assert columns["running_batch_t_s"] == pytest.approx([0.0, 1.0, 3.5])
    assert columns["running_batch_mean"] == pytest.approx((1.0 * 1 + 2.5 * 4) / 3.5)
    assert columns["running_batch_max"] == 9
    assert columns["queue_s_p50"] == pytest.approx(0.01)


def test_a_serving_cell_reads_as_one_repetition_of_its_measured_requests():
    warm = _request(0.0, [0.2, 0.3], [1, 2])
    # Histogram: 2 passes accepted nothing, 1 accepted 1, 1 accepted 2 -> 4 drafts, 3 accepted.
    measured = [_request(0.1 * i, [1.0 + i, 1.5 + i], [1, 6], histogram=(2, 1, 1)) for i in range(2)]
    m = ServingMeasurement((warm, *measured), (EngineStep(1.0, 2, 0, 8, (4, 4)),), warmup_requests=1)
    plan = ServingPlan(((1,), (1, 2), (1, 2, 3)), (0.0, 0.1, 0.2), 7, None, 1)
    reading = serving.as_measurement(m, plan)
    assert reading.rep_wall_s == [pytest.approx(2.5)]  # first measured send (0 s) to last token
    assert reading.rep_output_tokens == [14]
    assert reading.prompt_tokens == 5
    assert len(reading.token_ids) == 3  # the exactness check covers the warm-up request too
    assert reading.counters.drafts == 8 and reading.counters.accepted_tokens == 6
    assert reading.counters.accepted_per_pos == (4, 2)  # position 1: passes accepting >= 1; position 2: >= 2
    assert reading.counters.drafted_per_pos == (4, 4)
    assert reading.ttft_s == [pytest.approx(1.0), pytest.approx(1.9)]


def _row(cell_id: str, rate: float, run: int, e2e: float, *, base: str | None = None) -> dict:
    return {"cell_id": cell_id, "config_hash": cell_id.rsplit("-", 1)[0], "status": "ok", "engine_run": run,
            "method": "baseline" if base is None else "ngram", "baseline_cell_id": base and f"{base}-r{run}",
            "load_request_rate": rate, "e2e_s_p50": e2e, "e2e_s_p90": e2e * 2, "tpot_s_p50": e2e / 10,
            "goodput": None}


def test_speedups_pair_each_engine_run_with_its_baseline_and_the_verdict_stops_at_the_first_loss(tmp_path):
    from specbench.results.files import CellFiles

    cells = []
    # Rate 1: ngram halves E2E in both runs; rate 2: 1.25x and 1.2x; rate 4: slower in both runs.
    for rate, (b0, s0, b1, s1) in {1.0: (2.0, 1.0, 2.2, 1.1), 2.0: (2.5, 2.0, 3.0, 2.5), 4.0: (3.0, 4.0, 3.0, 3.6)}.items():
        base, spec = f"baseline-rate{rate:g}", f"ngram-rate{rate:g}"
        cells += [_row(f"{base}-r0", rate, 0, b0), _row(f"{base}-r1", rate, 1, b1),
                  _row(f"{spec}-r0", rate, 0, s0, base=base), _row(f"{spec}-r1", rate, 1, s1, base=base)]
    for row in cells:
        CellFiles(tmp_path, row["cell_id"]).write(row, [], [])
    merged = [dict(r, engine_run=None, cell_id=r["cell_id"][:-3], baseline_cell_id=r["baseline_cell_id"] and
                   r["baseline_cell_id"][:-3]) for r in cells if r["engine_run"] == 0]
    rows = {r["cell_id"]: r for r in serving.with_serving_comparison(merged, tmp_path)}
    assert rows["ngram-rate1"]["serving_speedup_e2e_p50"] == pytest.approx(2.0)
    assert rows["ngram-rate2"]["serving_speedup_e2e_p50"] == pytest.approx(math.sqrt(1.25 * 1.2))
    assert rows["ngram-rate2"]["serving_speedup_e2e_p50_ci_low"] < rows["ngram-rate2"]["serving_speedup_e2e_p50"]
    assert rows["ngram-rate4"]["serving_speedup_e2e_p50"] < 1.0
    assert rows["ngram-rate1"]["serving_pays"] and not rows["ngram-rate4"]["serving_pays"]
    assert "serving_speedup_e2e_p50" not in rows["baseline-rate1"]
    speculative = [r for r in rows.values() if r["method"] == "ngram"]
    reach = verdicts.highest_paying_rate(speculative)
    assert reach == (2.0 if rows["ngram-rate2"]["serving_pays"] else 1.0)
    assert verdicts.highest_paying_rate([r for r in speculative if r["load_request_rate"] == 4.0]) is None


# --- report ---------------------------------------------------------------------------------------


def _serving_row(method: str, rate: float, *, speedup: float | None = None, achieved: float | None = None,
                 exactness: str | None = "exact") -> dict:
    from rows import make_row

    baseline = method == "baseline"
    row = make_row(method, 4, speedup=1.0 if baseline else 1.0)
    tag = f"-rate{rate:g}"
    row |= {
        "cell_id": row["cell_id"].replace("-r0", f"{tag}-r0"),
        "baseline_cell_id": None if baseline else row["baseline_cell_id"].replace("-r0", f"{tag}-r0"),
        "load_request_rate": rate, "load_burstiness": 1.0, "served_requests": 8,
        "achieved_request_rate": achieved if achieved is not None else rate * 0.95,
        "running_batch_mean": 1.0 + rate, "running_batch_p90": 2.0 + rate, "running_batch_max": 3 + int(rate),
        "running_batch_t_s": [0.0, 1.0, 2.0], "running_batch": [1, 2, 1],
        "queue_s_p50": 0.01 * rate, "ttft_s_p50": 0.1 * rate, "ttft_s_p90": 0.2 * rate,
        "exactness": None if baseline else exactness,
    }
    if not baseline and speedup is not None:
        row |= {f"serving_speedup_{n}": speedup for n in ("tpot_p50", "e2e_p50", "e2e_p90")}
        row |= {"serving_speedup_e2e_p50_ci_low": speedup * 0.9, "serving_speedup_e2e_p50_ci_high": speedup * 1.1,
                "serving_predicted_speedup": speedup * 1.05}
        row["serving_pays"] = serving.pays(row)
    return row


def test_the_report_draws_serving_cells_apart_and_names_where_each_configuration_stops_paying(tmp_path):
    from rows import make_row, write_results

    from specbench.report import write_report

    rows = [make_row("baseline"), make_row("ngram", 4, speedup=1.4)]  # an offline pair beside them
    for rate, speedup, achieved in ((0.5, 1.5, None), (2.0, 1.2, None), (6.0, 0.8, 3.0)):
        rows += [_serving_row("baseline", rate, achieved=achieved), _serving_row("ngram", rate, speedup=speedup)]
    write_results(tmp_path, rows)
    page = write_report(tmp_path).read_text()
    assert 'id="serving"' in page
    assert "<dt>Cells</dt><dd>8</dd>" in page  # the counts are the whole sweep's
    for anchor in ("img-serving-speedup", "img-serving-latency", "img-serving-batch"):
        assert anchor in page
    assert "summarize, ngram K=4: pays up to 2 req/s" in page
    assert "6 ▲" in page  # the baseline achieved 3 of 6 req/s offered: past saturation
    assert "2 ▲" not in page
    # The offline verdict still reads only offline cells: the serving cells' batch size 1 is not its axis.
    assert "ngram K=4" in page and "1.40×" in page


def test_offline_beside_serving_pairs_each_rate_with_the_nearest_offline_batch(tmp_path):
    from rows import make_row, write_results

    offline = [make_row("ngram", 4, batch=b, speedup=s, decode_speedup=s, predicted_decode_speedup=s + 0.1,
                        method_label="ngram K=4")
               for b, s in ((1, 2.0), (4, 1.5), (16, 1.1))]
    served = [_serving_row("ngram", rate, speedup=sp) for rate, sp in ((0.5, 1.9), (2.0, 1.4))]  # batches 1.5, 3
    served = [dict(r, method_label="ngram K=4") for r in served]
    table = serving.offline_beside_serving(offline, served)
    assert [(t["request_rate"], t["offline_batch"], t["offline_decode_speedup"]) for t in table] == [
        (0.5, 1, 2.0), (2.0, 4, 1.5)]  # 1.5 is nearer 1 than 4 on a log scale; 3 nearer 4
    assert table[1]["offline_predicted"] == pytest.approx(1.6)
    assert table[1]["serving_tpot_speedup"] == 1.4
    (tmp_path / "offline").mkdir()
    (tmp_path / "serving").mkdir()
    write_results(tmp_path / "offline", offline)
    write_results(tmp_path / "serving", [_serving_row("baseline", 0.5), *served])
    assert serving.main([str(tmp_path / "offline"), str(tmp_path / "serving")]) == 0


def test_the_report_sets_offline_beside_serving_and_answers_whether_offline_predicts_it(tmp_path):
    from rows import make_row, write_results

    from specbench.report import serving as report_serving
    from specbench.report import write_report
    from specbench.report.tables import load_frame

    # Offline ngram K=4 at batch 1 and 4; serving at 0.5 and 3 req/s induces mean running batches 1.5 and 4.
    offline = [make_row("baseline", batch=b) for b in (1, 4)] + [
        make_row("ngram", 4, batch=b, speedup=s, decode_speedup=s, predicted_decode_speedup=p)
        for b, s, p in ((1, 2.0, 2.2), (4, 1.5, 1.5))]
    rows = list(offline)
    for rate, speedup in ((0.5, 1.6), (3.0, 1.5)):
        rows += [_serving_row("baseline", rate), _serving_row("ngram", rate, speedup=speedup)]
    write_results(tmp_path, rows)

    frame, _ = load_frame(tmp_path / "results.parquet")  # as the report reads it: configurations labelled
    off, served = report_serving.split(frame)
    pairs, answer = report_serving.offline_beside(off, served)
    assert [(p.rate, p.offline_batch, p.offline, p.serving) for p in pairs] == [
        ("0.5", "1", "2.00×", "1.60×"), ("3", "4", "1.50×", "1.50×")]
    # Offline against serving: |2.0/1.6 - 1| = 25% and 0%: median 12%, worst 25%, higher in 1 of 2.
    assert "within 12% of the serving TPOT p50 speedup at the median and 25% at worst" in answer
    assert "higher of the two in 1 of 2" in answer
    # The model against the offline cells: 10% and 0%.
    assert "off the offline speedup by 5% at the median (10% at worst)" in answer

    page = write_report(tmp_path).read_text()
    assert 'id="offline-beside-serving"' in page and answer in page

    # Without offline cells of the configuration there is nothing to pair, and no section.
    assert report_serving.offline_beside(off[off["method"] == "baseline"], served) == ([], None)
