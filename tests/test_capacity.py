"""Capacity search without an engine: the bisection, the SLO check of a probe, refusals, the verdict."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest

from specbench.analytic import capacity
from specbench.analytic.capacity import CapacityError, Probe, Settings
from specbench.load import ServedRequest, ServingMeasurement

SETTINGS = Settings(min_rate=0.5, max_rate=8.0, max_probes=6, percentile=90.0, tolerance=0.1)


def _knee(at: float, rates: list[float] | None = None, requests: int = 100):
    """A probe function whose configuration meets its SLOs up to ``at`` req/s (recording the rates probed):
    every request within them at or below, half of them above."""
    def probe(rate: float, draw: int) -> Probe:
        if rates is not None:
            rates.append(rate)
        good = rate <= at
        return Probe(rate, {"tpot_ms": 50.0 if good else 150.0}, None if good else "TPOT too slow",
                     met=requests if good else requests // 2, requests=requests, draw=draw)
    return probe


def test_bisection_probes_the_ends_then_geometric_midpoints_and_measures_the_bracket_again():
    rates: list[float] = []
    renewed: list[int] = []
    found = capacity.search(_knee(2.5, rates), SETTINGS, renew=lambda: renewed.append(len(rates)))
    # 0.5 passes, 8 fails, then sqrt(low * high): 2 passes, 4 fails, 2.83 fails, 2.38 passes; then the
    # bracket's ends, 2.38 and 2.83, three times more each, each on a fresh engine.
    low, high = math.sqrt(2.0 * math.sqrt(8.0)), math.sqrt(8.0)
    assert rates == pytest.approx([0.5, 8.0, 2.0, 4.0, high, low] + [low] * 3 + [high] * 3)
    assert renewed == list(range(6, 12))
    assert found.capacity == pytest.approx(2.378, abs=1e-3) and found.capacity <= 2.5
    assert (found.low, found.high) == pytest.approx((low, high))
    assert [p.draw for p in found.probes] == list(range(12))  # every probe its own arrival draw
    assert all(p.passed == (p.rate <= 2.5) for p in found.probes)


def test_a_rate_is_passed_or_failed_by_the_wilson_interval_and_lengthened_while_it_straddles_the_target():
    def probe(met: int, requests: int = 100, saturated: str | None = None) -> Probe:
        return Probe(1.0, {}, None, met=met, requests=requests, saturated=saturated)

    # 14 of 14 within the SLOs: Wilson's lower bound 0.785, so no 14-request probe could show 90%
    # (at 913428f it passed on its p90 alone).
    assert capacity.outcome([probe(14, 14)], 0.9) == capacity.OPEN
    assert capacity.outcome([probe(100)], 0.9) == capacity.PASSED        # lower bound 0.963
    assert capacity.outcome([probe(80)], 0.9) == capacity.FAILED         # upper bound 0.867
    assert capacity.outcome([probe(93)], 0.9) == capacity.OPEN           # (0.862, 0.966)
    assert capacity.outcome([probe(93)] * 4 + [probe(100)], 0.9) == capacity.PASSED  # pooled: 0.923 lower
    # One saturated probe may be the test's false alarm: lengthen; most of several saturated: failed.
    assert capacity.outcome([probe(100, saturated="behind")], 0.9) == capacity.OPEN
    assert capacity.outcome([probe(100, saturated="behind")] * 2 + [probe(100)], 0.9) == capacity.FAILED
    assert capacity.outcome([probe(100, saturated="behind")] + [probe(100)] * 2, 0.9) == capacity.PASSED
    # The search lengthens a straddling rate with fresh draws, up to max_extensions more probes.
    draws: list[int] = []

    def straddling(rate: float, draw: int) -> Probe:
        draws.append(draw)
        return Probe(rate, {}, None, met=92, requests=100, draw=draw)

    found = capacity.search(straddling, dataclasses.replace(SETTINGS, confirmations=0))
    assert [p.rate for p in found.probes] == [0.5] * 4 and draws == [0, 1, 2, 3]
    assert found.capacity is None  # 368 of 400 pooled: (0.889, 0.943), still open at the lowest rate


def test_a_bracket_end_that_does_not_hold_when_measured_again_widens_the_interval():
    # 2.38 passes its first probe, then falls short on fresh engines: pooled, it fails, and becomes the
    # interval's upper end; its lower end moves to the next rate passed (2), measured again in turn.
    calls: dict[float, int] = {}

    def probe(rate: float, draw: int) -> Probe:
        calls[rate] = calls.get(rate, 0) + 1
        good = rate <= 2.0 or (rate < 2.5 and calls[rate] == 1)
        return Probe(rate, {}, None, met=100 if good else 50, requests=100, draw=draw)

    found = capacity.search(probe, SETTINGS)
    assert found.low == pytest.approx(2.0) and found.high == pytest.approx(math.sqrt(2.0 * math.sqrt(8.0)))
    assert calls[2.0] == 4 and calls[math.sqrt(8.0)] == 4


def test_the_search_stops_once_the_interval_is_within_the_tolerance():
    coarse = Settings(0.5, 8.0, max_probes=20, tolerance=0.5)
    found = capacity.search(_knee(2.5), coarse)
    assert found.high / found.low <= 1.5 and len({p.rate for p in found.probes}) < 20
    assert found.low <= 2.5 < found.high


def test_capacity_outside_the_rates_searched_is_a_bound_not_a_figure():
    below = capacity.search(_knee(0.1), SETTINGS)
    assert below.capacity is None and below.high == 0.5 and len(below.probes) == 4  # the failed end, confirmed
    assert below.text() == "below 0.5 req/s"
    above = capacity.search(_knee(100.0), SETTINGS)
    assert above.capacity == 8.0 and math.isinf(above.high) and len(above.probes) == 5
    assert above.text() == "at least 8 req/s"
    assert capacity.as_json("x", above)["interval_req_s"] == [8.0, None]


def test_the_search_times_itself():
    ticks = iter([10.0, 25.5])
    found = capacity.search(_knee(100.0), SETTINGS, clock=lambda: next(ticks))
    assert found.duration_s == pytest.approx(15.5)


def test_the_capacity_interval_covers_a_known_capacity():
    # A simulated server whose share of requests within the E2E target crosses 90% at a known rate, searched
    # with the default settings through probe_of and search; tests/benchmarks/serving_sim.py runs 200 searches.
    from benchmarks import serving_sim

    truth = serving_sim.true_capacity()
    found = [serving_sim.capacity_search(i) for i in range(4)]
    assert all(c.covers(truth) for c in found), [c.text() for c in found]
    assert all(c.high / c.low < 1.6 for c in found)


# --- a probe's SLO check ------------------------------------------------------------------------------


def _measurement(tpots_s: list[float], sent_every: float = 1.0) -> ServingMeasurement:
    """One warm-up request and one per TPOT, each of 5 tokens, sent ``sent_every`` seconds apart, first at 0."""
    requests = []
    for i, tpot in enumerate([0.01, *tpots_s]):
        sent = i * sent_every
        chunks = tuple(sent + 0.1 + j * tpot for j in range(5))
        requests.append(ServedRequest(sent, chunks, (1,) * 5, 0.0, tuple(range(5))))
    arrivals = tuple(i * sent_every for i in range(len(requests)))
    return ServingMeasurement(tuple(requests), (), warmup_requests=1, arrivals_s=arrivals)


def test_a_probe_passes_when_every_target_holds_at_the_percentile_and_the_engine_keeps_up():
    load = {"request_rate": 1.0, "burstiness": 1.0, "max_concurrency": None}
    fast = capacity.probe_of(_measurement([0.05] * 9 + [0.2]), load, {"tpot_ms": 100.0}, 90.0)
    # p90 over ten requests, one of them slow: numpy's interpolation gives 65 ms, under the target.
    assert fast.passed and fast.figures_ms["tpot_ms"] == pytest.approx(65.0)
    slow = capacity.probe_of(_measurement([0.05] * 8 + [0.2] * 2), load, {"tpot_ms": 100.0}, 90.0)
    assert not slow.passed and slow.failed == "TPOT p90 200.0 ms > 100 ms" and slow.saturated is None
    # Ten requests sent each second while the rate named was 1 req/s: fine. Completions far behind the
    # schedule fail the probe whatever the latencies.
    assert capacity.judge({"tpot_ms": 50.0}, {"tpot_ms": 100.0}, 90.0, saturated="completions behind") \
        == "saturated: completions behind"
    assert capacity.judge({"tpot_ms": None}, {"tpot_ms": 100.0}, 90.0) is None  # one-token requests: no TPOT


# --- settings and refusals ----------------------------------------------------------------------------


def test_the_slos_are_read_from_load_slo_and_named_in_the_verdicts_words():
    targets = capacity.slo_targets({"ttft_ms": None, "tpot_ms": 100, "e2e_ms": 2000})
    assert targets == {"tpot_ms": 100.0, "e2e_ms": 2000.0}
    assert capacity.slo_text(targets, 90) == "E2E p90 <= 2000 ms and TPOT p90 <= 100 ms"


@pytest.mark.parametrize("slo", [None, {}, {"ttft_ms": None, "tpot_ms": None, "e2e_ms": None}])
def test_a_search_without_an_slo_is_refused_naming_the_keys(slo):
    with pytest.raises(CapacityError, match="load.slo.ttft_ms, load.slo.tpot_ms or load.slo.e2e_ms"):
        capacity.slo_targets(slo)


def test_bad_capacity_settings_are_refused_naming_every_key():
    with pytest.raises(CapacityError) as refused:
        Settings.of({"min_rate": 4.0, "max_rate": 2.0, "max_probes": 1, "requests_per_probe": 1, "warmup": 2,
                     "percentile": 0, "tolerance": 0.1, "confirmations": -1})
    message = str(refused.value)
    for key in ("capacity.max_rate=2.0", "capacity.max_probes=1", "capacity.requests_per_probe=1",
                "capacity.percentile=0", "capacity.confirmations=-1"):
        assert key in message
    assert Settings.of({"min_rate": 0.5, "max_rate": 8, "max_probes": 6, "requests_per_probe": 100, "warmup": 4,
                        "percentile": 90, "tolerance": 0.1}) == SETTINGS
    # Probes no number of which, every request within the SLOs, could show the target: refused, with the least.
    with pytest.raises(CapacityError, match=r"capacity.requests_per_probe=8 is too few for capacity.percentile=90: "
                                            r".*; at least 9$"):
        Settings.of({"min_rate": 0.5, "max_rate": 8, "max_probes": 6, "requests_per_probe": 8, "warmup": 2,
                     "percentile": 90, "tolerance": 0.1})
    # A probe is requests_per_probe measured requests or min_probe_s seconds of the rate, whichever is more.
    assert SETTINGS.requests(0.5) == 4 + 100 and SETTINGS.requests(8.0) == 4 + 240


def test_the_command_refuses_a_search_without_an_slo_before_any_engine(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specbench.capacity", "method=ngram"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: a capacity search needs at least one SLO: set load.slo.ttft_ms, load.slo.tpot_ms or "
        "load.slo.e2e_ms (milliseconds), e.g. load.slo.tpot_ms=100")
    assert not (tmp_path / "outputs").exists()


def test_the_command_searches_the_baseline_and_each_configuration_once():
    from specbench.capacity import searches

    found, cfg = searches(["method=ngram", "num_speculative_tokens=2,4", "load.slo.tpot_ms=100",
                           "capacity.requests_per_probe=12", "capacity.min_probe_s=0"])
    assert [s.label for s in found] == ["baseline", "ngram K=2", "ngram K=4"]
    assert all(s.cell.is_serving and s.cell.identity["load"]["num_requests"] == 12 + 4 for s in found)
    assert found[1].cell.baseline().config_hash == found[0].cell.config_hash  # one baseline for both
    assert found[0].targets == {"tpot_ms": 100.0}
    # A preset's grid: its rates give way to the probes', and each workload is searched and named apart.
    found, _ = searches(["sweep=serving_cpu", "method=ngram", "load.slo.tpot_ms=100"])
    assert [s.label for s in found] == ["baseline · summarize", "baseline · creative", "ngram K=4 · summarize",
                                        "ngram K=4 · creative"]


def test_capacity_json_names_the_probes_load_shape_with_its_path():
    from specbench.capacity import _load_shape, searches

    found, _ = searches(["method=ngram", "load.slo.tpot_ms=100", "load.max_concurrency=4"])
    assert _load_shape(found[0].cell).text() == "c4"
    # Probes through vllm serve measure other latencies than in process: the file says which path it was.
    found, _ = searches(["method=ngram", "load.slo.tpot_ms=100", "load.max_concurrency=4", "load.via=server"])
    assert _load_shape(found[0].cell).text() == "c4, via server"


# --- the verdict ---------------------------------------------------------------------------------------


def test_the_verdict_says_raises_only_where_the_intervals_part():
    targets = {"tpot_ms": 100.0}
    base = capacity.Capacity(2.38, 2.38, 2.83)
    spec = capacity.Capacity(3.80, 3.80, 4.0)
    # The factor is the least the intervals allow, not the ratio of the two lower ends (1.60x).
    assert capacity.verdict("ngram K=4", base, spec, targets, 90) == \
        "ngram K=4 raises capacity at TPOT p90 <= 100 ms from 2.38 req/s [2.38, 2.83) to 3.8 req/s [3.8, 4) (at least 1.34x)"
    assert "lowers capacity" in capacity.verdict("eagle3 K=4", spec, base, targets, 90)
    close = capacity.Capacity(2.6, 2.6, 3.0)
    assert "where the baseline's is, as far as the intervals tell" in capacity.verdict("ngram K=2", base, close, targets, 90)
    none = capacity.Capacity(None, 0.0, 0.5)
    assert "from below 0.5 to 2.38 req/s [2.38, 2.83)" in capacity.verdict("ngram K=4", none, base, targets, 90)
    assert json.dumps(capacity.as_json("baseline", base))  # capacity.json is plain JSON


def test_the_table_names_what_the_failed_probes_missed():
    targets = {"tpot_ms": 100.0}
    probes = (Probe(0.5, {"tpot_ms": 40.0}, None), Probe(8.0, {"tpot_ms": 150.0}, "x", saturated="behind"),
              Probe(2.0, {"tpot_ms": 60.0}, "y", saturated="behind"))
    found = capacity.Capacity(0.5, 0.5, 2.0, probes, 12.0)
    assert found.limited_by(targets) == "TPOT, saturation"
    text = capacity.table([("baseline", found)], targets)
    assert text.splitlines()[1].split() == ["baseline", "0.5", "req/s", "[0.5,", "2)", "3", "12s",
                                            "TPOT,", "saturation"]


# --- the concurrency axis ----------------------------------------------------------------------------------

CONCURRENCY = Settings(min_rate=0.5, max_rate=8.0, max_probes=6, percentile=90.0, tolerance=0.1,
                       axis=capacity.CONCURRENCY, min_concurrency=1, max_concurrency=64)


def test_the_same_search_bisects_whole_concurrency_caps_and_measures_the_bracket_again():
    caps: list[float] = []
    renewed: list[int] = []
    found = capacity.search(_knee(12.5, caps), CONCURRENCY, renew=lambda: renewed.append(len(caps)))
    # 1 passes, 64 fails, then the rounded geometric midpoints: 8 passes, 23 and 14 fail, 11 passes; six caps
    # spent, the bracket's ends (11 and 14) measured three more times each on fresh engines.
    assert caps == [1, 64, 8, 23, 14, 11] + [11] * 3 + [14] * 3 and renewed == list(range(6, 12))
    assert (found.capacity, found.low, found.high) == (11, 11, 14) and found.axis is capacity.CONCURRENCY
    assert found.text() == "11 concurrent requests [11, 14)"
    # With probes to spare it stops where no whole cap lies between the ends.
    fine = capacity.search(_knee(12.5), dataclasses.replace(CONCURRENCY, max_probes=20, confirmations=0))
    assert (fine.low, fine.high) == (12, 13) and all(p.rate == int(p.rate) for p in fine.probes)
    assert capacity.CONCURRENCY.midpoint(12, 13) is None and capacity.CONCURRENCY.midpoint(12, 14) == 13
    assert CONCURRENCY.requests(64) == 4 + 100  # a closed loop: requests_per_probe, no seconds of a rate


def test_concurrency_capacity_is_worded_and_written_in_its_own_unit():
    targets = {"tpot_ms": 100.0}
    base = capacity.Capacity(8, 8, 11, (Probe(8, {}, None, met=100, requests=100),), axis=capacity.CONCURRENCY)
    spec = capacity.Capacity(16, 16, 19, axis=capacity.CONCURRENCY)
    assert capacity.verdict("ngram K=4", base, spec, targets, 90) == (
        "ngram K=4 raises capacity at TPOT p90 <= 100 ms from 8 concurrent requests [8, 11) to 16 concurrent "
        "requests [16, 19) (at least 1.45x)")
    none = capacity.Capacity(None, 0.0, 1, axis=capacity.CONCURRENCY)
    assert none.text() == "below 1 concurrent requests"
    assert "at 1 concurrent requests, the lowest concurrency searched" in capacity.verdict("x", none, none, targets, 90)
    written = capacity.as_json("baseline", base)
    assert written["axis"] == "concurrency" and written["capacity_concurrency"] == 8
    assert written["interval_concurrency"] == [8, 11] and written["probe_results"][0]["max_concurrency"] == 8
    assert capacity.as_json("baseline", capacity.Capacity(2.0, 2.0, 3.0))["interval_req_s"] == [2.0, 3.0]


def test_a_probe_reads_its_cap_from_the_load_key_the_axis_names():
    from benchmarks import serving_sim

    keys = {"request_rate": math.inf, "burstiness": 1.0, "max_concurrency": 4, "num_requests": 24,
            "warmup_requests": 4}
    measured = serving_sim.run_closed(serving_sim.unlimited(1.0), keys, 0)
    # The closed loop keeps four in flight: each measured request goes out as one completes.
    sends = sorted(r.sent_s for r in measured.requests[4:])
    assert sends[:4] == [sends[0]] * 4 and sends[4] == pytest.approx(sends[0] + 1.0)
    found = capacity.probe_of(measured, keys, {"e2e_ms": 1500.0}, 90.0, axis=capacity.CONCURRENCY)
    assert found.rate == 4 and found.met == found.requests == 20 and found.saturated is None


def test_the_concurrency_interval_covers_a_known_capacity():
    # A closed-loop server whose share of requests within the E2E target crosses 90% at 21.5 requests in flight,
    # searched along the concurrency axis with the default settings; tests/benchmarks/serving_sim.py runs 200.
    from benchmarks import serving_sim

    truth = serving_sim.true_concurrency()
    assert truth == 21
    found = [serving_sim.concurrency_search(i) for i in range(3)]
    assert all(c.covers(truth) for c in found), [c.text() for c in found]
    assert all(c.axis is capacity.CONCURRENCY and math.isfinite(c.high) for c in found)


def test_a_bad_axis_or_cap_is_refused_naming_the_key():
    base = {"min_rate": 0.5, "max_rate": 8, "max_probes": 6, "requests_per_probe": 100, "warmup": 4,
            "percentile": 90, "tolerance": 0.1}
    with pytest.raises(CapacityError, match=r"^capacity.axis='speed' must be rate or concurrency \(rate: the "
                                            r"offered request rate, an open loop; concurrency"):
        Settings.of(base | {"axis": "speed"})
    with pytest.raises(CapacityError, match=r"^capacity.min_concurrency=0 must be an integer >= 1"):
        Settings.of(base | {"axis": "concurrency", "min_concurrency": 0})
    with pytest.raises(CapacityError, match=r"^capacity.max_concurrency=4 must be an integer above "
                                            r"capacity.min_concurrency=4$"):
        Settings.of(base | {"axis": "concurrency", "min_concurrency": 4, "max_concurrency": 4})
    assert Settings.of(base | {"axis": "concurrency", "max_concurrency": 32}).span == (1.0, 32.0)


def test_the_command_searches_concurrency_as_a_closed_loop_and_refuses_a_bad_axis_in_one_line(capsys):
    from hydra.core.global_hydra import GlobalHydra

    from specbench.capacity import _load_shape, main, searches

    found, _ = searches(["method=ngram", "load.slo.tpot_ms=100", "capacity.axis=concurrency",
                         "capacity.max_concurrency=16"])
    load = found[0].cell.identity["load"]
    assert math.isinf(load["request_rate"]) and load["max_concurrency"] == 1 and load["num_requests"] == 104
    assert found[0].settings.span == (1.0, 16.0) and _load_shape(found[0].cell, capacity.CONCURRENCY).text() == ""
    for overrides, line in (
            (["capacity.axis=speed"], "error: capacity.axis='speed' must be rate or concurrency"),
            (["capacity.axis=concurrency", "capacity.max_concurrency=512"],
             "error: capacity.max_concurrency=512 exceeds engine.max_num_seqs=256"),
            (["load.request_rate=inf", "load.ramp_up_strategy=linear", "load.ramp_up_start_rps=1",
              "load.ramp_up_end_rps=4"], "error: load.ramp_up_strategy=linear in a capacity search")):
        GlobalHydra.instance().clear()
        capsys.readouterr()
        assert main(["method=ngram", "load.slo.tpot_ms=100", *overrides]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(line), err
