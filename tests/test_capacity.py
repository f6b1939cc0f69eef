"""Capacity search without an engine: the bisection, the SLO check of a probe, refusals, the verdict."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from specbench.analytic import capacity
from specbench.analytic.capacity import CapacityError, Probe, Settings
from specbench.load import ServedRequest, ServingMeasurement

SETTINGS = Settings(min_rate=0.5, max_rate=8.0, max_probes=6, percentile=90.0, tolerance=0.1)


def _knee(at: float, rates: list[float] | None = None):
    """A probe function whose configuration meets its SLOs up to ``at`` req/s (recording the rates probed)."""
    def probe(rate: float) -> Probe:
        if rates is not None:
            rates.append(rate)
        return Probe(rate, {"tpot_ms": 50.0 if rate <= at else 150.0}, None if rate <= at else "TPOT too slow")
    return probe


def test_bisection_probes_the_ends_then_geometric_midpoints_and_names_the_highest_rate_passed():
    rates: list[float] = []
    found = capacity.search(_knee(2.5, rates), SETTINGS)
    # 0.5 passes, 8 fails, then sqrt(low * high): 2 passes, 4 fails, 2.83 fails, 2.38 passes.
    assert rates == pytest.approx([0.5, 8.0, 2.0, 4.0, math.sqrt(8.0), math.sqrt(2.0 * math.sqrt(8.0))])
    assert found.capacity == pytest.approx(2.378, abs=1e-3) and found.capacity <= 2.5
    assert (found.low, found.high) == pytest.approx((2.378, math.sqrt(8.0)), abs=1e-3)
    assert len(found.probes) == SETTINGS.max_probes
    assert all(p.passed == (p.rate <= 2.5) for p in found.probes)


def test_the_search_stops_once_the_interval_is_within_the_tolerance():
    coarse = Settings(0.5, 8.0, max_probes=20, tolerance=0.5)
    found = capacity.search(_knee(2.5), coarse)
    assert found.high / found.low <= 1.5 and len(found.probes) < 20
    assert found.low <= 2.5 < found.high


def test_capacity_outside_the_rates_searched_is_a_bound_not_a_figure():
    below = capacity.search(_knee(0.1), SETTINGS)
    assert below.capacity is None and below.high == 0.5 and len(below.probes) == 1
    assert below.text() == "below 0.5 req/s"
    above = capacity.search(_knee(100.0), SETTINGS)
    assert above.capacity == 8.0 and math.isinf(above.high) and len(above.probes) == 2
    assert above.text() == "at least 8 req/s"
    assert capacity.as_json("x", above)["interval_req_s"] == [8.0, None]


def test_the_search_times_itself():
    ticks = iter([10.0, 25.5])
    found = capacity.search(_knee(100.0), SETTINGS, clock=lambda: next(ticks))
    assert found.duration_s == pytest.approx(15.5)


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
        Settings.of({"min_rate": 4.0, "max_rate": 2.0, "max_probes": 1, "requests_per_probe": 3, "warmup": 2,
                     "percentile": 0, "tolerance": 0.1})
    message = str(refused.value)
    for key in ("capacity.max_rate=2.0", "capacity.max_probes=1", "capacity.requests_per_probe=3",
                "capacity.percentile=0"):
        assert key in message
    assert Settings.of({"min_rate": 0.5, "max_rate": 8, "max_probes": 6, "requests_per_probe": 16, "warmup": 2,
                        "percentile": 90, "tolerance": 0.1}) == SETTINGS


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
                           "capacity.requests_per_probe=8"])
    assert [s.label for s in found] == ["baseline", "ngram K=2", "ngram K=4"]
    assert all(s.cell.is_serving and s.cell.identity["load"]["num_requests"] == 8 for s in found)
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
    assert capacity.verdict("ngram K=4", base, spec, targets, 90) == \
        "ngram K=4 raises capacity at TPOT p90 <= 100 ms from 2.38 to 3.8 req/s (1.60x)"
    assert "lowers capacity" in capacity.verdict("eagle3 K=4", spec, base, targets, 90)
    close = capacity.Capacity(2.6, 2.6, 3.0)
    assert "within the search's resolution" in capacity.verdict("ngram K=2", base, close, targets, 90)
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
