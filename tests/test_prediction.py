"""The analytic model beside measured rows: hardware choice, pricing, notes, accuracy."""

from __future__ import annotations

import json

import pytest
import yaml

from specbench.analytic import drafting, prediction, profiles, speedup, steps
from specbench.analytic.prediction import HardwareChoice

HW = profiles.HardwareProfile(
    name="test-cpu", memory_bandwidth=20e9, peak_flops=0.1e12, fixed_overhead_s=0.015, source="calibrated"
)
CHOICE = HardwareChoice(HW, "test-cpu (calibrated)")
TARGET_CONFIG = {
    "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
}


@pytest.fixture
def checkpoints(tmp_path):
    target, draft = tmp_path / "target", tmp_path / "draft"
    for folder, layers in ((target, 30), (draft, 24)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(TARGET_CONFIG | {"num_hidden_layers": layers}))
    return target, draft


REQUESTS, PROMPT_LEN, OUTPUT_LEN = 8, 500, 32


def _row(target, method="ngram", k=4, batch=1, tokens_per_pass=2.0, draft_tokens_per_pass=None,
         draft=None, alpha=None, **extra):
    """A merged row whose counters give ``tokens_per_pass`` tokens and
    ``draft_tokens_per_pass`` drafted tokens (default K) per decode pass."""
    speculative = None if method == "baseline" else {"method": method, "num_speculative_tokens": k}
    if draft:
        speculative["model"] = str(draft)
    method_cfg = {"name": method, "speculative_config": speculative}
    if alpha is not None:
        method_cfg["alpha"] = alpha
    cfg = {"model": {"name": "m", "path": str(target), "dtype": "float32"}, "method": method_cfg,
           "workload": {"name": "summarize", "max_tokens": OUTPUT_LEN}, "engine": {"dtype": "float32"},
           "hardware": None}
    out = REQUESTS * OUTPUT_LEN
    decode_passes = (out - REQUESTS) / (1.0 if method == "baseline" else tokens_per_pass)
    drafted = k if draft_tokens_per_pass is None else draft_tokens_per_pass
    return {"status": "ok", "method": method, "num_speculative_tokens": 0 if method == "baseline" else k,
            "batch_size": batch, "model": "m", "workload": "summarize", "dtype": "float32",
            "num_requests": REQUESTS, "prompt_tokens": REQUESTS * PROMPT_LEN, "output_tokens": out,
            "wall_time_s_reps": [1.0], "target_passes": REQUESTS + decode_passes,
            "drafts": 0, "draft_tokens": 0 if method == "baseline" else drafted * decode_passes,
            "config_json": json.dumps(cfg)} | extra


def _step_budget(row, tokens):
    """``row`` with its engine's max_num_batched_tokens set to ``tokens``."""
    cfg = json.loads(row["config_json"])
    cfg["engine"]["max_num_batched_tokens"] = tokens
    return dict(row, config_json=json.dumps(cfg))


def _theory(target, method="ngram", k=4, batch=1, tokens_per_pass=2.0, draft=None, drafted=None):
    """(decode, end-to-end) speedup of such a row, straight from the analytic model."""
    profile = profiles.ModelProfile.from_config_json(target, dtype="float32")
    draft_profile = profiles.ModelProfile.from_config_json(draft, dtype="float32") if draft else None
    context = PROMPT_LEN + OUTPUT_LEN / 2
    decode = speedup.predicted_decode_speedup(method=method, k=k, batch_size=batch, tokens_per_pass=tokens_per_pass,
                                      target=profile, hw=HW, context_len=context, draft=draft_profile,
                                      draft_tokens_per_pass=drafted)
    prefill = steps.prefill_time(profile, HW, batch, PROMPT_LEN, max_step_tokens=prediction.DEFAULT_STEP_TOKENS)
    draft_prefill = drafting.draft_prefill_time(method, hw=HW, batch_size=batch, prompt_len=PROMPT_LEN,
                                              max_step_tokens=prediction.DEFAULT_STEP_TOKENS,
                                              draft=draft_profile, target=profile)
    plain = (OUTPUT_LEN - 1) * steps.plain_decode_step(profile, HW, batch, context)
    return decode, speedup.end_to_end_speedup(decode, prefill, plain, draft_prefill)


def test_context_is_prompt_plus_half_the_output_per_request():
    assert prediction.context_length({"num_requests": 4, "prompt_tokens": 400, "output_tokens": 80}) == 110
    assert prediction.context_length({"num_requests": 0, "prompt_tokens": 1, "output_tokens": 1}) is None


def test_each_row_is_priced_with_its_own_measured_acceptance(checkpoints):
    target, draft = checkpoints
    rows = [
        _row(target, "baseline", batch=1), _row(target, "baseline", batch=8),
        _row(target, batch=1, tokens_per_pass=2.5), _row(target, batch=8, tokens_per_pass=2.0),
        _row(target, "draft_model", k=2, batch=1, tokens_per_pass=1.8, draft=draft),
    ]
    out = prediction.with_predicted_speedups(rows, CHOICE)
    for baseline in out[:2]:
        assert [baseline[c] for c in prediction.PREDICTED_SPEEDUP_COLUMNS] == [1.0, 1.0, 1.0]
    decode, wall = _theory(target, tokens_per_pass=2.5)
    assert (out[2]["predicted_decode_speedup"], out[2]["predicted_speedup"]) == pytest.approx((decode, wall))
    assert out[3]["predicted_speedup"] == pytest.approx(_theory(target, batch=8, tokens_per_pass=2.0)[1])
    # Across batch sizes: batch 8 priced with the acceptance measured at batch 1.
    assert out[3]["predicted_speedup_bs1_alpha"] == pytest.approx(_theory(target, batch=8, tokens_per_pass=2.5)[1])
    assert out[2]["predicted_speedup_bs1_alpha"] == out[2]["predicted_speedup"]
    assert out[4]["predicted_speedup"] == pytest.approx(
        _theory(target, "draft_model", k=2, tokens_per_pass=1.8, draft=draft)[1])
    assert out[4]["predicted_speedup"] < _theory(target, k=2, tokens_per_pass=1.8)[1]  # the draft costs
    # ... in prefill too: the draft model prefills every prompt, which only the speculative side pays.
    draft_profile = profiles.ModelProfile.from_config_json(draft, dtype="float32")
    assert drafting.draft_prefill_time("draft_model", hw=HW, batch_size=1, prompt_len=PROMPT_LEN,
                                     max_step_tokens=prediction.DEFAULT_STEP_TOKENS, draft=draft_profile) > 0
    assert all(r["hardware_profile"] == "test-cpu (calibrated)" and r["prediction_note"] is None for r in out)


def test_prefill_dilutes_the_wall_time_prediction_more_at_larger_batches(checkpoints):
    target, _ = checkpoints
    out = prediction.with_predicted_speedups([_row(target, batch=b, tokens_per_pass=3.0) for b in (1, 8)], CHOICE)
    for row in out:
        assert 1.0 < row["predicted_speedup"] < row["predicted_decode_speedup"]
    share = [(r["predicted_speedup"] - 1) / (r["predicted_decode_speedup"] - 1) for r in out]
    assert share[1] < share[0]


def test_the_wall_time_waits_for_each_batchs_slowest_request(checkpoints):
    # Batch 4, 31 decode tokens per request, 15.5 passes a request on average either way:
    # even passes, or two requests that loop (accept much) beside two that accept little.
    target, _ = checkpoints
    outputs = [OUTPUT_LEN] * REQUESTS
    even = _row(target, batch=4, output_tokens_per_request=outputs, decode_passes_per_request=[16, 15] * 4)
    spread = _row(target, batch=4, output_tokens_per_request=outputs, decode_passes_per_request=[8, 23] * 4)
    unrecorded, even, spread = prediction.with_predicted_speedups([_row(target, batch=4), even, spread], CHOICE)
    assert even["predicted_speedup"] == pytest.approx(unrecorded["predicted_speedup"], rel=0.02)
    # Each batch pays its slowest requests' 23 passes, two of them at half the batch.
    profile = profiles.ModelProfile.from_config_json(target, dtype="float32")
    context = PROMPT_LEN + OUTPUT_LEN / 2
    step = lambda b: steps.verify_step(profile, HW, b, 4, context, 4.0)  # noqa: E731
    # The same mean pass count, but the TPOT of the spread batch's stragglers is lower: they step at half the batch.
    plain_tpot = steps.plain_decode_step(profile, HW, 4, context)
    assert spread["predicted_decode_speedup"] == pytest.approx(
        plain_tpot / speedup.mean_tpot([[8, 23, 8, 23]] * 2, [outputs[:4]] * 2, step))
    assert spread["predicted_decode_speedup"] > even["predicted_decode_speedup"]
    tail = speedup.batch_decode_time([8, 23, 8, 23], step) / (15.5 * step(4))
    prefill = steps.prefill_time(profile, HW, 4, PROMPT_LEN, max_step_tokens=prediction.DEFAULT_STEP_TOKENS)
    plain = (OUTPUT_LEN - 1) * steps.plain_decode_step(profile, HW, 4, context)
    assert tail > 1.05  # less than 23 / 15.5: the last passes run at half the batch, and cost less
    # Wall time: the mean request's decode speedup (a row without per-request counts), paid with the tail.
    assert spread["predicted_speedup"] == pytest.approx(speedup.end_to_end_speedup(
        unrecorded["predicted_decode_speedup"], prefill, plain, speculative_tail=tail))


def test_prefill_steps_follow_the_engines_max_num_batched_tokens(checkpoints):
    target, _ = checkpoints
    row = _row(target, batch=8, tokens_per_pass=3.0)
    default, chunked = prediction.with_predicted_speedups([row, _step_budget(row, 1000)], CHOICE)
    profile = profiles.ModelProfile.from_config_json(target, dtype="float32")
    context = PROMPT_LEN + OUTPUT_LEN / 2
    plain = (OUTPUT_LEN - 1) * steps.plain_decode_step(profile, HW, 8, context)
    decode = _theory(target, batch=8, tokens_per_pass=3.0)[0]
    assert default["predicted_decode_speedup"] == pytest.approx(decode)  # 4000 prompt tokens: one step
    for priced, step_tokens in ((default, prediction.DEFAULT_STEP_TOKENS), (chunked, 1000)):
        prefill = steps.prefill_time(profile, HW, 8, PROMPT_LEN, max_step_tokens=step_tokens)
        assert priced["predicted_speedup"] == pytest.approx(speedup.end_to_end_speedup(decode, prefill, plain))
    assert chunked["predicted_speedup"] < default["predicted_speedup"]  # 4 steps' overhead, not 1


def test_the_decode_speedup_is_priced_as_measured_a_tpot_ratio_beside_later_prefill_chunks(checkpoints):
    # At 1000 tokens a step, 8 prompts of 500 tokens prefill in 4 steps: the requests done first
    # decode beside the later chunks, and their TPOT (plain or speculative) carries them.
    target, _ = checkpoints
    (chunked,) = prediction.with_predicted_speedups([_step_budget(_row(target, batch=8, tokens_per_pass=3.0), 1000)],
                                                    CHOICE)
    profile = profiles.ModelProfile.from_config_json(target, dtype="float32")
    context = PROMPT_LEN + OUTPUT_LEN / 2
    chunk = steps.prefill_time(profile, HW, 8, PROMPT_LEN, max_step_tokens=1000) / 4
    # No per-request counts in the row: 8 requests at the mean.
    outputs = [[OUTPUT_LEN] * 8]
    plain = speedup.mean_tpot([[OUTPUT_LEN - 1] * 8], outputs, lambda b: steps.plain_decode_step(profile, HW, b, context),
                              prefill_steps=4, mixed_step_s=chunk)
    speculative = speedup.mean_tpot(
        [[(OUTPUT_LEN - 1) / 3.0] * 8], outputs,
        lambda b: speedup.speculative_step("ngram", target=profile, hw=HW, batch_size=b, k=4, context_len=context),
        prefill_steps=4, mixed_step_s=chunk)
    assert chunked["predicted_decode_speedup"] == pytest.approx(plain / speculative)
    assert 1.0 < chunked["predicted_decode_speedup"] < _theory(target, batch=8, tokens_per_pass=3.0)[0]


def test_verification_is_priced_for_the_tokens_actually_drafted(checkpoints):
    # ngram drafts only where its lookup matches: half-empty drafts verify
    # fewer tokens, which matters once the batch is past the ridge.
    target, _ = checkpoints
    # The batch's 16,000 prompt tokens in one step: the decode speedup is decode alone.
    full, half = prediction.with_predicted_speedups(
        [_step_budget(_row(target, batch=32, tokens_per_pass=2.0, draft_tokens_per_pass=d), 32 * PROMPT_LEN)
         for d in (None, 2.0)], CHOICE)
    assert half["predicted_decode_speedup"] == pytest.approx(
        _theory(target, batch=32, tokens_per_pass=2.0, drafted=2.0)[0])
    assert half["predicted_decode_speedup"] > full["predicted_decode_speedup"]


def test_controlled_rows_are_marked_and_priced_as_a_free_draft(checkpoints):
    target, _ = checkpoints
    (row,) = prediction.with_predicted_speedups([_row(target, "controlled", alpha=0.7, tokens_per_pass=2.7)], CHOICE)
    assert row["controlled_alpha"] == 0.7
    assert row["predicted_speedup"] == pytest.approx(_theory(target, tokens_per_pass=2.7)[1])
    (plain,) = prediction.with_predicted_speedups([_row(target)], CHOICE)
    assert plain["controlled_alpha"] is None


def test_rows_the_model_cannot_price_get_nulls_and_a_reason(checkpoints, tmp_path):
    target, _ = checkpoints
    missing = tmp_path / "nowhere"
    rows = [
        _row(target, batch=4),  # no batch-size-1 row in its curve
        _row(missing, batch=1),  # no config.json
        _row(target, batch=1, k=2, target_passes=None),
        _row(target, batch=1, k=3, status="failed"),
    ]
    out = prediction.with_predicted_speedups(rows, CHOICE)
    assert out[0]["predicted_speedup"] is not None and out[0]["predicted_speedup_bs1_alpha"] is None
    assert "batch-size-1" in out[0]["prediction_note"]
    assert out[1]["predicted_speedup"] is None and "config.json" in out[1]["prediction_note"]
    assert out[2]["predicted_speedup"] is None and "target_passes" in out[2]["prediction_note"]
    assert out[3].get("predicted_speedup") is None and out[3].get("prediction_note") is None


def test_decode_acceptance_excludes_prefill_passes_and_bounds_old_pass_counts(checkpoints):
    target, _ = checkpoints
    row = _row(target, k=4, tokens_per_pass=2.0, draft_tokens_per_pass=1.5)
    assert prediction.decode_acceptance(row) == prediction.DecodeAcceptance(2.0, 1.5)
    # A row written before results bounded passes: 8 requests x 32 tokens,
    # 60 drafts, and output - accepted = 40 passes, fewer than 8 + 60.
    old = row | {"target_passes": 40, "drafts": 60, "draft_tokens": 240}
    assert prediction.decode_acceptance(old) == prediction.DecodeAcceptance(248 / 60, 4.0)
    (priced,) = prediction.with_predicted_speedups([old], CHOICE)
    assert priced["predicted_decode_speedup"] == pytest.approx(_theory(target, tokens_per_pass=248 / 60)[0])
    # Never more than K + 1 tokens per pass, whatever the counters say.
    assert prediction.decode_acceptance(row | {"target_passes": 10}).tokens_per_pass == 5.0


def test_a_schedule_prices_the_k_vllm_uses_at_that_batch_size(checkpoints):
    schedule = [[1, 3, 4], [8, 15, 2], [16, 32, 0]]
    assert [prediction.effective_k({"num_speculative_tokens_per_batch_size": schedule}, 4, b)
            for b in (1, 3, 5, 8, 16, 64)] == [4, 4, 4, 2, 0, 0]
    assert prediction.effective_k({"num_speculative_tokens_per_batch_size": [[1, 8, 6]]}, 4, 2) == 4
    assert prediction.effective_k(None, 3, 8) == 3
    target, _ = checkpoints
    row = _row(target, batch=16, tokens_per_pass=1.0, draft_tokens_per_pass=0.0)
    cfg = json.loads(row["config_json"])
    cfg["method"]["speculative_config"]["num_speculative_tokens_per_batch_size"] = schedule
    (priced,) = prediction.with_predicted_speedups([dict(row, config_json=json.dumps(cfg))], CHOICE)
    assert priced["predicted_speedup"] == 1.0


def test_hardware_choice_config_first_then_calibrated_then_none(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    assert prediction.choose_hardware(None) is None
    vendor = {"name": "h200", "source": "vendor", "memory_bandwidth_gbps": 4800, "peak_tflops": 989,
              "fixed_overhead_ms": 0.1}
    assert prediction.choose_hardware(vendor).profile.name == "h200"
    path = prediction.calibrated_path()
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"name": "mine", "source": "calibrated", "memory_bandwidth_gbps": 20,
                                    "peak_tflops": 0.1, "fixed_overhead_ms": 15,
                                    "measured_at": "2026-01-01T00:00:00+00:00"}))
    chosen = prediction.choose_hardware(None)
    assert chosen.profile.name == "mine" and str(path) in chosen.label
    assert prediction.choose_hardware(vendor).profile.name == "h200"


def test_without_any_profile_predictions_are_null_and_the_sweep_says_how_to_calibrate(
    checkpoints, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "empty"))
    target, _ = checkpoints
    rows, hint = prediction.predict_sweep([_row(target), _row(target, "baseline")])
    assert "python -m specbench.calibrate" in hint and "\n" not in hint
    assert all(r["predicted_speedup"] is None and r["hardware_profile"] is None for r in rows)
    cfg = json.loads(rows[0]["config_json"])
    cfg["hardware"] = {"name": "a100", "source": "vendor", "memory_bandwidth_gbps": 2039,
                       "peak_tflops": 312, "fixed_overhead_ms": 0.1}
    rows, hint = prediction.predict_sweep([dict(rows[0], config_json=json.dumps(cfg))])
    assert hint is None and rows[0]["hardware_profile"].startswith("a100 (vendor")


def test_reprice_says_which_rows_a_narrowed_calibration_prices_outside_its_range(
    checkpoints, narrowed_profile, tmp_path, capsys
):
    # Rows inside what make demo's narrowed calibration measured (batch 1 and 4, prompts of up to 512 tokens):
    # no word of it. Rows outside it: one line, before the tables, names what and the command that measures it.
    from specbench.results.files import write_results

    target, _ = checkpoints
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    covered = [_row(target, "baseline"), _row(target), _row(target, batch=4)]
    write_results(covered, sweep / "results.parquet")
    assert prediction.main([str(sweep), "--reprice"]) == 0
    out = capsys.readouterr().out
    assert "narrower sweep" not in out and str(narrowed_profile) in out  # priced with it
    write_results(covered + [_row(target, batch=16), _row(target, prompt_tokens=REQUESTS * 600)],
                  sweep / "results.parquet")
    assert prediction.main([str(sweep), "--reprice"]) == 0
    first, *rest = capsys.readouterr().out.splitlines()
    assert first.startswith(f"the calibrated profile {narrowed_profile} was measured for a narrower sweep")
    assert "(batch 16 above its 4; summarize prompts of up to 600 tokens above its 512)" in first
    assert "the predictions for those rows are extrapolated" in first
    assert "`python -m specbench.calibrate --complete` times the rest" in first
    assert not any("narrower sweep" in line for line in rest) and rest[0].startswith("hardware profile: ")
    # Rows whose sweep named a hardware profile are priced with it: the calibrated one's range does not matter.
    a100 = {"name": "a100", "source": "vendor", "memory_bandwidth_gbps": 2039, "peak_tflops": 312,
            "fixed_overhead_ms": 0.1}
    named = [dict(r, config_json=json.dumps(json.loads(r["config_json"]) | {"hardware": a100}))
             for r in covered + [_row(target, batch=16)]]
    write_results(named, sweep / "results.parquet")
    assert prediction.main([str(sweep), "--reprice"]) == 0
    out = capsys.readouterr().out
    assert "narrower sweep" not in out and "hardware profile: a100 (vendor" in out


def test_embedded_models_are_profiled_from_their_prepared_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(TARGET_CONFIG))
    profile = prediction.model_profile("embedded:smollm2-135m-instruct", "float32")
    assert profile.num_layers == 30 and profile.bytes_per_weight == 4.0
    with pytest.raises(ValueError, match="config.json"):
        prediction.model_profile("embedded:smollm2-135m-instruct-l24", "float32")


def test_accuracy_and_break_even_per_curve():
    def row(batch, measured, predicted, decode=None):
        return {"status": "ok", "method": "ngram", "num_speculative_tokens": 4, "batch_size": batch,
                "workload": "w", "speedup": measured, "decode_speedup": decode or measured,
                "predicted_speedup": predicted, "predicted_decode_speedup": predicted * 1.1,
                "predicted_speedup_bs1_alpha": predicted, "dtype": "float32", "config_json": "{}"}

    rows = [row(1, 2.0, 2.2), row(2, 1.5, 1.5), row(4, 1.2, 0.9), row(8, 0.8, 0.7)]
    (acc,) = prediction.accuracy(rows)
    assert acc["method"] == "ngram" and acc["rows"] == 4
    assert acc["mdape_wall"] == pytest.approx((0.1 + 0.125) / 2)
    # Decode predictions are held against the decode speedup: |2.42/2 - 1| ... |0.77/0.8 - 1|.
    assert acc["mdape_decode"] == pytest.approx((0.1 + 0.175) / 2)
    # The largest errors beside the medians: 0.9 for 1.2 (wall), 2.42 for 2.0 (decode).
    assert (acc["max_wall"], acc["max_decode"]) == pytest.approx((0.25, 0.21))
    assert "median (max)" in prediction.format_check(rows) and "11.3% (25.0%)" in prediction.format_check(rows)
    (curve,) = prediction.break_even(rows)
    assert curve["batch_sizes"] == [1, 2, 4, 8]
    assert curve["measured"] == pytest.approx(speedup.break_even_batch_size([1, 2, 4, 8], [2.0, 1.5, 1.2, 0.8]))
    assert curve["predicted"] == pytest.approx(speedup.break_even_batch_size([1, 2, 4, 8], [2.2, 1.5, 0.9, 0.7]))


def test_default_step_budget_follows_vllms_default_for_the_hardware_the_row_ran_on(checkpoints):
    # EngineArgs.get_batch_defaults (vLLM 0.32), offline LLM: CPU 4096; GPUs >= 70 GiB but A100 16384; others 8192.
    assert prediction.default_step_tokens("CPU AMD EPYC 7B13 (2 cores)") == 4096
    assert prediction.default_step_tokens("1x NVIDIA H200") == 16384
    assert prediction.default_step_tokens("8x NVIDIA H100 80GB HBM3") == 16384
    assert prediction.default_step_tokens("1x NVIDIA A100-SXM4-80GB") == 8192
    assert prediction.default_step_tokens("1x NVIDIA GeForce RTX 4090") == 8192
    assert prediction.default_step_tokens(None) == 4096
    # A GPU row left at vLLM's default is priced with 16384-token prefill steps, not the CPU's 4096.
    target, _ = checkpoints
    row = _row(target, batch=32, tokens_per_pass=3.0)
    cpu, gpu = prediction.with_predicted_speedups([row, dict(row, machine="1x NVIDIA H200")], CHOICE)
    profile = profiles.ModelProfile.from_config_json(target, dtype="float32")
    context = PROMPT_LEN + OUTPUT_LEN / 2
    plain = (OUTPUT_LEN - 1) * steps.plain_decode_step(profile, HW, 32, context)
    prefill = steps.prefill_time(profile, HW, 32, PROMPT_LEN, max_step_tokens=16384)
    assert gpu["predicted_speedup"] == pytest.approx(
        speedup.end_to_end_speedup(gpu["predicted_decode_speedup"], prefill, plain))
    assert gpu["predicted_speedup"] != cpu["predicted_speedup"]


def test_ngram_verifies_what_it_drafted_on_v1_and_k_drafts_on_v2(checkpoints):
    # vLLM 0.32's CPU build (V1) verifies only the drafts ngram's lookup found; Model Runner V2, a
    # GPU's, fills the unmatched slots and verifies K every step. One CPU-measured ngram row (half of
    # its K drafted per pass) priced for a V1 and for a V2 profile of the same machine:
    target, _ = checkpoints
    row = _step_budget(_row(target, batch=32, tokens_per_pass=2.0, draft_tokens_per_pass=2.0), 32 * PROMPT_LEN)
    v2 = HardwareChoice(profiles.HardwareProfile(**{**HW.__dict__, "model_runner": "V2"}), "test-gpu")
    (on_v1,), (on_v2,) = (prediction.with_predicted_speedups([row], c) for c in (CHOICE, v2))
    assert on_v1["predicted_decode_speedup"] == pytest.approx(
        _theory(target, batch=32, tokens_per_pass=2.0, drafted=2.0)[0])
    assert on_v2["predicted_decode_speedup"] == pytest.approx(
        _theory(target, batch=32, tokens_per_pass=2.0, drafted=4.0)[0])
    assert on_v2["predicted_decode_speedup"] < on_v1["predicted_decode_speedup"]
    # controlled runs custom_class, which vLLM keeps on V1 on every device: nothing padded.
    controlled = _step_budget(_row(target, "controlled", alpha=0.5, batch=32, tokens_per_pass=2.0,
                                   draft_tokens_per_pass=2.0), 32 * PROMPT_LEN)
    (c1,), (c2,) = (prediction.with_predicted_speedups([controlled], c) for c in (CHOICE, v2))
    assert c1["predicted_decode_speedup"] == pytest.approx(c2["predicted_decode_speedup"])


def test_padded_ngram_verification_costs_more_and_more_so_at_large_batch(checkpoints):
    target, _ = checkpoints
    model = profiles.ModelProfile.from_config_json(target, dtype="float32")
    k, matched = 4, 1.0  # a lookup that drafts one token per pass on average

    def step(batch: int, padded: bool) -> float:
        drafted = drafting.verified_draft_tokens(k, matched, padded=padded)
        return speedup.speculative_step("ngram", target=model, hw=HW, batch_size=batch, k=k,
                                        context_len=PROMPT_LEN, draft_tokens_per_pass=drafted)

    assert drafting.verified_draft_tokens(k, matched, padded=True) == 4.0
    assert drafting.verified_draft_tokens(k, matched, padded=False) == 1.0
    assert drafting.verified_draft_tokens(k, None, padded=False) == 4.0  # no figure: a full draft
    extra = {b: step(b, True) - step(b, False) for b in (1, 64)}
    assert extra[1] >= 0.0 and extra[64] > 10 * max(extra[1], 1e-9)


def test_a_gpu_profile_runs_model_runner_v2_and_a_cpu_profile_v1():
    from pathlib import Path

    conf = Path(prediction.__file__).resolve().parents[1] / "conf" / "hardware"
    runners = {p.stem: profiles.HardwareProfile.from_mapping(yaml.safe_load(p.read_text())).model_runner
               for p in conf.glob("*.yaml")}
    assert runners == {"a100": "V2", "h200": "V2", "rtx4090": "V2", "cpu-amd-epyc-2-cores": "V1"}
    # A calibrated GPU profile names its device and states no memory_bytes; one may set the runner itself.
    assert profiles.device_model_runner({"device": "NVIDIA H100 80GB HBM3"}) == "V2"
    assert profiles.device_model_runner({}) == "V1"
    with pytest.raises(ValueError, match="model_runner must be one of V1, V2"):
        profiles.HardwareProfile(**{**HW.__dict__, "model_runner": "V3"})


def test_ngram_pays_the_host_work_its_profile_timed_once_per_step_whatever_k(checkpoints):
    # vLLM runs the n-gram lookup, the verification's metadata and the rejection sampler on the host
    # every speculative step: plain decoding pays none of it, and on 2 CPU cores it is several ms of
    # a ~40 ms step. A profile that timed it (head_draft_overhead_ms: {ngram: ...}) charges it once
    # per step; one that did not charges nothing, as before.
    target, _ = checkpoints
    model = profiles.ModelProfile.from_config_json(target, dtype="float32")
    timed = profiles.HardwareProfile.from_mapping(
        {"name": "t", "source": "calibrated", "memory_bandwidth_gbps": 20.0, "peak_tflops": 0.1,
         "fixed_overhead_ms": 15.0, "head_draft_overhead_ms": {"ngram": 4.0}})
    untimed = profiles.HardwareProfile.from_mapping(
        {"name": "t", "source": "calibrated", "memory_bandwidth_gbps": 20.0, "peak_tflops": 0.1,
         "fixed_overhead_ms": 15.0})
    for k in (2, 8):
        for batch in (1, 16):
            common = dict(target=model, batch_size=batch, k=k, context_len=516.0, draft_tokens_per_pass=1.0)
            extra = speedup.speculative_step("ngram", hw=timed, **common) - speedup.speculative_step(
                "ngram", hw=untimed, **common)
            assert extra == pytest.approx(0.004)
    row = _row(target, k=4, tokens_per_pass=2.0, draft_tokens_per_pass=2.0)
    (slower,), (free,) = (prediction.with_predicted_speedups([row], HardwareChoice(hw, "t"))
                          for hw in (timed, untimed))
    step = steps.verify_step(model, untimed, 1, 4, PROMPT_LEN + OUTPUT_LEN / 2, 2.0)
    assert slower["predicted_decode_speedup"] == pytest.approx(
        free["predicted_decode_speedup"] * step / (step + 0.004))
    # The figure is ngram's: an EAGLE head's pricing is unchanged by it.
    assert drafting.draft_time("eagle", hw=timed, batch_size=1, k=2, context_len=516.0, target=model) == \
        drafting.draft_time("eagle", hw=untimed, batch_size=1, k=2, context_len=516.0, target=model)
