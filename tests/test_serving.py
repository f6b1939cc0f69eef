"""Serving cells without an engine: arrivals, identities, refusals, and the figures a cell records."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest
from omegaconf import OmegaConf

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
    assert times[0] > 0.0 and all(b >= a for a, b in zip(times, times[1:]))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.05)
    # Poisson: exponential gaps, whose coefficient of variation is 1.
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.08)


@pytest.mark.parametrize("seed", range(5))
def test_the_schedule_spans_n_over_rate_as_vllm_bench_serve_stretches_it(seed):
    # vllm bench serve's get_request: N gamma gaps, the first after the start, the cumulative times scaled so
    # that the last request goes out at N / rate. Eight requests at 0.5 req/s: the last at 16 s, whatever the draw.
    times = load.arrival_times(rate=0.5, burstiness=1.0, count=8, seed=seed)
    assert times[-1] == pytest.approx(16.0)
    assert 0.0 < times[0] < 16.0
    assert load.arrival_times(0.5, math.inf, 8, seed) == pytest.approx([2.0 * (i + 1) for i in range(8)])


def test_each_engine_run_draws_its_own_schedule_and_a_cell_shares_it_with_its_baseline(compose_cell):
    cell = cell_from_config(compose_cell(["load.request_rate=2", "engine_runs=2"]))
    prompts = [(1, 2), (3,)]

    def plan(c):
        return load.serving_plan(c.identity["load"], prompts, 8, c.identity["seed"], c.engine_run)

    first, second = plan(cell), plan(cell.in_engine_run(1))
    assert first.arrivals_s != second.arrivals_s  # the interval across engine runs carries arrival noise
    assert first.arrival_seed != second.arrival_seed
    assert plan(cell.baseline()).arrivals_s == first.arrivals_s  # paired: the same offered load
    assert plan(cell.baseline().in_engine_run(1)).arrival_seed == second.arrival_seed
    assert first.arrival_seed == load.arrival_seed(cell.identity["seed"], 0)


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
                              "warmup_requests": 1}, [(1, 2), (3,)], max_tokens=8, seed=0, engine_run=0)
    assert plan.prompts == ((1, 2), (3,), (1, 2), (3,), (1, 2))
    # The warm-up is a burst of its own (due at once); the measured requests' schedule is drawn for them
    # alone, so that they offer the rate named over their own span.
    assert list(plan.arrivals_s) == [0.0] + load.arrival_times(2.0, 1.0, 4, load.arrival_seed(0, 0))
    other = load.serving_plan({"num_requests": 5, "request_rate": 3.0, "burstiness": 1.0, "max_concurrency": None,
                               "warmup_requests": 1}, [(1, 2), (3,)], max_tokens=8, seed=0, engine_run=0)
    assert other.fingerprint != plan.fingerprint  # another schedule is other requests
    fixed = load.serving_plan({"num_requests": 5, "request_rate": 2.0, "burstiness": 1.0, "max_concurrency": None,
                               "warmup_requests": 1, "ignore_eos": True}, [(1, 2), (3,)], max_tokens=8, seed=0,
                              engine_run=0)
    assert fixed.ignore_eos and fixed.fingerprint != plan.fingerprint


# --- identity and refusals ------------------------------------------------------------------------


def test_offline_cells_keep_their_ids_and_serving_cells_name_their_load(compose_cell):
    # Computed before load.* existed: an offline cell's id and file must not move. repetitions=3, a
    # 2 GiB KV pool and no huge pages: the defaults then (identity keys).
    offline = cell_from_config(compose_cell(["load.num_requests=32", "load.burstiness=0.5", "repetitions=3",
                                             "engine.cpu_kvcache_space_gib=2", "engine.cpu_huge_pages=false"]))
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
    assert cell.identity["load"]["ignore_eos"] is False
    fixed = cell_from_config(compose_cell(["load.request_rate=2", "load.max_concurrency=4", "load.ignore_eos=true"]))
    assert fixed.identity["load"]["ignore_eos"] is True and fixed.config_hash != cell.config_hash


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


def test_load_values_are_checked_on_offline_cells_too(compose_cell):
    # Valid load keys change nothing offline; a bad value is refused whether or not a rate makes it matter.
    assert validate(compose_cell(["load.max_concurrency=2", "load.slo.tpot_ms=50"])) == []
    assert validate(compose_cell(["load.max_concurrency=0", "load.num_requests=1", "load.slo.tpot_ms=-5"])) == [
        "load.max_concurrency=0 must be null or an integer >= 1",
        "load.num_requests=1 is too few for load.warmup_requests=2: at least 4 (two measured requests after the warm-up)",
        "load.slo.tpot_ms=-5.0 must be null or > 0 (milliseconds)"]


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


def test_goodput_is_the_achieved_rate_times_the_share_meeting_every_target():
    warm = _request(0.0, [0.1, 0.2], [1, 1])
    fast = _request(1.0, [1.1, 1.2], [1, 1])    # ttft 100 ms, tpot 100 ms
    slow = _request(2.0, [2.6, 2.7], [1, 1])    # ttft 600 ms
    last = _request(3.0, [3.1, 3.2], [1, 1])
    m = ServingMeasurement((warm, fast, slow, last), (), warmup_requests=1, arrivals_s=(0.0, 1.0, 2.0, 3.0))
    columns = serving.cell_columns(m, {"request_rate": 1.0, "burstiness": 1.0, "slo": {"ttft_ms": 500}})
    assert serving.window(m) == (1.0, 3.0)  # the send span: first measured send to last
    assert columns["served_requests"] == 3
    assert columns["offered_rate_realised"] == pytest.approx(1.0)  # two arrivals after the first in 2 s
    assert columns["achieved_request_rate"] == pytest.approx(1.0)  # completions at 1.2 and 2.7 s inside it
    assert columns["slo_met_requests"] == 2 and columns["slo_attainment"] == pytest.approx(2 / 3)
    assert columns["goodput"] == pytest.approx(2 / 3)  # as vLLM: good / duration = attainment x throughput
    low, high = columns["slo_attainment_ci_low"], columns["slo_attainment_ci_high"]
    assert low == pytest.approx(0.2077, abs=1e-3) and high == pytest.approx(0.9385, abs=1e-3)  # Wilson, 2 of 3
    assert serving.cell_columns(m, {"request_rate": 1.0, "burstiness": 1.0, "slo": {}})["goodput"] is None
    assert not serving.meets_slo(fast, {"tpot_ms": 50})


def _light(e2e: float, n: int = 6) -> ServingMeasurement:
    """``n`` requests (one of warm-up) sent 2 s apart, each served alone in ``e2e`` seconds, two tokens each."""
    requests = tuple(_request(2.0 * i, [2.0 * i + e2e / 2, 2.0 * i + e2e], [1, 1]) for i in range(n))
    return ServingMeasurement(requests, (), warmup_requests=1, arrivals_s=tuple(2.0 * i for i in range(n)))


def test_below_saturation_the_goodput_ratio_is_not_the_last_requests_latency():
    # Both sides keep up and meet every target; speculation halves every latency. Over the old window (to
    # the last token) the baseline's 1 s drain against the cell's 0.5 s read as a 1.06x goodput "speedup";
    # over the send span both achieved the offered 0.5 req/s.
    slo = {"request_rate": 0.5, "burstiness": 1.0, "slo": {"e2e_ms": 5000}}
    base, spec = serving.cell_columns(_light(1.0), slo), serving.cell_columns(_light(0.5), slo)
    assert base["goodput"] == pytest.approx(0.5) and spec["goodput"] == pytest.approx(0.5)
    assert spec["achieved_output_tokens_per_s"] == pytest.approx(base["achieved_output_tokens_per_s"], rel=0.2)
    assert not base["saturated"] and base["saturation_reason"] is None


def test_tpot_mean_and_std_over_requests_beside_the_percentiles():
    requests = (_request(0.0, [0.1, 0.2], [1, 1]), _request(0.0, [0.1, 0.2], [1, 1]),
                _request(1.0, [1.1, 1.4], [1, 1]), _request(2.0, [2.1, 2.2, 2.3], [1, 1, 1]))
    columns = serving.cell_columns(ServingMeasurement(requests, (), 1), {"request_rate": 1.0, "burstiness": 1.0})
    # Per request: 0.1, 0.3, 0.1 s a token (as vllm bench serve's mean_tpot and std_tpot).
    assert columns["tpot_s_request_mean"] == pytest.approx(0.5 / 3)
    assert columns["tpot_s_std"] == pytest.approx(statistics.pstdev([0.1, 0.3, 0.1]))


# --- saturation -----------------------------------------------------------------------------------


def test_saturation_is_read_from_completions_against_the_realised_rate():
    # Sent every second (offered 1 req/s, though the rate named was 0.5); completed every 2 s: behind.
    arrivals = tuple(float(i) for i in range(24))
    behind = tuple(_request(t, [2.0 * i + 1.5, 2.0 * i + 2.0], [1, 1]) for i, t in enumerate(arrivals))
    columns = serving.cell_columns(ServingMeasurement(behind, (), 1, arrivals), {"request_rate": 0.5, "burstiness": 1.0})
    assert columns["offered_rate_realised"] == pytest.approx(1.0)
    # The window is the send span (1, 23] shifted by the median E2E (14 s): completions at 16, 18, ..., 36 s,
    # fewer than in any but 0.7% of the runs whose E2Es were shuffled among its requests.
    assert columns["achieved_request_rate"] == pytest.approx(11 / 22)
    assert columns["saturated"] and "completions 0.50 req/s behind the 1.00 req/s offered, p = 0.007" \
        in columns["saturation_reason"]
    # The same completions against a realised rate the engine keeps up with: not saturated, whatever the name said.
    slow = tuple(2.0 * i for i in range(7))
    kept = tuple(_request(t, [t + 0.5, t + 1.0], [1, 1]) for t in slow)
    columns = serving.cell_columns(ServingMeasurement(kept, (), 1, slow), {"request_rate": 8.0, "burstiness": 1.0})
    assert not columns["saturated"], columns["saturation_reason"]


def test_a_growing_queue_is_saturation_even_when_completions_keep_pace():
    arrivals = tuple(float(i) for i in range(7))
    requests = tuple(_request(t, [t + 0.2, t + 0.4], [1, 1]) for t in arrivals)
    growing = tuple(EngineStep(t + 0.5, 4, int(t)) for t in arrivals)  # one more waiting every second
    columns = serving.cell_columns(ServingMeasurement(requests, growing, 1, arrivals),
                                   {"request_rate": 1.0, "burstiness": 1.0})
    assert columns["queue_growth_per_s"] == pytest.approx(1.0)
    assert columns["saturated"] and "waiting queue grew 1.00 requests/s" in columns["saturation_reason"]
    # TTFT climbing 0.5 s per second of arrivals: the queue grows on the client's clock too.
    climbing = tuple(_request(t, [t + 0.1 + 0.5 * t, t + 0.2 + 0.5 * t], [1, 1]) for t in arrivals)
    columns = serving.cell_columns(ServingMeasurement(climbing, (), 1, arrivals), {"request_rate": 1.0, "burstiness": 1.0})
    assert columns["ttft_slope"] == pytest.approx(0.5)
    assert columns["saturated"] and "TTFT grew 0.50 s per s" in columns["saturation_reason"]
    assert serving.saturation(math.inf, 3.0, None, None) == "every request sent at once"


def test_a_trend_is_judged_by_its_interval_not_its_point_estimate():
    # TTFT 0.21 s per s on average over five requests, but so noisy that a flat TTFT is well inside the
    # interval: before, the point estimate alone (above 0.18) named the run saturated.
    arrivals = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
    ttfts = (0.0, 0.0, 1.2, 0.1, 0.3, 1.5)
    noisy = tuple(_request(t, [t + f, t + f + 0.1], [1, 1]) for t, f in zip(arrivals, ttfts))
    columns = serving.cell_columns(ServingMeasurement(noisy, (), 1, arrivals), {"request_rate": 1.0, "burstiness": 1.0})
    assert columns["ttft_slope"] > 1.0 / serving.SATURATED_SHARE - 1.0
    assert not columns["saturated"], columns["saturation_reason"]
    slope, low = serving.trend([1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 1.2, 0.1, 0.3, 1.5])
    assert slope == pytest.approx(columns["ttft_slope"]) and low < 0.0


def test_a_request_still_in_flight_as_the_window_closes_is_no_backlog():
    # The measured requests meet an empty engine (the warm-up completed before they start) and each is
    # served in 1.5 s. Over the unshifted send span every request still in flight as it closes was
    # missing from the count, with nothing in flight as it opened to stand for it; the window shifted by
    # the median E2E counts each request sent in the span once.
    arrivals = (0.0, 2.0, 2.4, 4.0, 6.0, 8.0, 10.0, 12.0, 12.8)
    served = tuple(_request(t, [t + 0.5, t + 1.5], [1, 1]) for t in arrivals)
    columns = serving.cell_columns(ServingMeasurement(served, (), 2, arrivals), {"request_rate": 0.5, "burstiness": 1.0})
    assert columns["achieved_request_rate"] == pytest.approx(columns["offered_rate_realised"])
    assert not columns["saturated"] and columns["saturation_reason"] is None


def test_an_engine_that_never_queues_is_not_called_saturated_at_any_load():
    # An engine of unlimited capacity and fixed E2E, sent to as the client sends (the warm-up burst first),
    # read by cell_columns: at 913428f it read saturated in 20-100% of draws once rate x E2E passed 3 (16
    # requests) or 48 (220 requests). tests/benchmarks/serving_sim.py runs more draws and more loads.
    from benchmarks import serving_sim

    for requests, warmup in serving_sim.SIZES:
        for in_flight in (3, 16, 64):
            share = serving_sim.flagged_share(serving_sim.unlimited(serving_sim.E2E_S), in_flight / serving_sim.E2E_S,
                                              requests, warmup, draws=12)
            assert share == 0.0, (requests, in_flight, share)
    # It still sees an engine that serves half the offered rate.
    behind = serving_sim.fifo(serving_sim.E2E_S, 0.5 * 8.0)
    assert serving_sim.flagged_share(behind, 8.0, 220, 20, draws=5) == 1.0


# --- closed loop and the client's queue -------------------------------------------------------------


def _closed_loop(slots: int, n: int = 9, service: float = 1.0) -> ServingMeasurement:
    """``n`` requests all due at once, ``slots`` in flight, each served in ``service`` seconds: one warm-up,
    served before the measured requests start (:func:`load.replay`), then the next sent as one completes."""
    requests = [_request(0.0, [service / 2, service], [1, 1])]
    for i in range(n - 1):
        sent = service + (i // slots) * service
        requests.append(_request(sent, [sent + service / 2, sent + service], [1, 1]))
    return ServingMeasurement(tuple(requests), (), warmup_requests=1, arrivals_s=(0.0,) + (service,) * (n - 1))


def test_a_closed_loop_is_read_against_its_sends_not_saturated_by_its_infinite_rate():
    # Rate inf under two slots: GuideLLM's concurrent profile. Before, "every request sent at once" named it
    # saturated whatever the engine did; it keeps pace with what its slots let through.
    load_keys = {"request_rate": math.inf, "burstiness": 1.0, "max_concurrency": 2}
    columns = serving.cell_columns(_closed_loop(2), load_keys)
    assert not columns["saturated"], columns["saturation_reason"]
    # Its sends after the burst that fills the slots: one every half second, 1 to 4 s (at 913428f the burst
    # counted too, 7 sends over 3 s, and a cap of half the requests or more read as falling behind).
    assert columns["offered_rate_realised"] == pytest.approx(2.0)
    assert columns["achieved_request_rate"] == pytest.approx(2.0)  # completions at 3, 4 and 5 s (two each)
    assert serving.closed_loop_sends(_closed_loop(2), 2) == [1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    # Every request "arrives" at once: waits and E2E from that arrival grow with the requests sent, not
    # with the system, so a closed loop leaves them empty (at 913428f they read 2 s and 3 s here).
    for column in serving.ARRIVAL_COLUMNS:
        assert columns[column] is None, column
    # The same schedule with no cap is all at once: saturated by construction.
    uncapped = serving.cell_columns(_closed_loop(2), {"request_rate": math.inf, "burstiness": 1.0})
    assert uncapped["saturated"] and uncapped["saturation_reason"] == "every request sent at once"
    assert load.is_closed_loop(math.inf, 2) and not load.is_closed_loop(4.0, 2) and not load.is_closed_loop(math.inf, None)


def test_a_closed_loop_at_a_cap_of_half_its_requests_keeps_up():
    # Eight measured requests under four slots: half go out in the first burst. Counted with the burst,
    # the offered rate was 7 sends over 1 s against completions over the same span: saturated at 913428f.
    columns = serving.cell_columns(_closed_loop(4), {"request_rate": math.inf, "burstiness": 1.0, "max_concurrency": 4})
    assert not columns["saturated"], columns["saturation_reason"]
    assert columns["offered_rate_realised"] == pytest.approx(4.0)


def test_an_open_loop_records_no_wait_where_each_request_goes_out_on_time():
    columns = serving.cell_columns(_light(1.0), {"request_rate": 0.5, "burstiness": 1.0})
    assert columns["wait_to_send_s_p50"] == 0.0 and columns["wait_to_send_s_p90"] == 0.0
    assert columns["e2e_from_arrival_s_p50"] == pytest.approx(1.0)


@pytest.mark.parametrize("slots", [None, 8])
def test_all_at_once_is_timed_to_the_last_token_so_its_throughput_is_not_zero(slots):
    # Every measured request sent at 0 (no cap, or a cap above the requests): the send span has no length.
    # The window runs to the last measured token instead; before, a zero span read as 0 req/s.
    m = _closed_loop(8, service=2.0)
    columns = serving.cell_columns(m, {"request_rate": math.inf, "burstiness": 1.0, "max_concurrency": slots})
    assert serving.window(m) == (2.0, 4.0)
    assert columns["serving_window_s"] == pytest.approx(2.0)
    assert columns["achieved_request_rate"] == pytest.approx(8 / 2.0)
    assert columns["achieved_output_tokens_per_s"] > 0
    assert columns["saturated"] is (slots is None)


def test_burstiness_joins_the_cell_id_only_away_from_poisson(compose_cell):
    poisson = cell_from_config(compose_cell(["load.request_rate=2"]))
    bursty = cell_from_config(compose_cell(["load.request_rate=2", "load.burstiness=0.5", "load.max_concurrency=4"]))
    closed = cell_from_config(compose_cell(["load.request_rate=inf", "load.max_concurrency=8"]))
    assert "-rate2-" in poisson.cell_id and "burst" not in poisson.cell_id
    assert "-rate2-c4-burst0.5-" in bursty.cell_id
    assert "-rateinf-c8-" in closed.cell_id
    from specbench.job import cell_label

    assert cell_label(closed) == "ngram K=4 closed loop c8 summarize engine run 0"
    assert cell_label(poisson) == "ngram K=4 at 2 req/s summarize engine run 0"
    named = verdicts.cell_name(bursty.cell_id)
    assert named.rate == 2.0 and named.shape == load.LoadShape(4, 0.5)
    assert verdicts.cell_name(closed.cell_id).shape == load.LoadShape(8, 1.0)
    # Through vllm serve: another shape (its latencies include HTTP and the stream), named by the id and the row.
    served = cell_from_config(compose_cell(["load.request_rate=2", "load.burstiness=0.5", "load.max_concurrency=4",
                                            "load.via=server"]))
    assert verdicts.cell_name(served.cell_id).shape == load.LoadShape(4, 0.5, "server") != named.shape
    assert load.LoadShape(4, 0.5, "server").text() == "c4, burstiness 0.5, via server"
    from specbench.results.serving import load_shape

    row = {"load_max_concurrency": 4, "load_burstiness": 0.5}
    assert load_shape(row | {"load_via": "server"}) != load_shape(row) == load.LoadShape(4, 0.5)


def test_the_running_batch_is_averaged_over_time_not_steps():
    # A step reports what it ran as it ends: 1 request from 0 to 3 s, then 4 until 4 s: 7/4, though half
    # the steps ran 4.
    mean, p90 = serving.time_weighted([3.0, 4.0], [1, 4], start=0.0)
    assert mean == pytest.approx(1.75)
    assert p90 == 4
    requests = (_request(0.0, [4.0], [1]), _request(0.5, [1.0, 4.0], [1, 1]), _request(4.0, [4.5], [1]))
    steps = (EngineStep(0.5, 9, 0), EngineStep(1.5, 1, 0), EngineStep(4.0, 4, 2), EngineStep(9.0, 9, 0))
    # The window is the send span: the first measured send (0.5 s) to the last (4 s); the step reported at
    # 9 s ran through its end and closes it.
    columns = serving.cell_columns(ServingMeasurement(requests, steps, 1), {"request_rate": 1.0, "burstiness": 1.0})
    assert columns["running_batch"] == [9, 1, 4, 9]
    assert columns["running_batch_t_s"] == pytest.approx([0.0, 1.0, 3.5, 3.5])
    assert columns["running_batch_mean"] == pytest.approx((1.0 * 1 + 2.5 * 4) / 3.5)
    assert columns["running_batch_max"] == 9
    assert columns["queue_s_p50"] == pytest.approx(0.01)
    # One step outlasting the whole span still says what ran during it.
    long = serving.cell_columns(ServingMeasurement(requests, (EngineStep(9.0, 3, 0),), 1),
                                {"request_rate": 1.0, "burstiness": 1.0})
    assert long["running_batch_mean"] == pytest.approx(3.0) and long["running_batch"] == [3]


def test_a_serving_cell_reads_as_one_repetition_of_its_measured_requests():
    warm = _request(0.0, [0.2, 0.3], [1, 2])
    # Histogram: 2 passes accepted nothing, 1 accepted 1, 1 accepted 2 -> 4 drafts, 3 accepted, 8 drafted tokens.
    measured = [dataclasses.replace(_request(0.1 * i, [1.0 + i, 1.5 + i], [1, 6], histogram=(2, 1, 1)),
                                    draft_tokens=8, drafted_per_step=(2, 2, 2, 2)) for i in range(2)]
    # The engine step in the window also drafted for the warm-up request: 8 more tokens, 4 per position.
    m = ServingMeasurement((warm, *measured), (EngineStep(0.05, 3, 0, 16, (8, 8)),), warmup_requests=1)
    plan = ServingPlan(((1,), (1, 2), (1, 2, 3)), (0.0, 0.1, 0.2), 7, None, 1)
    reading = serving.as_measurement(m, plan)
    assert reading.rep_wall_s == [pytest.approx(0.1)]  # the send span
    assert reading.rep_output_tokens == [14]
    assert reading.prompt_tokens == 5
    assert len(reading.token_ids) == 3  # the exactness check covers the warm-up request too
    assert reading.counters.drafts == 8 and reading.counters.accepted_tokens == 6
    # Drafted tokens are the measured requests' own, not the engine step's (which held the warm-up's too).
    assert reading.counters.draft_tokens == 16
    assert reading.counters.accepted_per_pos == (4, 2)  # position 1: passes accepting >= 1; position 2: >= 2
    assert reading.counters.drafted_per_pos == (8, 8)
    assert reading.ttft_s == [pytest.approx(1.0), pytest.approx(1.9)]


def _row(cell_id: str, rate: float, run: int, e2e: float, *, base: str | None = None, goodput: float | None = None,
         saturated: bool = False) -> dict:
    # Each rate on engines of its own (a model of its own): cells independent of one another.
    return {"cell_id": cell_id, "config_hash": cell_id.rsplit("-", 1)[0], "status": "ok", "engine_run": run,
            "model": f"m{rate:g}", "method": "baseline" if base is None else "ngram", "baseline_cell_id": base and f"{base}-r{run}",
            "load_request_rate": rate, "e2e_s_p50": e2e, "e2e_s_p90": e2e * 2, "tpot_s_p50": e2e / 10,
            "goodput": goodput, "saturated": saturated, "saturation_reason": "behind" if saturated else None}


def _compare(tmp_path, runs: dict[float, list[tuple[float, float]]], *, saturated=(), goodput=None, stale=()):
    """Serving cells at each rate, baseline and ngram, one (baseline E2E, ngram E2E) pair per engine run,
    written as cell files; merged over the planned engine runs. ``stale``: files left by another sweep."""
    from specbench.results.files import CellFiles

    cells, planned = [], []
    for rate, pairs in runs.items():
        base, spec = f"baseline-rate{rate:g}", f"ngram-rate{rate:g}"
        for run, (b, c) in enumerate(pairs):
            gb, gc = (goodput or {}).get((rate, run), (1.0, 1.0))
            sat = rate in saturated
            cells += [_row(f"{base}-r{run}", rate, run, b, goodput=gb, saturated=sat),
                      _row(f"{spec}-r{run}", rate, run, c, base=base, goodput=gc)]
    for row in cells + list(stale):
        CellFiles(tmp_path, row["cell_id"]).write(row, [], [])
    planned = [r["cell_id"] for r in cells]
    merged = [dict(r, engine_run=None, cell_id=r["cell_id"][:-3], baseline_cell_id=r["baseline_cell_id"] and
                   r["baseline_cell_id"][:-3]) for r in cells if r["engine_run"] == 0]
    return {r["cell_id"]: r for r in serving.with_serving_comparison(merged, tmp_path, planned)}


def test_speedups_pair_each_engine_run_with_its_baseline_and_the_verdict_stops_at_the_first_loss(tmp_path):
    # Rate 1: ngram halves E2E in both runs; rate 2: 1.5x and 1.52x; rate 4: slower in both runs.
    rows = _compare(tmp_path, {1.0: [(2.0, 1.0), (2.2, 1.1)], 2.0: [(3.0, 2.0), (3.04, 2.0)],
                               4.0: [(3.0, 4.0), (3.0, 3.9)]})
    assert rows["ngram-rate1"]["serving_speedup_e2e_p50"] == pytest.approx(2.0)
    assert rows["ngram-rate2"]["serving_speedup_e2e_p50"] == pytest.approx(math.sqrt(1.5 * 1.52))
    assert rows["ngram-rate2"]["serving_speedup_e2e_p50_ci_low"] < rows["ngram-rate2"]["serving_speedup_e2e_p50"]
    assert rows["ngram-rate4"]["serving_speedup_e2e_p50"] < 1.0
    assert rows["ngram-rate1"]["serving_pays"] and rows["ngram-rate2"]["serving_pays"]
    assert not rows["ngram-rate4"]["serving_pays"]
    assert "serving_speedup_e2e_p50" not in rows["baseline-rate1"]
    speculative = [r for r in rows.values() if r["method"] == "ngram"]
    assert verdicts.highest_paying_rate(speculative) == 2.0
    assert verdicts.highest_paying_rate([r for r in speculative if r["load_request_rate"] != 2.0]) == 1.0
    assert verdicts.highest_paying_rate([r for r in speculative if r["load_request_rate"] == 4.0]) is None


def test_serving_engine_runs_that_disagree_flag_the_cell(tmp_path):
    # Nine rates whose engine runs agree within 2%; at rate 10 one run says 2x, the other 0.8x.
    runs = {float(r): [(2.0, 1.0), (2.0, 1.02)] for r in range(1, 10)} | {10.0: [(2.0, 1.0), (2.0, 2.5)]}
    rows = _compare(tmp_path, runs)
    assert not rows["ngram-rate1"].get("flagged")
    odd = rows["ngram-rate10"]
    assert odd["flagged"] and "serving engine runs disagree on the E2E p50 speedup: 2.00x, 0.80x" in odd["flag_reasons"][0]
    # One family with the offline cells' disagreement, at its share of the sweep's error budget (it ran at 0.05).
    assert "at 0.0125 Bonferroni over 10 cells" in odd["flag_reasons"][0]


def test_the_spread_is_pooled_per_regime_so_saturated_noise_leaves_light_load_alone(tmp_path):
    steady = {float(r): [(2.0, 1.0), (2.0, 1.01)] for r in (1, 2, 3)}
    wild = {float(r): [(2.0, 1.0), (2.0, 2.0)] for r in (8, 9, 10)}
    rows = _compare(tmp_path, steady | wild, saturated={8.0, 9.0, 10.0})
    light, heavy = rows["ngram-rate1"], rows["ngram-rate8"]
    width = lambda r: math.log(r["serving_speedup_e2e_p50_ci_high"] / r["serving_speedup_e2e_p50_ci_low"])  # noqa: E731
    assert width(light) < 0.1 < width(heavy)  # pooled with the wild runs, rate 1's interval would span 0.5x-8x
    assert light["serving_speedup_ci_method"].endswith("spread pooled below saturation")
    assert heavy["serving_speedup_ci_method"].endswith("spread pooled at saturation")
    # A speculative cell is saturated where its baseline is: it takes the baseline's reason.
    assert heavy["saturated"] and "baseline: engine run 0: behind" in heavy["saturation_reason"]


def test_a_run_with_zero_goodput_is_named_not_dropped(tmp_path):
    rows = _compare(tmp_path, {1.0: [(2.0, 1.0), (2.0, 1.0)]}, goodput={(1.0, 1): (0.0, 0.5)})
    row = rows["ngram-rate1"]
    assert row.get("serving_speedup_goodput") is None  # not the one surviving run's ratio
    assert row["serving_goodput_note"] == "goodput 0 in engine run 1: baseline: no goodput speedup"
    assert row["serving_speedup_e2e_p50"] == pytest.approx(2.0)


def test_engine_runs_are_read_from_the_plan_not_the_directory(tmp_path):
    # A third engine run another sweep left in the directory, with the same cell ids' stem: 0.25x.
    stale = [_row("baseline-rate1-r2", 1.0, 2, 1.0), _row("ngram-rate1-r2", 1.0, 2, 4.0, base="baseline-rate1")]
    rows = _compare(tmp_path, {1.0: [(2.0, 1.0), (2.0, 1.0)]}, stale=stale)
    assert rows["ngram-rate1"]["serving_speedup_e2e_p50"] == pytest.approx(2.0)
    assert rows["ngram-rate1"]["arrival_seeds"] == [None, None]  # two engine runs read, not three


def test_serving_ratios_stay_out_of_the_offline_spread_and_recommend(tmp_path):
    from rows import cell_row, write_cell

    from specbench.results.merge import merge
    from specbench.results.schema import recommendable

    ids = []
    for i in range(4):  # offline pairs whose engine runs agree within 2%
        for run, wall in ((0, 1.0), (1, 1.02)):
            write_cell(tmp_path, cell_row(f"b{i}-p{run}", "baseline", 2.0, engine_run=run, config_hash=f"B{i}")
                       | {"model": f"m{i}"}, [[1]])
            write_cell(tmp_path, cell_row(f"s{i}-p{run}", "ngram", wall, baseline_id=f"b{i}-p{run}", engine_run=run,
                                          config_hash=f"S{i}") | {"model": f"m{i}"}, [[1]])
            ids += [f"b{i}-p{run}", f"s{i}-p{run}"]
    alone = {r["cell_id"]: r for r in merge(tmp_path, ids)}
    for run, wall in ((0, 1.0), (1, 3.0)):  # a serving pair at 2 req/s whose runs are far apart
        extra = {"model": "mv", "load_request_rate": 2.0}
        write_cell(tmp_path, cell_row(f"bv-p{run}", "baseline", 2.0, engine_run=run, config_hash="BV") | extra, [[1]])
        write_cell(tmp_path, cell_row(f"sv-p{run}", "ngram", wall, baseline_id=f"bv-p{run}", engine_run=run,
                                      config_hash="SV") | extra, [[1]])
        ids += [f"bv-p{run}", f"sv-p{run}"]
    rows = {r["cell_id"]: r for r in merge(tmp_path, ids)}
    assert rows["s0-p0"]["speedup_ci_low"] == pytest.approx(alone["s0-p0"]["speedup_ci_low"])
    assert not rows["s0-p0"]["flagged"]
    served = rows["sv-p0"]
    assert served.get("speedup") is None and not recommendable(served)  # no batch-1 evidence for recommend
    assert not any("engine runs disagree" in r for r in served.get("flag_reasons") or [])


# --- report ---------------------------------------------------------------------------------------


def _serving_row(method: str, rate: float, *, speedup: float | None = None, achieved: float | None = None,
                 exactness: str | None = "exact", saturated: bool = False, realised: float | None = None) -> dict:
    from rows import make_row

    baseline = method == "baseline"
    row = make_row(method, 4, speedup=1.0 if baseline else 1.0)
    tag = f"-rate{rate:g}"
    row |= {
        "cell_id": row["cell_id"].replace("-r0", f"{tag}-r0"),
        "baseline_cell_id": None if baseline else row["baseline_cell_id"].replace("-r0", f"{tag}-r0"),
        "load_request_rate": rate, "load_burstiness": 1.0, "served_requests": 8,
        "achieved_request_rate": achieved if achieved is not None else rate * 0.95,
        "offered_rate_realised": realised if realised is not None else rate,
        "saturated": saturated, "saturation_reason": "completions behind" if saturated else None,
        "slo_attainment": 0.75, "slo_attainment_ci_low": 0.41, "slo_attainment_ci_high": 0.93,
        "tpot_s_request_mean": 0.02, "tpot_s_std": 0.005,
        "running_batch_mean": 1.0 + min(rate, 8.0), "running_batch_p90": 2.0 + min(rate, 8.0),
        "running_batch_max": 3 + int(min(rate, 8.0)),
        "running_batch_t_s": [0.0, 1.0, 2.0], "running_batch": [1, 2, 1],
        "queue_s_p50": 0.01 * min(rate, 8.0), "ttft_s_p50": 0.1 * min(rate, 8.0), "ttft_s_p90": 0.2 * min(rate, 8.0),
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
    # At 2 req/s named, the schedule realised 1.2 and the baseline completed 1.15: it kept up with its load.
    # At 6 the baseline fell behind; ngram's 1.3x there is not judged (it would carry the verdict to 6).
    for rate, speedup, achieved, realised, saturated in ((0.5, 1.5, None, None, False), (2.0, 1.2, 1.15, 1.2, False),
                                                         (6.0, 1.3, 3.0, None, True)):
        rows += [_serving_row("baseline", rate, achieved=achieved, realised=realised, saturated=saturated),
                 _serving_row("ngram", rate, speedup=speedup, realised=realised, saturated=saturated)]
    write_results(tmp_path, rows)
    page = write_report(tmp_path).read_text()
    assert 'id="serving"' in page
    assert "<dt>Cells</dt><dd>8</dd>" in page  # the counts are the whole sweep's
    for anchor in ("img-serving-speedup", "img-serving-latency", "img-serving-acceptance", "img-serving-batch"):
        assert anchor in page
    assert "summarize, ngram K=4: pays up to 2 req/s" in page
    assert "6 req/s not judged (saturated: baseline: completions behind)" in page
    assert "6 ▲" in page
    assert "2 ▲" not in page  # 1.15 of the 1.2 req/s realised, though 2 were named
    assert "<td>1.20</td>" in page  # the realised rate beside the nominal one
    assert "75% [41%, 93%]" in page and "20.0 ± 5.0" in page  # SLO attainment with its interval; TPOT mean ± std
    assert "ran with load.ignore_eos" not in page
    # The offline verdict still reads only offline cells: the serving cells' batch size 1 is not its axis.
    assert "ngram K=4" in page and "1.40×" in page


def test_serving_verdicts_and_panels_group_by_load_shape(tmp_path):
    from rows import write_results

    from specbench.report import verdict_lines, write_report

    # Poisson without a cap pays at 1 and 2 req/s; under a cap of 2 the same configuration stops paying at 2;
    # a closed loop of 4 slots pays. Pooled on one rate axis the capped loss at 2 would end the uncapped walk.
    def shaped(method, rate, speedup=None, cap=None):
        row = _serving_row(method, rate, speedup=speedup)
        if cap is not None:
            row["load_max_concurrency"] = cap
            for column in ("cell_id", "baseline_cell_id"):
                if row[column]:
                    row[column] = row[column].replace(f"-rate{rate:g}-", f"-rate{rate:g}-c{cap}-")
        return row

    rows = []
    for rate in (1.0, 2.0):
        rows += [shaped("baseline", rate), shaped("ngram", rate, 1.5),
                 shaped("baseline", rate, cap=2), shaped("ngram", rate, 1.5 if rate == 1.0 else 0.8, cap=2)]
    rows += [shaped("baseline", math.inf, cap=4), shaped("ngram", math.inf, 1.3, cap=4)]
    rows[-1] |= {"wait_to_send_s_p50": 1.5, "wait_to_send_s_p90": 2.5, "e2e_from_arrival_s_p50": 2.0}
    spec = [r for r in rows if r["method"] == "ngram"]
    with pytest.raises(ValueError, match="one load shape; these cells mix"):
        verdicts.serving_verdict(spec, rows)
    uncapped = [r for r in spec if verdicts.shape(r) == load.LoadShape(None)]
    assert verdicts.serving_verdict(uncapped, rows).highest == 2.0
    capped = [r for r in spec if verdicts.shape(r) == load.LoadShape(2)]
    assert verdicts.serving_verdict(capped, rows).highest == 1.0
    write_results(tmp_path, rows)
    lines = verdict_lines(tmp_path)
    assert any(line.startswith("verdict under load: summarize, ngram K=4: pays up to 2 req/s") for line in lines), lines
    assert any(line.startswith("verdict under load: summarize · c2, ngram K=4: pays up to 1 req/s") for line in lines)
    assert "verdict under load: summarize · closed loop c4, ngram K=4: pays (E2E p50 speedup: all at once 1.30×)" \
        in lines, lines
    page = write_report(tmp_path).read_text()
    assert "summarize · closed loop c4" in page and "<td>all at once</td>" in page
    assert "<td>1500.0 / 2500.0</td>" in page  # the slot wait, p50 / p90


@pytest.mark.parametrize("version", [13, 14])
def test_serving_results_of_schema_13_and_14_still_read_and_judge(tmp_path, version):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specbench.report import verdict_lines
    from specbench.results.schema import SCHEMA, RESULTS_FILE, read_rows, rows_to_table

    rows = [_serving_row("baseline", rate) for rate in (1.0, 2.0)] + [
        _serving_row("ngram", rate, speedup=1.5) for rate in (1.0, 2.0)]
    new = set(serving.ARRIVAL_COLUMNS)
    table = rows_to_table([dict(r, schema_version=version) for r in rows])
    old = pa.Table.from_pylist(table.to_pylist(), schema=pa.schema([f for f in SCHEMA if f.name not in new]))
    pq.write_table(old, tmp_path / RESULTS_FILE)
    read = read_rows(tmp_path / RESULTS_FILE)
    assert all(r["wait_to_send_s_p50"] is None and r["schema_version"] == version for r in read)
    assert verdicts.shape(read[0]) == load.LoadShape(None)
    assert any(line.startswith("verdict under load: summarize, ngram K=4: pays up to 2 req/s")
               for line in verdict_lines(tmp_path))


def test_the_page_warns_that_ignore_eos_changes_acceptance(tmp_path):
    from rows import write_results

    from specbench.report import write_report

    rows = [dict(r, load_ignore_eos=True) for r in (_serving_row("baseline", 1.0), _serving_row("ngram", 1.0, speedup=1.2))]
    write_results(tmp_path, rows)
    assert "ran with load.ignore_eos" in write_report(tmp_path).read_text()


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


def test_gpu_serving_presets_measure_at_least_200_requests_per_rate():
    from pathlib import Path

    import yaml

    sweeps = Path(__file__).resolve().parents[1] / "sweeps"
    for path in sweeps.glob("serving_*.yaml"):
        preset = yaml.safe_load(path.read_text())
        measured = preset["load"]["num_requests"] - preset["load"]["warmup_requests"]
        if "cpu" in path.stem:
            assert "smoke test" in path.read_text(), path  # too few to read figures from, and it says so
        else:
            assert measured >= 200, f"{path.name} measures {measured} requests per rate"


def test_a_serving_cell_with_its_own_speedups_is_not_counted_failed(tmp_path):
    import pandas as pd

    from specbench.report.tables import failed_mask

    compared = dict(_serving_row("ngram", 1.0, speedup=1.2), speedup=None)  # no offline speedup, by design
    lost = dict(_serving_row("ngram", 2.0), speedup=None)  # never compared with its baseline
    frame = pd.DataFrame([_serving_row("baseline", 1.0), compared, lost])
    assert failed_mask(frame).tolist() == [False, False, True]


def test_the_client_sends_on_schedule_and_holds_a_request_only_for_a_slot():
    import asyncio
    import time

    from specbench.load import replay

    def run(arrivals_s, max_concurrency, warmup=0):
        sent: dict[int, float] = {}
        start = time.perf_counter()

        async def send(index: int) -> int:
            sent[index] = time.perf_counter() - start
            await asyncio.sleep(0.3)
            return index

        served, due = asyncio.run(replay(arrivals_s, max_concurrency, start, send, warmup))
        assert served == [0, 1, 2]
        return sent, due

    free, due = run([0.0, 0.0, 0.1], None)
    assert free[2] >= 0.1 and free[1] < 0.3 and due == (0.0, 0.0, 0.1)  # on schedule, nobody waits for anybody
    one_slot, _ = run([0.0, 0.0, 0.1], 1)
    assert one_slot[1] >= 0.3 and one_slot[2] >= 0.6  # each waits for the request before it
    # A warm-up is served to completion before the measured schedule's clock starts (vllm bench serve's
    # --num-warmups); at 913428f request 1 went out at 0, beside it, into the warm-up's queue.
    warmed, due = run([0.0, 0.0, 0.1], None, warmup=1)
    assert warmed[1] >= 0.3 and warmed[2] >= warmed[1] + 0.1
    assert due[0] == 0.0 and due[1] >= 0.3 and due[2] == pytest.approx(due[1] + 0.1)


def test_the_serving_engine_and_the_engine_worker_do_not_import_each_other():
    # At 913428f each imported the other inside a function (the worker the serving engine, the serving
    # engine the worker's engine_mode): the house's only import circle. The worker may start a serving
    # engine; the serving engine reads the engine's mode from specbench.engine.mode.
    import ast
    from pathlib import Path

    import specbench.engine

    root = Path(specbench.engine.__file__).parent

    def imports(name: str) -> set[str]:
        tree = ast.parse((root / f"{name}.py").read_text())
        return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module} | {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}

    assert "specbench.engine.worker" not in imports("serving")
    assert "specbench.engine.serving" in imports("worker")
    assert "specbench.engine.worker" not in imports("mode") and "specbench.engine.serving" not in imports("mode")


def test_each_serving_cell_starts_from_a_cold_prefix_cache():
    # At 913428f the prefix cache was never reset: a cell's prompts, cached by the cell before it on the
    # same engine, gave it cheaper prefills than its baseline had (and a capacity probe than the one before).
    import asyncio
    from types import SimpleNamespace

    from specbench.engine.serving import ServingEngine

    calls: list[str] = []
    refusals = [True]  # vLLM refuses while a block is still held: the first try of the first cell

    class Engine:
        async def reset_prefix_cache(self) -> bool:
            if refusals:
                refusals.pop()
                return False
            calls.append("reset")
            return True

        async def generate(self, prompt, params, request_id):
            calls.append("request")
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7], spec_decode_metrics=None)], metrics=None)

    served = object.__new__(ServingEngine)
    served._steps, served._clock, served._loop, served.engine = [], [0.0], asyncio.new_event_loop(), Engine()
    plan = ServingPlan(prompts=((1,), (2,), (3,)), arrivals_s=(0.0, 0.0, 0.0), max_tokens=1, max_concurrency=None,
                       warmup_requests=1)
    try:
        for _ in range(2):
            measured = served.serve(plan)
            assert [r.token_ids for r in measured.requests] == [(7,)] * 3
    finally:
        served._loop.close()
    assert calls == ["reset", "request", "request", "request"] * 2


def test_the_plan_says_when_a_serving_schedule_cycles_its_prompts():
    # 16 requests through 4 prompts: three in four repeat a prompt, and with prefix caching on their
    # prefill comes from the cache. At 913428f the plan said nothing of it.
    from specbench.plan import format_plan, make_plan

    common = ["method=ngram", "load.request_rate=2", "load.num_requests=16", "load.warmup_requests=2"]
    cycling = format_plan(make_plan(common + ["workload.num_prompts=4", "load.cycle_prompts=true"]), 0.7)
    assert "2 serving cell(s) cycle their prompts (up to 16 requests through 4 prompts, load.cycle_prompts=true)" \
        in cycling
    assert "cycle their prompts" not in format_plan(make_plan(common + ["workload.num_prompts=16"]), 0.7)
    # Unless asked, a cell takes a prompt per request: nothing cycles.
    assert "cycle their prompts" not in format_plan(make_plan(common + ["workload.num_prompts=4"]), 0.7)


def test_a_serving_cell_takes_a_prompt_per_request_unless_asked_to_cycle(compose_cell):
    # At 913428f a serving cell cycled its workload's prompts (16 requests through the default 8, 220 through 64
    # in serving_4090): a repeated prompt's prefill came whole from the prefix cache, and the warm-up's
    # prompts came round again among the measured ones.
    overrides = ["method=ngram", "load.request_rate=2", "load.num_requests=16", "load.warmup_requests=2"]
    unique = cell_from_config(compose_cell(overrides))
    assert unique.workload["num_prompts"] == 16 and unique.identity["workload"]["num_prompts"] == 16
    prompts = [(i,) for i in range(unique.workload["num_prompts"])]
    plan = load.serving_plan(unique.identity["load"], prompts, 8, 0, 0)
    assert len(set(plan.prompts)) == 16 and not set(plan.prompts[:2]) & set(plan.prompts[2:])
    cycling = cell_from_config(compose_cell([*overrides, "load.cycle_prompts=true"]))
    assert cycling.workload["num_prompts"] == 8
    assert cell_from_config(compose_cell([*overrides, "workload.num_prompts=20"])).workload["num_prompts"] == 20
    assert cell_from_config(compose_cell(["load.num_requests=32"])).workload["num_prompts"] == 8  # offline
    # The schema refuses a non-boolean on the command line; a stored config is checked too.
    plain = OmegaConf.to_container(compose_cell(overrides))
    plain["load"]["cycle_prompts"] = "maybe"
    assert "load.cycle_prompts='maybe' must be true or false" in load.validate(plain)
