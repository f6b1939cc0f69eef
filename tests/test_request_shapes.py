"""Request shapes as ``vllm bench serve`` offers them: per-request output and input lengths, and a ramp-up.

Each schedule is checked against vLLM 0.32's own code where it is pure (``get_sampling_params``'s draws,
``_get_current_request_rate``), seeded and reproducible, and each key is refused up front in one line.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import numpy as np
import pytest

from specbench import load
from specbench.config import cell_from_config, validate


class _NoSpecialTokens:
    """The two things vLLM's get_sampling_params asks of a tokenizer: no special tokens, some vocabulary."""

    vocab_size = 1000

    def num_special_tokens_to_add(self) -> int:
        return 0


@pytest.mark.parametrize("length, ratio", [(128, 0.0), (128, 0.5), (37, 0.25), (5, 0.5)])
def test_lengths_are_drawn_as_vllm_draws_them(length, ratio):
    from vllm.benchmarks.datasets.utils import get_sampling_params

    # vLLM draws the input lengths first from the generator it is handed: with the same seed and the same
    # length and ratio, the same integers in the same order.
    theirs, _, _ = get_sampling_params(np.random.default_rng(11), 200, ratio, length, length, _NoSpecialTokens())
    ours = load.drawn_lengths(length, ratio, 200, 11)
    assert list(ours) == [int(n) for n in theirs]
    low, high = load.length_range(length, ratio)
    assert low == max(1, math.floor(length * (1 - ratio))) and high == math.ceil(length * (1 + ratio))
    assert all(low <= n <= high for n in ours)
    # The lower end is at least 1, as vLLM keeps an output length's (a prompt needs a token as well).
    assert load.length_range(5, 0.9) == (1, 10)
    assert ours == load.drawn_lengths(length, ratio, 200, 11)  # seeded: reproducible
    if ratio:
        assert ours != load.drawn_lengths(length, ratio, 200, 12)
        assert statistics.fmean(ours) == pytest.approx(length, rel=0.1)
    else:
        assert set(ours) == {length}


@pytest.mark.parametrize("strategy", ["linear", "exponential"])
def test_the_ramp_up_climbs_as_vllm_bench_serves_does(strategy):
    from vllm.benchmarks.serve import _get_current_request_rate

    rates = load.ramp_up_rates(strategy, 1.0, 8.0, 9)
    assert rates == pytest.approx([_get_current_request_rate(strategy, 1, 8, i, 9, math.inf) for i in range(9)])
    assert rates[0] == 1.0 and rates[-1] == pytest.approx(8.0)
    # Even gaps: each request one gap of its own rate after the one before; not stretched to N / rate.
    even = load.ramp_up_arrival_times(strategy, 1.0, 8.0, math.inf, 9, 0)
    assert even == pytest.approx(list(np.cumsum([1.0 / r for r in rates])))
    # Poisson gaps: seeded, and the gaps shrink as the rate climbs (the last quarter's mean gap is far below
    # the first quarter's).
    times = load.ramp_up_arrival_times(strategy, 1.0, 8.0, 1.0, 4000, 3)
    assert times == load.ramp_up_arrival_times(strategy, 1.0, 8.0, 1.0, 4000, 3)
    assert times != load.ramp_up_arrival_times(strategy, 1.0, 8.0, 1.0, 4000, 4)
    gaps = np.diff([0.0, *times])
    assert gaps[:1000].mean() > 2.5 * gaps[-1000:].mean()
    if strategy == "linear":
        # Gaps of mean 1 / rate_i, summed: the schedule's length is the sum of the reciprocal rates.
        assert times[-1] == pytest.approx(sum(1.0 / r for r in load.ramp_up_rates(strategy, 1.0, 8.0, 4000)), rel=0.08)


def test_fitted_prompts_cut_real_text_to_the_drawn_length_selecting_one_long_enough():
    prompts = [(1, 2, 3, 4, 5), (6, 7), (8, 9, 10, 11)]
    fitted = load.fitted_prompts(prompts, [3, 4, 2, 9])
    # Its own prompt cut to length; one too short gives way to the next long enough; none long enough: the
    # longest whole.
    assert fitted == ((1, 2, 3), (8, 9, 10, 11), (8, 9), (1, 2, 3, 4, 5))


def test_a_plan_takes_its_shapes_from_the_load_keys_seeded_by_the_cell_and_engine_run(compose_cell):
    cell = cell_from_config(compose_cell(["load.request_rate=2", "load.num_requests=40", "load.output_len=24",
                                          "load.input_len=12", "load.range_ratio=0.5", "engine_runs=2"]))
    prompts = [tuple(range(100 + 30 * i, 130 + 30 * i)) for i in range(4)]

    def plan(c):
        return load.serving_plan(c.identity["load"], prompts, 128, c.identity["seed"], c.engine_run)

    first = plan(cell)
    assert len(first.output_lens) == 40 and all(12 <= n <= 36 for n in first.output_lens)
    assert len(set(first.output_lens)) > 5
    assert [first.max_tokens_of(i) for i in range(40)] == list(first.output_lens)
    # Each prompt its own real text, cut to a drawn length in [6, 18].
    assert all(6 <= len(p) <= 18 and p == prompts[i % 4][:len(p)] for i, p in enumerate(first.prompts))
    assert len({len(p) for p in first.prompts}) > 5
    # The baseline draws the same shapes; another engine run others; the fingerprint holds them.
    assert plan(cell.baseline()) == first
    second = plan(cell.in_engine_run(1))
    assert second.output_lens != first.output_lens and second.prompts != first.prompts
    plain = load.serving_plan(dict(cell.identity["load"], output_len=None, input_len=None, range_ratio=0.0),
                              prompts, 128, cell.identity["seed"], 0)
    assert plain.output_lens == () and plain.max_tokens_of(3) == 128 and plain.prompts[0] == prompts[0]
    assert plain.fingerprint != first.fingerprint
    assert plain.arrivals_s == first.arrivals_s  # the lengths draw apart from the arrivals
    assert plain.fingerprint == load.ServingPlan(plain.prompts, plain.arrivals_s, 128, None, 2).fingerprint


def test_a_ramp_up_replaces_the_schedule_of_the_measured_requests(compose_cell):
    cell = cell_from_config(compose_cell(["load.request_rate=inf", "load.num_requests=10",
                                          "load.ramp_up_strategy=linear", "load.ramp_up_start_rps=1",
                                          "load.ramp_up_end_rps=4", "load.burstiness=inf"]))
    plan = load.serving_plan(cell.identity["load"], [(1, 2)], 8, cell.identity["seed"], 0)
    # The warm-up stays a burst; the eight measured requests climb from 1 to 4 req/s.
    assert plan.arrivals_s[:2] == (0.0, 0.0)
    assert list(plan.arrivals_s[2:]) == pytest.approx(list(np.cumsum([1.0 / r for r in
                                                                       load.ramp_up_rates("linear", 1, 4, 8)])))


def test_shapes_join_the_identity_and_id_only_where_set(compose_cell):
    plain = cell_from_config(compose_cell(["load.request_rate=2"]))
    assert set(plain.identity["load"]) == {"request_rate", "burstiness", "max_concurrency", "num_requests",
                                           "warmup_requests", "ignore_eos", "slo"}
    shaped = cell_from_config(compose_cell(["load.request_rate=2", "load.output_len=64", "load.range_ratio=0.5"]))
    assert shaped.identity["load"]["output_len"] == 64 and shaped.identity["load"]["range_ratio"] == 0.5
    assert "-rate2-out64-rr0.5-" in shaped.cell_id and shaped.config_hash != plain.config_hash
    assert shaped.baseline().identity["load"] == shaped.identity["load"]
    ramp = cell_from_config(compose_cell(["load.request_rate=inf", "load.ramp_up_strategy=linear",
                                          "load.ramp_up_start_rps=1", "load.ramp_up_end_rps=8"]))
    assert "-rateinf-ramplinear1to8-" in ramp.cell_id
    all_at_once = cell_from_config(compose_cell(["load.request_rate=inf"]))
    assert ramp.config_hash != all_at_once.config_hash
    # The row's config_json is the cell's config: the keys are recorded there whether set or not.
    assert ramp.config["load"]["ramp_up_end_rps"] == 8 and shaped.config["load"]["output_len"] == 64


@pytest.mark.parametrize("overrides, message", [
    (["load.output_len=0"], "load.output_len=0 must be null or an integer >= 1 (tokens)"),
    (["load.input_len=-3"], "load.input_len=-3 must be null or an integer >= 1 (tokens)"),
    (["load.output_len=100", "load.range_ratio=0.5"],
     "load.output_len=100 with load.range_ratio=0.5 draws up to 150 tokens, above workload.max_tokens=128: "
     "lower it or raise workload.max_tokens"),
    (["load.input_len=2000"], "load.input_len=2000 with load.range_ratio=0 draws up to 2000 tokens, above "
                              "workload.max_prompt_tokens=1536"),
    (["load.output_len=32", "load.range_ratio=1"],
     "load.range_ratio=1.0 must be in [0, 1): lengths are drawn uniformly from [L x (1 - r), L x (1 + r)] "
     "(vllm bench serve's --random-range-ratio)"),
    (["load.range_ratio=0.5"], "load.range_ratio=0.5 spreads no length: set load.output_len or load.input_len"),
    (["load.ramp_up_strategy=sudden"], "load.ramp_up_strategy='sudden' must be null, linear or exponential"),
    (["load.ramp_up_start_rps=1"], "load.ramp_up_start_rps=1.0 needs load.ramp_up_strategy (linear or exponential)"),
    (["load.request_rate=inf", "load.ramp_up_strategy=linear", "load.ramp_up_start_rps=0",
      "load.ramp_up_end_rps=4"], "load.ramp_up_start_rps=0.0 must be a finite rate > 0"),
    (["load.request_rate=inf", "load.ramp_up_strategy=linear", "load.ramp_up_start_rps=4",
      "load.ramp_up_end_rps=2"], "load.ramp_up_end_rps=2.0 must be a finite rate >= load.ramp_up_start_rps=4"),
    (["load.request_rate=2", "load.ramp_up_strategy=linear", "load.ramp_up_start_rps=1", "load.ramp_up_end_rps=4"],
     "load.request_rate=2.0 with load.ramp_up_strategy=linear: the ramp sets the rate; set load.request_rate=inf"),
    (["load.request_rate=inf", "load.max_concurrency=4", "load.ramp_up_strategy=exponential",
      "load.ramp_up_start_rps=1", "load.ramp_up_end_rps=4"],
     "load.max_concurrency=4 with load.ramp_up_strategy=exponential: a cap at load.request_rate=inf is a closed "
     "loop; leave load.max_concurrency null"),
])
def test_bad_shapes_are_refused_in_one_line_naming_the_key(compose_cell, overrides, message):
    errors = validate(compose_cell(overrides))
    assert [e for e in errors if message in e], errors


def test_good_shapes_pass_and_the_sweep_refuses_a_bad_one_before_any_engine(compose_cell, tmp_path):
    assert validate(compose_cell(["load.request_rate=2", "load.output_len=64", "load.input_len=256",
                                  "load.range_ratio=0.5"])) == []
    assert validate(compose_cell(["load.request_rate=inf", "load.ramp_up_strategy=exponential",
                                  "load.ramp_up_start_rps=0.5", "load.ramp_up_end_rps=8"])) == []
    done = subprocess.run([sys.executable, "-m", "specbench", "load.request_rate=2", "load.output_len=0",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "load.output_len=0 must be null or an integer >= 1 (tokens)" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "run" / "cells").exists()


# --- output lengths from the dataset -------------------------------------------------------------------------


def _jsonl_workload(tmp_path, records) -> dict:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return {"name": "mine", "source": "jsonl", "path": str(path), "num_prompts": len(records), "seed": 0,
            "max_tokens": 16, "max_prompt_tokens": 4096, "chat_template": False}


def test_a_jsonl_record_names_its_own_output_length_as_vllms_custom_dataset_does(tmp_path):
    from specbench.workloads import Workload, WorkloadError, load_prompts

    prompts, _ = load_prompts(_jsonl_workload(tmp_path, [{"prompt": "a", "output_tokens": 5},
                                                         {"prompt": "b"}, {"prompt": "c", "output_tokens": 40}]))
    assert [p.output_tokens for p in prompts] == [5, None, 40]
    workload = Workload("mine", "jsonl", tuple(prompts), ((1,), (2,), (3,)), 0, "")
    assert workload.output_tokens == (5, None, 40)
    with pytest.raises(WorkloadError, match=r"prompts.jsonl:2: field 'output_tokens' must be an integer >= 1 "
                                            r"\(the request's output length\), got 'many'"):
        load_prompts(_jsonl_workload(tmp_path, [{"prompt": "a"}, {"prompt": "b", "output_tokens": "many"}]))


def test_output_len_dataset_sends_each_records_length_capped_at_max_tokens(compose_cell, tmp_path):
    cfg = _jsonl_workload(tmp_path, [{"prompt": "a"}])
    overrides = ["workload.source=jsonl", f"workload.path={cfg['path']}", "load.request_rate=2",
                 "load.num_requests=7", "load.output_len=dataset"]
    cell = cell_from_config(compose_cell(overrides))
    assert "-outdataset-" in cell.cell_id and cell.identity["load"]["output_len"] == "dataset"
    plan = load.serving_plan(cell.identity["load"], [(1,), (2,), (3,)], 16, cell.identity["seed"], 0, (5, None, 40))
    # Cycled with the prompts; a record without one takes workload.max_tokens, one above it is capped there.
    assert plan.output_lens == (5, 16, 16, 5, 16, 16, 5)
    assert validate(compose_cell(["load.request_rate=2", "load.output_len=dataset"])) == [
        "load.output_len=dataset reads each record's output_tokens field (as vllm bench serve's custom dataset), "
        "which only a jsonl workload has; workload.source=builtin"]
    assert validate(compose_cell(["load.request_rate=2", "load.output_len=many"])) == [
        "load.output_len='many' must be null or an integer >= 1 (tokens) or dataset (each record's output_tokens)"]
