"""The best-K-per-batch-size recommendation, from result rows to a vLLM schedule and a check command."""

from __future__ import annotations

import json
import math

import pytest
from rows import make_row

from specbench.analytic import recommend
from specbench.results.files import write_results


def _row(k, batch, speedup, schedule=None, workload="summarize", sweep=None, interval=(None, None)):
    """A merged ngram row (rows.make_row) with its vLLM config and a point estimate only (or ``interval``)."""
    speculative = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2}
    method = {"name": "ngram", "speculative_config": speculative}
    if schedule:
        speculative["num_speculative_tokens_per_batch_size"] = schedule
        method["k_schedule"] = schedule
    cfg = {"model": {"name": "smollm2-135m"}, "method": method,
           "workload": {"name": workload, "num_prompts": 32, "max_tokens": 32, "max_prompt_tokens": 512},
           "repetitions": 1, "engine_runs": 2, "engine": {"dtype": "float32", "max_model_len": 2048},
           "sweep_name": sweep}
    return make_row("ngram", k, batch, workload, speedup, repetitions=1, cell_id=f"ngram-k{k}-b{batch}",
                    config_json=json.dumps(cfg), speedup_ci_low=interval[0], speedup_ci_high=interval[1])


GRID = {  # batch -> {K: speedup}
    1: {2: 1.5, 4: 1.8, 8: 1.6},
    4: {2: 1.4, 4: 1.45, 8: 1.2},
    8: {2: 1.2, 4: 1.1, 8: 0.9},
    16: {2: 0.95, 4: 0.9, 8: 0.7},
}


def _rows():
    return [_row(k, b, s) for b, by_k in GRID.items() for k, s in by_k.items()]


def test_best_k_per_batch_size_becomes_a_vllm_schedule():
    (rec,) = recommend.recommend(_rows())
    assert rec.best == {1: (4, 1.8), 4: (4, 1.45), 8: (2, 1.2), 16: (0, None)}
    assert rec.schedule == [(1, 7, 4), (8, 15, 2), (16, 16, 0)]
    assert rec.max_k == 4
    assert rec.speculative_config_yaml() == (
        "num_speculative_tokens: 4\nnum_speculative_tokens_per_batch_size: [[1, 7, 4], [8, 15, 2], [16, 16, 0]]"
    )
    command = rec.check_command()
    assert command.startswith("python -m specbench -m model=smollm2-135m method=ngram workload=summarize")
    # The source's settings, every batch size, the fixed Ks the schedule uses beside the schedule itself.
    assert "workload.max_prompt_tokens=512 engine.max_model_len=2048" in command
    # Each batch size of the source and the one before each threshold (7 | 8, 15 | 16).
    assert command.endswith("batch_size=1,4,7,8,15,16 num_speculative_tokens=2,4 "
                            "'method.k_schedule=null,[[1,7,4],[8,15,2],[16,16,0]]' sweep_name=schedule_verify_ngram_summarize")


def test_workloads_are_recommended_separately_and_schedule_rows_are_the_check():
    rows = _rows() + [_row(4, 1, 1.3, workload="creative"), _row(2, 1, 1.1, workload="creative")]
    rows += [_row(4, 1, 1.78, schedule=[[1, 7, 4], [8, 16, 2]]), _row(4, 8, 1.19, schedule=[[1, 7, 4], [8, 16, 2]])]
    recs = recommend.recommend(rows)
    assert [r.label for r in recs] == ["ngram on creative (smollm2-135m)", "ngram on summarize (smollm2-135m)"]
    summarize = recs[1]
    assert summarize.best[1] == (4, 1.8)  # schedule rows never choose K
    assert summarize.checked == {1: 1.78, 8: 1.19}
    text = recommend.format_recommendation(summarize)
    assert "measured with schedule K=[1-7:4, 8-16:2]" in text and "verify it" in text
    assert "batch    8: schedule (K=2) 1.19x; best fixed K=2 1.20x" in text


def test_the_check_compares_the_schedule_with_the_fixed_ks_of_its_own_engine_runs():
    source = [_row(k, b, s, sweep="src") for b, by_k in GRID.items() for k, s in by_k.items()]
    schedule = [[1, 7, 4], [8, 16, 2]]
    check = [
        _row(4, 1, 1.75, schedule, sweep="ver", interval=(1.7, 1.8)),
        _row(4, 1, 1.7, sweep="ver", interval=(1.6, 1.8)), _row(2, 1, 1.4, sweep="ver", interval=(1.3, 1.5)),
        _row(4, 4, 1.3, schedule, sweep="ver", interval=(1.25, 1.35)),  # loses by more than its interval
        _row(4, 4, 1.5, sweep="ver", interval=(1.45, 1.55)), _row(2, 4, 1.3, sweep="ver", interval=(1.2, 1.4)),
        _row(4, 8, 1.2, schedule, sweep="ver", interval=(1.1, 1.3)),
        _row(4, 8, 1.0, sweep="ver", interval=(0.9, 1.1)), _row(2, 8, 1.25, sweep="ver", interval=(1.2, 1.3)),
    ]
    (rec,) = recommend.recommend(source + check)
    assert rec.best[1] == (4, 1.8) and rec.sources == ("src",)  # the check's fixed-K rows never choose K
    compared = {c.batch: c for c in recommend.comparisons(rec)}
    assert [compared[b].schedule_k for b in (1, 4, 8)] == [4, 4, 2]
    assert compared[1].fixed[4].speedup == 1.7  # from the check's own engine runs, not the source's 1.8
    assert [compared[b].loses for b in (1, 4, 8)] == [False, True, False]
    assert [compared[b].threshold for b in (1, 4, 8)] == [False, False, True]
    text = recommend.format_recommendation(rec)
    assert "WARNING: at batch 4 the schedule loses to fixed K=4" in text
    assert "batch    8: schedule (K=2) 1.20x [1.10, 1.30]; best fixed K=2 1.25x [1.20, 1.30]" in text
    assert "threshold: the schedule switches K here" in text


def test_write_makes_a_method_config_hydra_loads_and_verify_prints_one_sweep(tmp_path, capsys):
    from hydra import compose, initialize_config_dir

    from specbench.config import cell_from_config

    rows = [_row(k, b, s, sweep="src") for b, by_k in GRID.items() for k, s in by_k.items()]
    rows += [_row(2, 1, 1.2, workload="creative", sweep="src")]
    write_results(rows, tmp_path / "results.parquet")
    target = tmp_path / "conf" / "method" / "ngram_summarize.yaml"
    assert recommend.main([str(tmp_path), "--write", str(target)]) == 2  # two families: choose one
    assert "choose one with --method and --workload" in capsys.readouterr().err
    assert recommend.main([str(tmp_path), "--write", str(tmp_path / "x.yaml")]) == 2
    assert "must be DIR/method/NAME.yaml" in capsys.readouterr().err
    assert recommend.main([str(tmp_path), "--workload", "summarize", "--write", str(target)]) == 0
    text = target.read_text()
    assert "# sweep(s): src;" in text and "#   batch 8: K=2 1.20x, K=4 1.10x, K=8 0.90x -> K=2" in text
    assert "results sha256 " in text and "k_schedule: [[1, 7, 4], [8, 15, 2], [16, 16, 0]]" in text
    with initialize_config_dir(str(recommend_conf()), version_base=None):
        cfg = compose("config", overrides=[f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                                           "method=ngram_summarize", "batch_size=8"])
        cell = cell_from_config(cfg)
    assert cell.k == 4 and cell.identity["method"]["speculative_config"][
        "num_speculative_tokens_per_batch_size"] == [[1, 7, 4], [8, 15, 2], [16, 16, 0]]
    capsys.readouterr()
    assert recommend.main([str(tmp_path), "--verify"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["sweep_name=src_verify_ngram_creative",
                                                           "sweep_name=src_verify_ngram_summarize"]


def recommend_conf():
    """specbench's own config folder."""
    from pathlib import Path

    import specbench

    return Path(specbench.__file__).parent / "conf"


def test_a_k_must_clearly_beat_plain_decoding():
    rows = _rows()
    (rec,) = recommend.recommend(rows, margin=0.25)
    assert rec.best[8] == (0, None) and rec.best[4] == (4, 1.45)
    # With an interval, its lower end decides: K=4's 1.45x at batch 4 is not clear of 1.
    for row in rows:
        if row["batch_size"] == 4:
            row |= {"speedup_ci_low": 0.98, "speedup_ci_high": 1.9} if row["num_speculative_tokens"] == 4 else {
                "speedup_ci_low": 1.1, "speedup_ci_high": 1.5}
    (rec,) = recommend.recommend(rows)
    assert rec.best[4] == (2, 1.4)


def test_no_speculation_when_nothing_beats_plain_decoding():
    (rec,) = recommend.recommend([_row(2, 1, 0.9), _row(4, 1, 0.8)])
    assert rec.schedule == [(1, 1, 0)]
    assert "no speculation" in recommend.format_recommendation(rec)


def test_cli_reads_a_sweep_directory(tmp_path, capsys):
    write_results(_rows(), tmp_path / "results.parquet")
    assert recommend.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "schedule (start, end, K): [(1, 7, 4), (8, 15, 2), (16, 16, 0)]" in out
    assert recommend.main([str(tmp_path / "missing.parquet")]) == 2


@pytest.mark.parametrize("rows", [[], [_row(2, 1, None)]])
def test_cli_refuses_results_without_speedups(tmp_path, rows):
    write_results(rows, tmp_path / "results.parquet")
    assert recommend.main([str(tmp_path)]) == 2


def test_mismatched_or_flagged_cells_never_choose_k(tmp_path, capsys):
    rows = [_row(4, 1, 3.0) | {"exact_match": False, "exactness": "mismatch"}, _row(8, 1, 2.5) | {"flagged": True},
            _row(2, 1, 1.5)]
    (rec,) = recommend.recommend(rows)
    assert rec.best == {1: (2, 1.5)}
    write_results(rows, tmp_path / "results.parquet")
    assert recommend.main([str(tmp_path)]) == 0
    assert "2 cell(s) left out" in capsys.readouterr().err


def test_numerical_ties_and_caveats_exclude_nothing():
    # Outputs that differ from the baseline only at numerical ties (exact_match False, exactness "ties") and
    # caveats such as looping outputs qualify a cell; they do not exclude it.
    tied = _row(4, 1, 1.8) | {"exact_match": False, "exactness": "ties", "differing_requests": 2,
                              "tie_requests": 2, "mismatched_requests": 0,
                              "caveats": ["2 of 32 requests diverge at numerical ties"]}
    looping = _row(2, 4, 1.4) | {"caveats": ["1 of 32 outputs loops, carrying 20% of the output tokens"]}
    (rec,) = recommend.recommend([tied, _row(2, 1, 1.5), looping])
    assert rec.best == {1: (4, 1.8), 4: (2, 1.4)}


def test_an_older_row_without_exactness_reads_exact_match_as_before():
    old = _row(4, 1, 3.0) | {"exact_match": False, "exactness": None}
    (rec,) = recommend.recommend([old, _row(2, 1, 1.5)])
    assert rec.best == {1: (2, 1.5)}


def test_a_row_with_an_unreadable_config_is_read_as_every_other_reader_reads_it():
    # config_json is read by one function everywhere (specbench.results.row_config): unreadable means {}.
    rows = _rows() + [_row(2, 1, 1.1) | {"config_json": "{not json"}]
    recs = recommend.recommend(rows)  # the unreadable row is a family of its own
    assert sorted(len(r.best) for r in recs) == [1, 4]
    assert next(r for r in recs if len(r.best) == 4).best[1] == (4, 1.8)


def test_the_report_sets_the_measured_schedule_beside_the_fixed_ks(tmp_path):
    from specbench.report import render_report

    schedule = [[1, 7, 4], [8, 16, 2]]
    rows = [_row(k, b, s, sweep="src") for b, by_k in GRID.items() for k, s in by_k.items()]
    rows += [_row(4, 4, 1.3, schedule, sweep="ver", interval=(1.25, 1.35)),
             _row(4, 4, 1.5, sweep="ver", interval=(1.45, 1.55)),
             _row(4, 8, 1.2, schedule, sweep="ver", interval=(1.1, 1.3)),
             _row(2, 8, 1.25, sweep="ver", interval=(1.2, 1.3))]
    for i, row in enumerate(rows):
        row["cell_id"] = f"{row['cell_id']}-{i}"
    write_results(rows, tmp_path / "results.parquet")
    html = render_report(tmp_path / "results.parquet")
    assert "Measured with schedule K=[1-7:4, 8-16:2]" in html
    assert ("Warning: at batch 4 the schedule loses to fixed K=4: schedule / fixed K=4 0.87x [0.82, 0.91], both "
            "cells&#39; intervals combined (not paired), simultaneous over 1 fixed K.") in html
    assert "<td>8 ▲</td><td>2</td><td>1.20x [1.10, 1.30]</td><td>K=2</td>" in html


def test_the_check_command_draws_the_source_sweeps_prompts():
    # A verification on other prompts measures another acceptance: selection and its seed travel.
    row = {"method": "ngram", "model": "smollm2-135m", "workload": "summarize", "repetitions": 1,
           "config_json": json.dumps({"method": {"name": "ngram", "speculative_config": {"method": "ngram"}},
                                      "workload": {"name": "summarize", "num_prompts": 4, "selection": "first",
                                                   "seed": 3, "chat_template": True, "path": None}})}
    command = " ".join(recommend._overrides(row, json.loads(row["config_json"])))
    assert "workload.selection=first" in command and "workload.seed=3" in command
    assert "workload.chat_template=true" in command and "workload.path" not in command


def _check(batch4: dict[int, tuple[float, tuple[float, float], list[float] | None]]) -> recommend.Recommendation:
    """The source grid and a check at batch 4 only: K -> (speedup, interval, speedup per engine run); K 0 is the
    schedule's cell. Every cell of the check shares batch 4's baseline cell (rows.make_row's)."""
    source = [_row(k, b, s, sweep="src") for b, by_k in GRID.items() for k, s in by_k.items()]
    check = []
    for k, (speedup, interval, runs) in batch4.items():
        row = _row(k or 4, 4, speedup, [[1, 7, 4], [8, 16, 2]] if k == 0 else None, sweep="ver", interval=interval)
        check.append(row | {"speedup_per_engine_run": runs, "engine_runs": len(runs or [1])})
    (rec,) = recommend.recommend(source + check)
    return rec


def test_a_schedule_loses_only_where_the_ratio_to_a_fixed_k_is_shown_below_one():
    # The fastest fixed K is noisy: 1.40x [1.20, 1.60]. Before, the schedule's upper end 1.35 below that K's point
    # estimate (picked as the fastest by the same estimate) read "loses"; on the ratio the two cannot be told apart.
    rec = _check({0: (1.30, (1.25, 1.35), None), 4: (1.40, (1.20, 1.60), None), 2: (1.20, (1.10, 1.30), None)})
    (compared,) = recommend.comparisons(rec)
    assert compared.best_k == 4 and not compared.loses and compared.loses_to == ()
    k4 = compared.against[4]
    assert k4.paired_runs == 0 and k4.low < 1.0 < k4.high
    assert "WARNING" not in recommend.format_recommendation(rec)


def test_a_schedule_is_paired_run_by_run_with_the_fixed_ks_of_its_own_engine_runs():
    # The baseline engine moved between runs: every cell's own interval is wide and overlaps, so before nothing
    # lost (the schedule's upper end 1.66 lies above K=4's 1.37). Run by run the schedule is 4% slower than K=4
    # in every engine run, which the paired interval shows.
    runs = {0: [1.30, 1.45, 1.18], 4: [1.36, 1.52, 1.23], 2: [1.20, 1.33, 1.10]}
    rec = _check({k: (math.prod(r) ** (1 / 3), (1.0, 1.66 if k == 0 else 1.75), r) for k, r in runs.items()})
    (compared,) = recommend.comparisons(rec)
    assert compared.loses and compared.loses_to == (4,)
    k4 = compared.against[4]
    assert k4.paired_runs == 3 and k4.high < 1.0 and k4.ratio == pytest.approx(0.956, abs=0.001)
    assert compared.against[2].low > 1.0  # faster than K=2 in every run: no warning there
    text = recommend.format_recommendation(rec)
    assert "WARNING: at batch 4 the schedule loses to fixed K=4: schedule / fixed K=4 0.96x [" in text
    assert "paired over 3 engine runs, simultaneous over 2 fixed Ks" in text and "fixed K=2:" not in text
