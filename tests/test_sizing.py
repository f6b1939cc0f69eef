"""Cells sized by the precision they need, the plan's wall time, and budget=: no engine anywhere."""

from __future__ import annotations

import functools
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from specbench.analytic import sizing, walltime
from specbench.config import cell_from_config
from specbench.plan import CellTiming, PlannedRow, make_plan, plan_time, speculative_engines, widest_half_width
from specbench.stats import intervals, spreads
from tests.test_cli_errors import assert_refused, command, sweep  # noqa: F401 (command is a fixture)

AWQ_4090 = ["model=qwen2.5-7b-instruct-awq", "hardware=rtx4090"]


@functools.lru_cache(maxsize=None)
def planned(*overrides: str) -> tuple[PlannedRow, ...]:
    """:func:`make_plan` of these overrides, priced once for the module: several tests read the same preset's
    plan (batch_decay's and k_sweep's on a 4090 took seconds each), and none changes it."""
    return tuple(make_plan(list(overrides)))


def precision(**given: float) -> sizing.Precision:
    return sizing.Precision.from_config({"precision": given})


# --------------------------------------------------------------------------- the sizing function


def test_prompts_needed_falls_as_the_target_widens_down_to_the_floor():
    p = precision(prompt_sd=0.2, engine_sd=0.03, min_prompts=8)
    needed = [sizing.prompts_needed(p, h, 3, 128) for h in (0.12, 0.13, 0.15, 0.2, 0.4, 0.9)]
    assert needed == sorted(needed, reverse=True) and needed[0] > needed[-1]
    assert needed[-1] == 8  # the floor
    # Each meets its target, and one prompt fewer would not (above the floor).
    for h, n in zip((0.12, 0.13, 0.15), needed):
        assert sizing.expected_half_width(p, n, 3) <= h < sizing.expected_half_width(p, n - 1, 3)


def test_a_target_the_engines_alone_miss_keeps_every_prompt():
    p = precision(prompt_sd=0.2, engine_sd=0.03)
    engines = sizing.engine_half_width(0.03, 3)
    assert sizing.prompts_needed(p, engines * 0.99, 3, 128) == 128
    assert sizing.prompts_needed(p, 0.5, 1, 64) == 64  # one engine run: no interval to size for


def test_a_cell_serves_whole_batches_at_least_one_at_most_the_list():
    assert [sizing.cell_prompts(b, 36, 128) for b in (1, 2, 4, 8, 16, 32, 64, 128)] == \
        [36, 36, 36, 40, 48, 64, 64, 128]
    assert sizing.cell_prompts(4, 36, 20) == 20


def test_the_engines_df_are_those_engine_run_spread_counts():
    # One speculative engine: every cell shares every deviation, R - 1; more engines: more df.
    assert sizing.engine_df(3, 1) == 2 and sizing.engine_df(2, 1) == 1
    assert sizing.engine_df(3, 2) > 2 and sizing.engine_df(3, 24) > sizing.engine_df(3, 2)


def test_at_two_engine_runs_the_plan_counts_the_baselines_one_df_as_the_merge_does():
    # The merge counts a run mean square on one df at its upper bound (spreads.run_term_bound): 24 speculative
    # engines over one baseline engine then leave about 1.3 df, not the 3.6 the observed mean squares would.
    assert sizing.engine_df(2, 24) == pytest.approx(1.293, abs=0.01)
    assert sizing.engine_df(3, 24) == pytest.approx(4 * 2 / ((1 + 1 / 24) ** 2 + (1 - 1 / 24) ** 2 / 23))


@pytest.mark.parametrize(("runs", "engines", "cells"), [(3, 1, 16), (3, 2, 16), (3, 12, 21), (3, 24, 3)])
def test_the_engines_half_width_is_what_the_merge_gives_on_average(runs, engines, cells):
    # Simulated through the merge's own statistics (engine_run_spread, speedup_interval): baseline and
    # speculative engines each deviate by engine_sd in every run, the cells by almost nothing.
    rng, sd, widths = random.Random(1), 0.03, []
    for _ in range(300):
        u = [rng.gauss(0, sd) for _ in range(runs)]
        ratios, spec, base = [], [], []
        for e in range(engines):
            v = [rng.gauss(0, sd) for _ in range(runs)]
            for _ in range(cells):
                ratios.append({r: math.exp(0.2 + u[r] - v[r] + rng.gauss(0, 0.002)) for r in range(runs)})
                spec.append(e)
                base.append("baseline")
        interval = intervals.speedup_interval(list(ratios[0].values()), spreads.engine_run_spread(ratios, spec, base),
                                              None)
        widths.append(math.log(interval.ci_high / interval.point))
    predicted = sizing.engine_half_width(sd, runs, engines)
    assert statistics.mean(widths) == pytest.approx(predicted, rel=0.15)


def test_sized_sets_the_prompts_per_batch_size_from_the_first_of_the_list():
    plain = {"batch_size": 1, "engine_runs": 3, "precision": {"half_width": 0.10, "speculative_engines": 2},
             "workload": {"num_prompts": 128, "selection": "random"}, "load": {"request_rate": None}}
    one = sizing.sized(plain)
    assert one["workload"] == {"num_prompts": 36, "selection": "first"}
    assert sizing.sized(dict(plain, batch_size=128))["workload"]["num_prompts"] == 128
    assert sizing.sized(dict(plain, precision={"half_width": None}))["workload"]["num_prompts"] == 128
    # A stored row's config (already sized) sizes to itself, so a resume rebuilds the same cell.
    for batch in (1, 8, 32, 128):
        once = sizing.sized(dict(plain, batch_size=batch))
        assert sizing.sized(once) == once
    serving = dict(plain, load={"request_rate": 4.0})
    assert sizing.sized(serving)["workload"]["num_prompts"] == 128  # a serving cell's size is its requests


@pytest.mark.parametrize(("key", "value", "says"), [
    ("precision.half_width", 1.5, "precision.half_width=1.5 must be null or a number in (0, 1)"),
    ("precision.min_prompts", 0, "precision.min_prompts=0 must be an integer >= 1"),
    ("budget", -5, "budget=-5 must be null or minutes > 0"),
])
def test_bad_precision_and_budget_values_are_named(key, value, says):
    plain: dict = {"precision": {}}
    if key == "budget":
        plain["budget"] = value
    else:
        plain["precision"][key.split(".")[1]] = value
    assert says in " ".join(sizing.problems(plain))


def test_a_sized_cell_and_its_baseline_serve_the_same_prefix():
    GlobalHydra.instance().clear()
    with initialize_config_module("specbench.conf", version_base="1.3"):
        def cell(*overrides: str):
            return cell_from_config(compose("config", overrides=["sweep=batch_decay", *AWQ_4090, *overrides]))

        small, base = cell("batch_size=1", "method=ngram"), cell("batch_size=1", "method=baseline")
        large = cell("batch_size=128", "method=ngram")
    GlobalHydra.instance().clear()
    assert small.workload["num_prompts"] == base.workload["num_prompts"] == 36
    assert small.workload["selection"] == large.workload["selection"] == "first"
    assert large.workload["num_prompts"] == 128
    assert small.config_hash != large.config_hash


# --------------------------------------------------------------------------- the wall time


def test_an_engine_start_prices_weights_and_graphs():
    bare = walltime.engine_start_s(gpu=True, weight_bytes=0)
    assert walltime.engine_start_s(gpu=True, weight_bytes=6e9) - bare == pytest.approx(6e9 / walltime.WEIGHT_LOAD_BYTES_PER_S)
    assert walltime.engine_start_s(gpu=True, weight_bytes=0, models=2, capture_sizes=67, model_runner="V1") - bare == \
        pytest.approx(2 * (67 + 2) * walltime.CAPTURE_S_PER_SIZE)
    assert walltime.engine_start_s(gpu=False, weight_bytes=1e9, cpu_kv_gib=2) == \
        walltime.CPU_START_FIXED_S + 2 * walltime.CPU_KV_S_PER_GIB


def test_an_engine_start_counts_the_graphs_vllm_captures_while_it_profiles_their_memory():
    bare = walltime.engine_start_s(gpu=True, weight_bytes=0)
    # V2's profiling captures every PIECEWISE size (and the speculator's graphs), then the real capture runs:
    # the list twice. Before: 67 x 0.25 s, one capture.
    assert walltime.engine_start_s(gpu=True, weight_bytes=0, capture_sizes=67) - bare == \
        pytest.approx(2 * 67 * walltime.CAPTURE_S_PER_SIZE)
    # V1's profiling captures two sizes per mode and extrapolates the rest.
    assert walltime.captured_sizes(67, "V1") == 69 and walltime.captured_sizes(1, "V1") == 2
    assert walltime.captured_sizes(67, "V2") == 134
    # An eager engine captures nothing, and the CPU build has no graphs to profile.
    assert walltime.captured_sizes(0, "V2") == 0 and walltime.engine_start_s(gpu=True, weight_bytes=0) == \
        walltime.GPU_START_FIXED_S
    with pytest.raises(ValueError, match="model_runner must be V1 or V2, got 'V3'"):
        walltime.captured_sizes(4, "V3")


def test_the_plan_prices_each_engines_start_for_the_model_runner_it_gets():
    # k_sweep on a 4090: the 0.5B draft model (another vocabulary) runs V1, EAGLE-3 and ngram V2.
    rows = [r for r in planned("sweep=k_sweep", *AWQ_4090) if r.timing is not None and r.estimate is not None]
    assert {r.model_runner for r in rows} == {"V1", "V2"}
    for row in rows:
        estimate = row.estimate
        assert row.timing.start_s == pytest.approx(walltime.engine_start_s(
            gpu=True, weight_bytes=estimate.target_weight_bytes + estimate.drafter_weight_bytes,
            models=2 if estimate.drafter_weight_bytes else 1, capture_sizes=len(estimate.capture_sizes),
            model_runner=row.model_runner))


def test_the_wall_time_speeds_up_only_decode_steps_and_on_a_cpu_none():
    # A GPU prices a speculative cell's decode steps at the predicted speedup, its prefill as plain decoding's;
    # the CPU build's speculative cells are priced as plain decoding (the demo's took 0.8-1.1 of their baselines').
    for hardware, gpu in (("h200", True), ("cpu-amd-epyc-2-cores", False)):
        rows = make_plan(["sweep=cpu_demo", f"hardware={hardware}"])
        base = {r.label.split(" ", 2)[2]: r for r in rows if r.label.startswith("baseline")}
        speculative = [r for r in rows if not r.label.startswith("baseline")]
        assert len(speculative) == 8 and len(base) == 4
        for row in speculative:
            plain = base[row.label.split(" ", 2)[2]].timing.cost.batch_s
            if gpu:
                assert row.predicted_decode_speedup > 1.0
                assert plain / row.predicted_decode_speedup < row.timing.cost.batch_s < plain
            else:
                assert row.timing.cost.batch_s == pytest.approx(plain)


def test_a_cells_time_follows_its_batches():
    cost = walltime.CellCost(batch_size=4, batch_s=2.0, warmup_s=0.5, repetitions=2, engine_runs=3,
                             prompts=lambda h: 36 if h is None else 8)
    assert cost.seconds() == 3 * (0.5 + 2 * 9 * 2.0)
    assert cost.seconds(0.5) == 3 * (0.5 + 2 * 2 * 2.0)


def test_the_budget_keeps_widens_or_refuses():
    cells = [walltime.CellCost(1, 10.0, 0.0, 1, 1, prompts=lambda h: 40 if h is None or h < 0.2 else 8)]
    starts = [60.0]
    assert walltime.fit_budget(cells, starts, 1000.0, 0.1).half_width is None  # 460 s: as configured
    fit = walltime.fit_budget(cells, starts, 200.0, 0.1)  # 140 s once sized for >= 0.2
    assert fit.fits and fit.half_width is not None and fit.half_width >= 0.2 and fit.time.total_s <= 200
    assert not walltime.fit_budget(cells, starts, 100.0, 0.1).fits


@pytest.mark.parametrize(("preset", "hours"), [("batch_decay", 1), ("k_sweep", 1), ("full_grid", 4)])
def test_the_gpu_presets_answer_on_a_4090_within_the_hour_or_four(preset, hours):
    rows = planned(f"sweep={preset}", *AWQ_4090)
    time = plan_time(rows)
    assert time is not None and time.total_s < hours * 3600
    timings = [r.timing for r in rows]
    assert all(isinstance(t, CellTiming) for t in timings)
    # Engine starts are priced: each engine once per engine run, graphs and weights included.
    engines = {t.engine for t in timings}
    runs = max(t.cost.engine_runs for t in timings)
    assert time.starts == len(engines) * runs and time.start_s > time.starts * walltime.GPU_START_FIXED_S
    # The precision is stated, and met: every cell's expected half-width is within its target.
    width, _, _ = widest_half_width(rows)
    assert width <= timings[0].precision.half_width
    # The engines' df are priced for the grid's own count of speculative engines per baseline engine.
    assert speculative_engines(rows) == timings[0].precision.speculative_engines
    # Small batches serve fewer prompts than the largest batch's list.
    by_batch = {t.cost.batch_size: t.cost.prompts(None) for t in timings}
    assert by_batch[min(by_batch)] <= by_batch[max(by_batch)]


def test_batch_one_no_longer_serves_the_largest_batchs_prompts():
    rows = planned("sweep=batch_decay", *AWQ_4090)
    prompts = {t.cost.batch_size: t.cost.prompts(None) for t in (r.timing for r in rows) if t is not None}
    assert prompts[1] < prompts[128] == 128


def test_the_plan_prints_the_wall_time_and_the_precision(capsys):
    from specbench.plan import main

    assert main(["sweep=batch_decay", *AWQ_4090]) == 0
    out = capsys.readouterr().out
    assert "estimated wall time:" in out and "engine start(s)" in out and "CUDA-graph capture" in out
    assert "cells sized for +-10% (precision.half_width)" in out


# --------------------------------------------------------------------------- budget= on the command line


def test_plan_sizes_a_sweep_to_its_budget(capsys):
    from specbench.plan import main

    assert main(["sweep=batch_decay", *AWQ_4090, "budget=40"]) == 0
    out = capsys.readouterr().out
    assert "budget=40: cells sized for" in out
    line = next(l for l in out.splitlines() if l.startswith("estimated wall time:"))
    assert int(line.split()[3]) <= 40


@pytest.mark.parametrize("module", ["specbench", "specbench.plan"])
def test_a_budget_too_small_is_refused_in_one_line_before_any_engine(command, tmp_path: Path, module: str):
    # Two of batch_decay's eight batch sizes: still far past 5 minutes (each engine starts once per engine run,
    # graphs and weights), and the sweeper composes each point in full (the whole preset took 13 s of this test).
    overrides = ["sweep=batch_decay", *AWQ_4090, "batch_size=1,128", "budget=5"]
    args = sweep(*overrides, multirun=True, out=tmp_path) if module == "specbench" else ["-m", module, *overrides]
    result = command(args)
    assert result.returncode == 2
    assert_refused(result, "budget=5: the sweep takes at least", "would fit")
    refusal = [line for line in result.output.splitlines() if "budget=5" in line]
    assert len(refusal) == 1
    assert not (tmp_path / "sweep").exists()  # nothing planned, no engine


def test_a_single_runs_budget_too_small_is_refused_in_one_line_before_any_engine(command, tmp_path: Path):
    # One cell and its baseline, three engine runs on a 2-core CPU: more than a minute, whatever the sizing.
    result = command(sweep("method=ngram", "hardware=cpu-amd-epyc-2-cores", "budget=0.5", multirun=False,
                           out=tmp_path))
    assert result.returncode == 2
    assert_refused(result, "budget=0.5: the sweep takes at least", "would fit")
    assert len([line for line in result.output.splitlines() if "budget=0.5" in line]) == 1
    assert not (tmp_path / "run" / "plan.json").exists() and not (tmp_path / "run" / "cells").exists()


def test_a_single_run_is_sized_to_its_budget_as_a_sweeps_cell_is(capsys):
    from specbench.__main__ import sized_to_budget
    from specbench.plan import within_budget

    overrides = ["method=ngram", "batch_size=1", "sweep=batch_decay", *AWQ_4090, "budget=6"]  # 8 min as configured
    GlobalHydra.instance().clear()
    with initialize_config_module("specbench.conf", version_base="1.3"):
        def composed(point):
            return compose("config", overrides=list(point))

        unsized = cell_from_config(composed(overrides))
        cfg = sized_to_budget(composed(overrides), overrides)
        half_width = cfg.precision.half_width
        sized = cell_from_config(cfg)
        as_typed = cell_from_config(composed([*overrides, f"precision.half_width={half_width}"]))
        # Sized so, the run fits its budget as it stands.
        again, note = within_budget([(*overrides, f"precision.half_width={half_width}")], composed)
    GlobalHydra.instance().clear()
    assert half_width > 0.1 and again == [] and "fits as configured" in note
    assert f"budget=6: cells sized for +-{half_width:.1%}" in capsys.readouterr().out
    # The cell serves the prompts the half-width gives, the one a user typing it would get.
    assert sized.config_hash == as_typed.config_hash
    assert sized.workload["num_prompts"] < unsized.workload["num_prompts"]


# --------------------------------------------------------------------------- confirm=true in the estimate


def test_the_estimate_and_the_budget_price_the_confirmation_of_confirm_true():
    # The demo grid on 2 CPU cores: per workload the verdict's configuration (one of the speculative cells at
    # batch 1) and its baseline are measured again, once per engine run, on fresh engines.
    grid = ["sweep=cpu_demo", "hardware=cpu-amd-epyc-2-cores"]
    rows, confirming = make_plan(grid), make_plan([*grid, "confirm=true"])
    alone, with_confirmation = plan_time(rows), plan_time(confirming)
    batch1 = [r for r in rows if " b=1 " in r.label]
    added = 0.0
    for workload in ("summarize", "creative"):
        here = [r.timing for r in batch1 if r.label.endswith(workload)]
        baseline = next(t for t in here if not t.speculative)
        added += max(t.cost.seconds() for t in here if t.speculative) + baseline.cost.seconds()
    runs = baseline.cost.engine_runs
    # Per workload, the costliest candidate and the baseline, each in both engine runs.
    assert with_confirmation.generation_s == pytest.approx(alone.generation_s + added)
    assert with_confirmation.overhead_s == pytest.approx(alone.overhead_s + 4 * runs * walltime.CELL_OVERHEAD_S)
    # Fresh engines in each engine run: the baselines' one, and at least one speculative engine.
    assert with_confirmation.starts >= alone.starts + 2 * runs
    assert with_confirmation.start_s >= alone.start_s + runs * (baseline.start_s + min(
        r.timing.start_s for r in batch1 if r.timing.speculative))
    # A budget the grid alone fits, but not with its confirmation: sized (or refused), not "fits as configured".
    minutes = math.ceil(alone.total_s / 60)
    assert with_confirmation.total_s > minutes * 60
    from specbench.config import ConfigError
    from specbench.plan import budget_overrides, format_plan

    assert budget_overrides([replace(r, budget=minutes) for r in rows])[0] == []
    try:
        extra, _ = budget_overrides([replace(r, budget=minutes) for r in confirming])
    except ConfigError as exc:
        assert f"budget={minutes}: the sweep takes at least" in str(exc)
    else:
        assert extra and extra[0].startswith("precision.half_width=")
    # The plan says so.
    assert f"confirm=true: 4 cells measured again after the grid on fresh engines, {runs} engine run(s) each" in \
        format_plan(confirming, 0.7)
