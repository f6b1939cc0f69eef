"""Calibration without an engine: the grid, synthetic prompts, sample extraction, the fit and its file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from specbench import calibrate
from specbench.analytic import drafting, prediction, profile_fit, profiles, speedup, steps
from specbench.calibrate import GridPoint

MODEL = profiles.ModelProfile(
    name="m", num_params=135_000_000, num_layers=30, hidden_size=576, intermediate_size=1536,
    num_attention_heads=9, num_kv_heads=3, head_dim=64, vocab_size=49152,
    bytes_per_weight=4.0, kv_bytes_per_element=4.0,
)


def test_grid_keeps_only_batches_that_prefill_in_one_step():
    points = calibrate.grid([1, 2, 4, 8, 16, 32], [64, 512, 1024], 4096)
    assert [(p.batch_size, p.prompt_len) for p in points] == [
        (1, 64), (2, 64), (4, 64), (8, 64), (16, 64), (32, 64),
        (1, 512), (2, 512), (4, 512), (8, 512),
        (1, 1024), (2, 1024), (4, 1024),
    ]
    with pytest.raises(ValueError, match="at least 3"):
        calibrate.grid([64], [1024], 4096)


def test_synthetic_prompts_have_the_exact_length_and_differ():
    stream = list(range(1000))
    prompts = calibrate.synthetic_prompts(stream, 100, 5)
    assert all(len(p) == 100 for p in prompts) and len(set(prompts)) == 5
    wrapped = calibrate.synthetic_prompts(stream, 400, 4)  # more tokens than the stream: windows wrap
    assert all(len(p) == 400 for p in wrapped)
    with pytest.raises(ValueError):
        calibrate.synthetic_prompts(stream[:10], 100, 1)


def test_step_sample_is_the_fastest_rounds_median_tpot_at_the_mean_decode_context():
    point = GridPoint(batch_size=4, prompt_len=512)
    quiet = [0.020, 0.021, 0.019, 0.5, 0.020, None, 0.022, 0.020]  # a straggler, one without metrics
    disturbed = [0.300, 0.310, 0.290, 0.305]  # other work on the machine during this round
    sample, record = calibrate.step_sample(point, 16, [disturbed, quiet], [64, 64])
    assert sample == profile_fit.StepSample(num_tokens=4, num_seqs=4, context_len=520.0, seconds=0.020)
    assert record["complete"] and record["round_seconds"] == [0.3025, 0.020]
    _, short = calibrate.step_sample(point, 16, [quiet], [64, 60])
    assert not short["complete"] and short["output_tokens_per_round"] == 60
    with pytest.raises(ValueError, match="TPOT"):
        calibrate.step_sample(point, 16, [[None], []], [64])


TRUE = profiles.HardwareProfile(
    name="true", memory_bandwidth=20e9, peak_flops=0.3e12, fixed_overhead_s=4e-3, source="calibrated",
    per_seq_overhead_s=0.5e-3, kv_bandwidth=8e9, attention_flops=0.06e12,
)


def _synthetic_samples():
    """Decode and prefill samples of every grid point, as a machine with TRUE's rates would time them."""
    points = calibrate.grid([1, 2, 4, 8, 16, 32], [64, 512, 1024], 4096)
    pairs = []
    for p in points:
        decode = steps.step_time(MODEL, TRUE, num_tokens=p.batch_size, num_seqs=p.batch_size,
                                  context_len=p.prompt_len + 8)
        prefill = steps.prefill_time(MODEL, TRUE, p.batch_size, p.prompt_len, max_step_tokens=4096)
        pairs.append(calibrate.step_sample(p, 16, [[decode * 1.3] * p.batch_size, [decode] * p.batch_size],
                                           [p.batch_size * 16] * 2))
        pairs.append(calibrate.prefill_sample(p, [[prefill] * p.batch_size, [prefill * 1.2] * p.batch_size]))
    return [s for s, _ in pairs], [r for _, r in pairs]


def test_prefill_sample_is_the_fastest_rounds_median_ttft_of_one_step():
    point = GridPoint(batch_size=4, prompt_len=512)
    sample, record = calibrate.prefill_sample(point, [[0.9, 1.0, 1.1, None], [0.5, 0.6, 0.7, 5.0]])
    assert sample == profile_fit.StepSample(num_tokens=2048, num_seqs=4, context_len=256.0,
                                       seconds=pytest.approx(0.65), logits=4)
    assert record["kind"] == "prefill" and record["round_seconds"] == pytest.approx([1.0, 0.65])
    with pytest.raises(ValueError, match="TTFT"):
        calibrate.prefill_sample(point, [[None]])


def test_fit_recovers_a_known_machine_and_reports_residuals():
    samples, records = _synthetic_samples()
    profile, fitted = calibrate.fit(samples, records, MODEL, "test")
    for field in ("memory_bandwidth", "peak_flops", "kv_bandwidth", "attention_flops"):
        assert getattr(profile, field) == pytest.approx(getattr(TRUE, field), rel=1e-3), field
    assert profile.fixed_overhead_s == pytest.approx(TRUE.fixed_overhead_s, rel=1e-2)
    assert profile.per_seq_overhead_s == pytest.approx(TRUE.per_seq_overhead_s, rel=1e-2)
    assert all(abs(r["residual"]) < 1e-6 for r in fitted)
    assert all(r["predicted_seconds"] == pytest.approx(r["seconds"]) for r in fitted)
    text = calibrate.format_fit(profile, fitted)
    assert "GB/s" in text and "ms per sequence" in text
    assert "over 13 decode steps" in text and "over 13 prefill steps" in text
    assert len(text.splitlines()) == len(fitted) + 4


def test_profile_file_round_trips_and_sweeps_find_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    samples, records = _synthetic_samples()
    profile, fitted = calibrate.fit(samples, records, MODEL, "my-cpu")
    doc = calibrate.profile_document(
        profile, fitted, model={"name": "m", "path": "embedded:x", "dtype": "float32"},
        device="CPU Test (2 cores)", measured_at="2026-01-01T00:00:00+00:00", vllm_version="0.32.0",
        settings={"max_tokens": 16, "rounds": 2},
    )
    assert set(doc) >= {"name", "source", "memory_bandwidth_gbps", "peak_tflops", "fixed_overhead_ms",
                        "notes", "residuals", "samples", "model", "measured_at"}
    calibrate.write_profile(doc, prediction.calibrated_path())
    assert prediction.calibrated_path() == tmp_path / "hardware" / "calibrated.yaml"
    assert yaml.safe_load(prediction.calibrated_path().read_text())["residuals"] == doc["residuals"]
    choice = prediction.choose_hardware(None)
    assert choice.profile.source == "calibrated" and choice.profile.name == "my-cpu"
    assert choice.profile.memory_bandwidth == pytest.approx(profile.memory_bandwidth, rel=1e-4)
    assert "2026-01-01" in choice.label


def test_draft_sample_is_the_fastest_rounds_time_per_verified_draft():
    point = GridPoint(batch_size=4, prompt_len=512)
    # Decode seconds summed over the batch's requests, and the drafts verified in them.
    sample, record = calibrate.draft_sample(point, 3, 16, [(4.0, 40), (3.0, 40), (1.0, 0)])
    assert sample == profile_fit.DraftSample(batch_size=4, k=3, context_len=520.0, seconds=0.075)
    assert record["round_seconds_per_pass"] == [0.1, 0.075]
    with pytest.raises(ValueError, match="drafted"):
        calibrate.draft_sample(point, 3, 16, [(1.0, 0)])


def test_the_profile_file_carries_the_draft_overhead_and_its_evidence(tmp_path):
    samples, records = _synthetic_samples()
    profile, fitted = calibrate.fit(samples, records, MODEL, "my-cpu")
    common = {"model": {"name": "m", "path": "embedded:x", "dtype": "float32"}, "device": "CPU",
              "measured_at": "2026-01-01T00:00:00+00:00", "vllm_version": "0.32.0", "settings": {}}
    without = calibrate.profile_document(profile, fitted, **common)
    assert "draft_overhead_ms" not in without and without["draft_samples"]["method"] is None
    timed = replace(profile, draft_overhead_s=0.0042)
    draft = [{"batch_size": 1, "prompt_tokens": 512, "k": 3, "seconds_per_pass": 0.05, "residual": 0.01}]
    doc = calibrate.profile_document(timed, fitted, **common, draft_records=draft, draft_method="eagle3")
    assert doc["draft_overhead_ms"] == 4.2 and doc["draft_samples"] == {"method": "eagle3", "samples": draft}
    path = tmp_path / "p.yaml"
    calibrate.write_profile(doc, path)
    loaded = prediction.load_hardware_file(path).profile
    assert loaded.draft_pass_overhead_s == pytest.approx(0.0042)
    assert "4.20 ms per draft pass" in calibrate.format_draft_fit("eagle3", 0.0042, draft)


def test_bad_integer_lists_are_refused():
    # calibrate and gpu_timing read their integer lists with one parser.
    assert calibrate.positive_ints("1, 2,4", "--batch-sizes") == [1, 2, 4]
    for bad in ("", "0,1", "a"):
        with pytest.raises(ValueError, match="--batch-sizes"):
            calibrate.positive_ints(bad, "--batch-sizes")


def test_the_engine_prefills_every_grid_batch_in_one_step_unless_told_otherwise():
    assert calibrate.engine_overrides(["model=x"], 16384) == ["model=x", "engine.max_num_batched_tokens=16384"]
    mine = ["engine.max_num_batched_tokens=8192"]
    assert calibrate.engine_overrides(mine, 16384) == mine


def test_device_bounds_cap_the_fit_and_a_rate_at_its_bound_is_said(tmp_path):
    samples, records = _synthetic_samples()
    # A device that can stream at most 10 GB/s cannot be TRUE's 20: the fit sits at the ceiling and says so.
    slow = profile_fit.DeviceBounds(copy_bandwidth=10e9 / 1.05, matmul_flops=1e12, source="given")
    profile, fitted = calibrate.fit(samples, records, MODEL, "capped", slow)
    assert profile.memory_bandwidth == pytest.approx(slow.max_bandwidth, rel=1e-6)
    assert profile.kv_read_bandwidth <= slow.max_bandwidth * (1 + 1e-9)
    warnings = profile_fit.fit_warnings(profile, [r["residual"] for r in fitted], slow)
    assert any(w.startswith("weight bandwidth") and "sits at its bound" in w for w in warnings)
    assert any("off by more than 10%" in w for w in warnings)
    # Room above TRUE's rates: the fit finds them, and nothing is said.
    roomy = profile_fit.DeviceBounds(copy_bandwidth=40e9, matmul_flops=1e12)
    profile, fitted = calibrate.fit(samples, records, MODEL, "free", roomy)
    assert profile.memory_bandwidth == pytest.approx(TRUE.memory_bandwidth, rel=1e-3)
    assert profile_fit.fit_warnings(profile, [r["residual"] for r in fitted], roomy) == []
    assert "every rate below its device bound" in calibrate.format_warnings([])


def test_refit_reads_an_earlier_calibration_and_writes_its_bounds_and_warnings(tmp_path, monkeypatch):
    samples, records = _synthetic_samples()
    profile, fitted = calibrate.fit(samples, records, MODEL, "my-cpu")
    doc = calibrate.profile_document(
        profile, fitted, model={"name": "m", "path": "embedded:x", "dtype": "float32"}, device="CPU Test",
        measured_at="2026-01-01T00:00:00+00:00", vllm_version="0.32.0", settings={"overrides": []})
    old = tmp_path / "old.yaml"
    calibrate.write_profile(doc, old)
    # The refit samples are the ones written; their records lose the old fit's predictions.
    read, read_records = calibrate.samples_from_document(yaml.safe_load(old.read_text()))
    assert read == samples and all("residual" not in r for r in read_records)
    monkeypatch.setattr(prediction, "model_profile", lambda path, dtype, name: MODEL)
    out = tmp_path / "new.yaml"
    assert calibrate.main(["--refit", str(old), "--out", str(out), "--device-rates", "15,1"]) == 0
    new = yaml.safe_load(out.read_text())
    assert new["device_rates"]["copy_bandwidth_gbps"] == 15.0
    assert new["memory_bandwidth_gbps"] == pytest.approx(15 * 1.05, rel=1e-4)
    assert any("sits at its bound" in w for w in new["fit_warnings"])
    assert prediction.load_hardware_file(out).profile.memory_bandwidth == pytest.approx(15.75e9, rel=1e-4)
    with pytest.raises(ValueError, match="no 'samples'"):
        calibrate.samples_from_document({"name": "x"})


@pytest.mark.parametrize("bad", ["15", "15,x", "0,1", "-1,2"])
def test_bad_device_rates_are_refused_before_anything_runs(bad, capsys):
    assert calibrate.main([f"--device-rates={bad}"]) == 2
    assert "--device-rates must be GBPS,TFLOPS" in capsys.readouterr().err


def test_a_gpu_calibration_states_the_device_memory_so_the_fit_check_still_refuses(tmp_path, monkeypatch):
    # The device read is the probe's (gpu_timing.DeviceProbe.memory_bytes); a GPU's answer cannot be caused on this
    # CPU machine, so the test hands profile_document the figure an RTX 4090 reports (24564 MiB).
    from specbench.analytic import memory

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    samples, records = _synthetic_samples()
    profile, fitted = calibrate.fit(samples, records, MODEL, "gpu")
    common = {"model": {"name": "m", "path": "embedded:x", "dtype": "bfloat16"}, "device": "1x NVIDIA GeForce RTX 4090",
              "measured_at": "2026-01-01T00:00:00+00:00", "vllm_version": "0.32.0", "settings": {}}
    unpriced = calibrate.profile_document(profile, fitted, **common)
    with pytest.raises(memory.Unpriced):  # what a GPU calibration wrote before: no memory at all
        memory.budget(unpriced, {"gpu_memory_utilization": 0.9})
    doc = calibrate.profile_document(profile, fitted, **common, device_memory_bytes=25_757_220_864)
    assert doc["memory_bytes"] == 25_757_220_864 and doc["memory_gb"] == 25.8
    assert doc["max_num_batched_tokens"] == 8192  # vLLM's default for a 24 GB card
    calibrate.write_profile(doc, prediction.calibrated_path())
    budget = memory.budget(memory.resolve_hardware(None), {"gpu_memory_utilization": 0.9})
    assert budget.usable_bytes == int(25_757_220_864 * 0.9) and budget.kv_pool_bytes is None
    # The fit check prices cells with it again: a bf16 7B target with itself as draft does not fit 24 GB.
    cfg = {"engine": {"dtype": "bfloat16", "max_model_len": 2048, "max_num_seqs": 256, "enforce_eager": False,
                      "gpu_memory_utilization": 0.9, "max_num_batched_tokens": None},
           "workload": {"max_prompt_tokens": 512, "max_tokens": 128},
           "model": {"name": "qwen2.5-7b-instruct", "path": "Qwen/Qwen2.5-7B-Instruct", "dtype": "bfloat16"},
           "method": {"name": "draft_model", "speculative_config": {"model": "Qwen/Qwen2.5-7B-Instruct",
                                                                    "num_speculative_tokens": 4}},
           "num_speculative_tokens": 4, "batch_size": 1}
    problems = memory.fit_problems(cfg)
    assert len(problems) == 1 and "too big for the device" in problems[0] and "hardware=gpu" in problems[0]


def test_device_rates_are_timed_in_a_child_so_the_engine_finds_the_device_free(device_closed_here, monkeypatch):
    # vLLM refuses an engine unless gpu_memory_utilization x total is free (v1/worker/utils.py); on a 24 GB
    # card a context plus 2 GiB of cached timing buffers left in the calibrating process exceeds the headroom.
    # The timing itself fails here too, as it would if it ran in this process.
    import torch

    from specbench import gpu_timing

    def opened_here(*args, **kwargs):
        raise AssertionError("the calibrating process timed the device itself")

    monkeypatch.setattr(gpu_timing, "device_rates", opened_here)
    # The child is a fresh interpreter: none of the above reaches it, and with no CUDA it times the CPU.
    bounds = calibrate.measure_device_rates("float32", copy_bytes=1 << 16, matmul_size=16)
    assert bounds.copy_bandwidth > 0 and bounds.matmul_flops > 0 and "(cpu, float32" in bounds.source
    assert not torch.cuda.is_initialized()
    untimed = gpu_timing.DeviceProbe("cpu", "CPU", None, None, None)  # a probe asked for no tries
    with pytest.raises(ValueError, match="did not time"):
        calibrate.device_bounds(untimed, "float32")


def test_calibration_engines_capture_graphs_for_every_batch_they_decode():
    # The calibration cell's batch_size is 1; its engine decodes every batch of the grid, and the
    # draft engine batches of DRAFT_POINTS at K+1 tokens each: each step must replay a captured graph.
    points = calibrate.grid(calibrate.DEFAULT_BATCH_SIZES, calibrate.DEFAULT_PROMPT_LENGTHS, 8192)
    overrides = calibrate.engine_overrides([], 8192)
    sizes = calibrate.calibration_cell(overrides, points).engine_spec(prepare=False).cudagraph_capture_sizes
    assert {p.batch_size for p in points} <= set(sizes)
    heads, _ = calibrate._draft_cells(overrides)
    for cells in heads.values():
        for draft, k in zip(cells, calibrate.DRAFT_KS, strict=True):
            sizes = draft.engine_spec(prepare=False).cudagraph_capture_sizes
            assert {p.batch_size * (k + 1) for p in calibrate.DRAFT_POINTS} <= set(sizes), (draft.method, k)
    # A graph batch the overrides set is the user's to choose.
    mine = calibrate.calibration_cell([*overrides, "engine.cudagraph_batch_size=2"], points)
    assert mine.engine_spec(prepare=False).cudagraph_capture_sizes == (1, 2)


def test_every_shipped_head_is_timed_and_each_drafter_pays_its_own_heads_overhead(tmp_path, monkeypatch):
    # The default model ships an EAGLE-3 and an EAGLE-1 head: calibrate starts an engine for each.
    cells, skipped = calibrate._draft_cells(calibrate.engine_overrides([], 8192))
    assert list(cells) == ["eagle3", "eagle"] and skipped == ""
    assert [c[0].method for c in cells.values()] == ["eagle3", "eagle"]
    # A machine whose EAGLE-1 pass carries 1 ms of fixed cost and whose EAGLE-3 pass 4 ms (the order of
    # the 2-core machine's 3.97 ms), each pass timed at DRAFT_POINTS as vLLM would report it.
    true = {"eagle3": 4e-3, "eagle": 1e-3}
    machine = replace(TRUE, head_overheads=tuple(true.items()))
    records = {}
    for method in true:
        records[method] = []
        for p in calibrate.DRAFT_POINTS:
            context = p.prompt_len + 8
            seconds = steps.verify_step(MODEL, TRUE, p.batch_size, calibrate.DRAFT_K, context) + drafting.draft_time(
                method, hw=machine, batch_size=p.batch_size, k=calibrate.DRAFT_K, context_len=context, target=MODEL)
            _, record = calibrate.draft_sample(p, calibrate.DRAFT_K, 16, [(seconds * 10, 10)])
            records[method].append(record)
    fitted = {m: calibrate.fit_head(m, {"name": m}, records[m], MODEL, "float32", TRUE)[::2] for m in true}
    assert {m: o for m, (o, _) in fitted.items()} == pytest.approx(true, rel=1e-6)
    profile = calibrate.with_head_overheads(TRUE, {m: o for m, (o, _) in fitted.items()})
    samples, step_records = _synthetic_samples()
    _, step_fitted = calibrate.fit(samples, step_records, MODEL, "my-cpu")
    doc = calibrate.profile_document(
        profile, step_fitted, model={"name": "m", "path": "embedded:x", "dtype": "float32"}, device="CPU",
        measured_at="2026-01-01T00:00:00+00:00", vllm_version="0.32.0", settings={},
        draft_records=fitted["eagle3"][1], draft_method="eagle3", head_records={m: r for m, (_, r) in fitted.items()})
    assert doc["head_draft_overhead_ms"] == {"eagle3": 4.0, "eagle": 1.0} and doc["draft_overhead_ms"] == 4.0
    path = tmp_path / "p.yaml"
    calibrate.write_profile(doc, path)
    loaded = prediction.load_hardware_file(path).profile
    # Through the model's own pricing: EAGLE-1's draft is EAGLE-1's, no longer EAGLE-3's; a drafter
    # without a timed head of its own (a draft model) pays the first head's.
    for k in (2, 4, 8):
        priced = {m: drafting.draft_time(m, hw=loaded, batch_size=1, k=k, context_len=600.0, target=MODEL)
                  for m in ("eagle", "eagle3")}
        assert priced == pytest.approx({m: drafting.draft_time(m, hw=machine, batch_size=1, k=k, context_len=600.0,
                                                               target=MODEL) for m in priced}, rel=1e-6)
        as_before = drafting.draft_time("eagle", hw=replace(loaded, head_overheads=()), batch_size=1, k=k,
                                        context_len=600.0, target=MODEL)
        assert as_before - priced["eagle"] == pytest.approx(k * 3e-3, rel=1e-6)  # what EAGLE-3's overhead added
    assert loaded.for_drafter("draft_model").draft_pass_overhead_s == pytest.approx(4e-3)
    # A refit refits every head it finds (the target, and the heads' shapes, read as MODEL's).
    monkeypatch.setattr(prediction, "model_profile", lambda path, dtype, name="m": MODEL)
    out = tmp_path / "refit.yaml"
    assert calibrate.main(["--refit", str(path), "--out", str(out), "--device-rates", "40,1"]) == 0
    refit = yaml.safe_load(out.read_text())
    assert set(refit["head_draft_overhead_ms"]) == {"eagle3", "eagle"} and set(refit["head_draft_samples"]) == set(true)
    assert ("draft passes priced from their own head's (measured): eagle3 4.00 ms per pass, eagle 1.00 ms per pass; "
            "other drafters pay eagle3's 4.00 ms a pass") == calibrate.format_heads_timed(true, "")
    with pytest.raises(ValueError, match="head_draft_overhead_ms"):
        profiles.HardwareProfile.from_mapping(dict(doc, head_draft_overhead_ms=[1.0]))


def test_calibrate_fetches_every_engines_checkpoints_with_their_tokenizers_at_their_pinned_revisions(monkeypatch,
                                                                                                     capsys):
    # The fake stands for the hub and its cache: it records what calibrate asks for and refuses it, as a cache
    # without those files on a machine without network would, so that nothing after it (no tokenizer, no engine) runs.
    import yaml

    from specbench import hub

    asked = []

    def refuse(needed, tokenizers=None, revisions=None):
        asked.append((list(needed), tokenizers, revisions))
        raise hub.HubError("model.path=Qwen/Qwen2.5-7B-Instruct is not in the Hugging Face cache")

    monkeypatch.setattr(hub, "fetch_all", refuse)
    assert calibrate.main(["model=qwen2.5-7b-instruct"]) == 2
    assert "is not in the Hugging Face cache" in capsys.readouterr().err
    [(needed, tokenizers, revisions)] = asked
    # The target's engine, the EAGLE-3 head's (vLLM has no EAGLE-1 class for Qwen2: that head is not timed),
    # then ngram's, which loads the target alone.
    head = [("model.path", "Qwen/Qwen2.5-7B-Instruct"), ("model.eagle3", "thoughtworks/Qwen2.5-7B-Instruct-Eagle3")]
    assert needed == [("model.path", "Qwen/Qwen2.5-7B-Instruct"), *head * len(calibrate.DRAFT_KS),
                      ("model.path", "Qwen/Qwen2.5-7B-Instruct")]
    # The tokenizer vLLM loads (the target's), and every checkpoint at the commit its model config pins.
    assert set(tokenizers) == {"Qwen/Qwen2.5-7B-Instruct"}
    pins = yaml.safe_load((Path(calibrate.__file__).parent / "conf" / "model" / "qwen2.5-7b-instruct.yaml")
                          .read_text())["revisions"]
    assert revisions == {ref: pins[ref] for ref in ("Qwen/Qwen2.5-7B-Instruct", "thoughtworks/Qwen2.5-7B-Instruct-Eagle3")}
    assert all(hub.is_commit(pin) for pin in revisions.values())


def test_a_head_whose_passes_cost_less_than_its_priced_work_is_priced_at_its_measured_passes(tmp_path):
    # What calibrate met on a CPU: the EAGLE-1 head's passes (it reads the target's whole LM head each pass)
    # cost about 4 ms less than the roofline prices its work, at batch 1 and 4 alike, while the EAGLE-3 head's
    # cost 2 ms more. The passes are made here from the model's own pricing of each head's work with no
    # overhead at all, plus that constant.
    true = {"eagle3": 2e-3, "eagle": -4e-3}
    free = replace(TRUE, draft_overhead_s=0.0)

    def measured_pass(method, batch_size, k, context):
        work = drafting.draft_time(method, hw=free, batch_size=batch_size, k=k, context_len=context, target=MODEL)
        return steps.verify_step(MODEL, TRUE, batch_size, k, context) + work + k * true[method]

    records = {m: [calibrate.draft_sample(p, calibrate.DRAFT_K, 16, [(measured_pass(
        m, p.batch_size, calibrate.DRAFT_K, p.prompt_len + 8) * 10, 10)])[1] for p in calibrate.DRAFT_POINTS]
        for m in true}
    fitted = {m: calibrate.fit_head(m, {"name": m}, records[m], MODEL, "float32", TRUE)[::2] for m in true}
    # Floored at 0, EAGLE-1's correction was lost and each of its passes priced 4 ms high.
    assert {m: o for m, (o, _) in fitted.items()} == pytest.approx(true, rel=1e-6)
    assert all(abs(r["residual"]) < 1e-9 for _, rs in fitted.values() for r in rs)
    assert "below 0: its passes cost less than the roofline prices its work" in calibrate.format_draft_fit(
        "eagle", *fitted["eagle"])
    samples, step_records = _synthetic_samples()
    _, step_fitted = calibrate.fit(samples, step_records, MODEL, "my-cpu")
    doc = calibrate.profile_document(
        calibrate.with_head_overheads(TRUE, {m: o for m, (o, _) in fitted.items()}), step_fitted,
        model={"name": "m", "path": "embedded:x", "dtype": "float32"}, device="CPU",
        measured_at="2026-01-01T00:00:00+00:00", vllm_version="0.32.0", settings={},
        draft_records=fitted["eagle3"][1], draft_method="eagle3", head_records={m: r for m, (_, r) in fitted.items()})
    assert doc["head_draft_overhead_ms"] == {"eagle3": 2.0, "eagle": -4.0}
    assert "priced from its own timed passes (measured, head_draft_samples): eagle3, eagle" in doc["notes"]
    path = tmp_path / "p.yaml"
    calibrate.write_profile(doc, path)
    loaded = prediction.load_hardware_file(path).profile
    # Through the model's pricing of the written profile: every K prices each head's passes as measured.
    for method in true:
        for k in (2, 4, 8):
            for batch_size, context in ((1, 300.0), (4, 600.0)):
                priced = steps.verify_step(MODEL, loaded, batch_size, k, context) + drafting.draft_time(
                    method, hw=loaded, batch_size=batch_size, k=k, context_len=context, target=MODEL)
                assert priced == pytest.approx(measured_pass(method, batch_size, k, context), rel=1e-6)
    # A drafter without a head of its own pays the first head's overhead, never a negative one.
    assert loaded.for_drafter("draft_model").draft_pass_overhead_s == pytest.approx(2e-3)
    eagle_first = calibrate.with_head_overheads(TRUE, {"eagle": -4e-3})
    assert eagle_first.draft_overhead_s == 0.0 and eagle_first.for_drafter("eagle").draft_pass_overhead_s == 0.0


def test_a_signed_draft_correction_never_prices_a_pass_below_nothing():
    # Passes faster than verification alone: no correction explains them; the draft is priced free, not negative.
    free = replace(TRUE, draft_overhead_s=0.0)
    fast = [profile_fit.DraftSample(p.batch_size, 3, p.prompt_len + 8.0,
                                    0.5 * steps.verify_step(MODEL, TRUE, p.batch_size, 3, p.prompt_len + 8.0))
            for p in calibrate.DRAFT_POINTS]
    overhead, residuals = profile_fit.fit_draft_overhead(fast, method="eagle", target=MODEL, head=None, hw=TRUE,
                                                         signed=True)
    work = [drafting.draft_time("eagle", hw=free, batch_size=s.batch_size, k=1, context_len=s.context_len,
                                target=MODEL) for s in fast]
    assert overhead == pytest.approx(-min(work)) and min(residuals) > 0.5
    hw = replace(TRUE, head_overheads=(("eagle", -10.0),))  # a correction larger than any pass's work
    assert drafting.draft_time("eagle", hw=hw, batch_size=1, k=4, context_len=100.0, target=MODEL) == 0.0
    # Unsigned, as the GPU's head-step fit and any other caller use it: floored at 0.
    assert profile_fit.fit_draft_overhead(fast, method="eagle", target=MODEL, head=None, hw=TRUE)[0] == 0.0


def _timed_engine(measured: list, started: list | None = None) -> type:
    """An EngineWorker that times passes as a machine with TRUE's rates would, recording each measurement as
    (engine, batch, prompt tokens) in ``measured`` and each engine's method, as it starts, in ``started``."""
    from types import SimpleNamespace

    from specbench.measure import Measurement, SpecCounters

    target = prediction.model_profile("embedded:smollm2-135m-instruct", "float32")

    class TimedEngine:
        def __init__(self, spec, log_path=None):
            self.drafts = spec.speculative_config_json is not None
            self.lookup = self.drafts and spec.speculative_config["method"] == "ngram"
            self.info = SimpleNamespace(machine="CPU test machine (2 cores)", vllm_version="0.32.0")
            if started is not None:
                started.append(spec.speculative_config["method"] if self.drafts else "baseline")

        def measure(self, plan):
            batch, prompt = plan.batch_size, len(plan.prompts[0])
            measured.append(("lookup" if self.lookup else "draft" if self.drafts else "target", batch, prompt))
            step = steps.step_time(target, TRUE, num_tokens=batch, num_seqs=batch, context_len=prompt + 12)
            prefill = steps.prefill_time(target, TRUE, batch, prompt, max_step_tokens=4096)
            tokens = batch * plan.max_tokens
            if self.lookup:  # 20 decode passes, each verifying one draft token and 3 ms of host work
                verify = steps.verify_step(target, TRUE, batch, calibrate.DRAFT_K, prompt + 12, 1.0)
                return Measurement(rep_wall_s=[1.0], rep_output_tokens=[tokens], prompt_tokens=batch * prompt,
                                   token_ids=[], outputs_stable=True, counters=SpecCounters(drafts=20, draft_tokens=20),
                                   ttft_s=[prefill] * batch, tpot_s=[step] * batch, decode_s=20 * (verify + 3e-3),
                                   request_decode_passes=[20])
            return Measurement(rep_wall_s=[1.0], rep_output_tokens=[tokens], prompt_tokens=batch * prompt,
                               token_ids=[], outputs_stable=True, counters=SpecCounters(drafts=10 if self.drafts else 0),
                               ttft_s=[prefill] * batch, tpot_s=[step] * batch, decode_s=4 * step * 10)

        def close(self):
            pass

    return TimedEngine


def test_a_calibration_times_each_grid_point_once_a_round_and_each_head_at_batch_1(tmp_path, monkeypatch, capsys):
    # Through calibrate.main, on engines that time passes as a machine with TRUE's rates would: the target's
    # engine measures every grid point once per round, each head's engine its one draft point once per round,
    # and so does an ngram engine, whose passes carry 3 ms of host work beyond verifying one draft token.
    measured: list[tuple[str, int, int]] = []  # (engine, batch, prompt tokens)
    TimedEngine = _timed_engine(measured)
    monkeypatch.setattr(calibrate, "EngineWorker", TimedEngine)
    out = tmp_path / "calibrated.yaml"
    for rounds in (1, 2):
        measured.clear()
        assert calibrate.main([f"--rounds={rounds}", "--device-rates", "40,1", "--out", str(out)]) == 0
        points = calibrate.grid(calibrate.DEFAULT_BATCH_SIZES, calibrate.DEFAULT_PROMPT_LENGTHS, 4096)
        assert [m for m in measured if m[0] == "target"] == [("target", p.batch_size, p.prompt_len)
                                                           for _ in range(rounds) for p in points]
        # EAGLE-3's and EAGLE-1's heads, each at batch 1 only and at both K; ngram's steps too.
        assert [m for m in measured if m[0] == "draft"] == [("draft", 1, 512)] * (2 * len(calibrate.DRAFT_KS) * rounds)
        assert [m for m in measured if m[0] == "lookup"] == [("lookup", 1, 512)] * rounds
        doc = yaml.safe_load(out.read_text())
        assert doc["head_draft_overhead_ms"]["ngram"] == pytest.approx(3.0, rel=1e-3)
        assert list(doc["head_draft_overhead_ms"])[0] == "eagle3" and doc["lookup_samples"]["ngram"][0]["drafted_per_pass"] == 1.0
        loaded = prediction.load_hardware_file(out).profile
        assert drafting.draft_time("ngram", hw=loaded, batch_size=1, k=4, context_len=600.0) == pytest.approx(3e-3, rel=1e-3)
        assert doc["settings"]["rounds"] == rounds and len(doc["samples"]) == 2 * len(points)
        assert {m: sorted(r["k"] for r in s) for m, s in doc["head_draft_samples"].items()} == {
            m: list(calibrate.DRAFT_KS) for m in ("eagle3", "eagle")}


def test_ngram_steps_are_timed_and_priced_with_the_host_work_beyond_their_verification(tmp_path, monkeypatch):
    # An ngram engine at DRAFT_K, beside the heads' engines.
    planned = calibrate.planned_engines(calibrate.argument_parser().parse_args([]))
    assert list(planned.lookups) == ["ngram"] and planned.cells[-1].method == "ngram"
    assert planned.lookups["ngram"].identity["method"]["speculative_config"]["num_speculative_tokens"] == calibrate.DRAFT_K
    # Two rounds of 23 passes that verified 1.5 draft tokens each: the faster round is kept, with what it drafted.
    point = calibrate.DRAFT_POINTS[0]
    context = point.prompt_len + 12
    verify = steps.verify_step(MODEL, TRUE, 1, calibrate.DRAFT_K, context, 1.5)
    sample, record = calibrate.lookup_sample(point, calibrate.DRAFT_K, 24,
                                             [(23 * (verify + 0.009), 23, 34), (23 * (verify + 0.004), 23, 34.5)])
    assert sample.seconds == pytest.approx(verify + 0.004) and sample.drafted == pytest.approx(1.5)
    overhead, records = calibrate.fit_lookup([record], MODEL, TRUE)
    assert overhead == pytest.approx(0.004) and records[0]["residual"] == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="no decode pass was timed"):
        calibrate.lookup_sample(point, calibrate.DRAFT_K, 24, [(1.0, 0, 0)])
    # Written after the heads (the first head's is the draft overhead other drafters pay), read back, refit.
    profile = calibrate.with_lookup_overheads(calibrate.with_head_overheads(TRUE, {"eagle3": 2e-3}), {"ngram": overhead})
    assert profile.draft_overhead_s == pytest.approx(2e-3)
    samples, step_records = _synthetic_samples()
    _, step_fitted = calibrate.fit(samples, step_records, MODEL, "my-cpu")
    doc = calibrate.profile_document(
        profile, step_fitted, model={"name": "m", "path": "embedded:x", "dtype": "float32"}, device="CPU",
        measured_at="2026-01-01T00:00:00+00:00", vllm_version="0.32.0", settings={}, lookup_records={"ngram": records})
    assert doc["head_draft_overhead_ms"] == {"eagle3": 2.0, "ngram": 4.0} and doc["draft_overhead_ms"] == 2.0
    path = tmp_path / "p.yaml"
    calibrate.write_profile(doc, path)
    loaded = prediction.load_hardware_file(path).profile
    for k in (2, 8):
        assert drafting.draft_time("ngram", hw=loaded, batch_size=1, k=k, context_len=600.0) == pytest.approx(0.004)
    monkeypatch.setattr(prediction, "model_profile", lambda path, dtype, name="m": MODEL)
    out = tmp_path / "refit.yaml"
    assert calibrate.main(["--refit", str(path), "--out", str(out), "--device-rates", "40,1"]) == 0
    refit = yaml.safe_load(out.read_text())
    assert set(refit["lookup_samples"]) == {"ngram"} and refit["head_draft_overhead_ms"]["ngram"] > 0


def _two_cost_passes(method, per_pass, per_step, ks, points=calibrate.DRAFT_POINTS):
    """Each head's timed pass at each K of ``ks``, as a machine whose head costs its roofline work, plus
    ``per_pass`` a draft pass and ``per_step`` once a speculative step, would time it (draft_sample records)."""
    free = replace(TRUE, draft_overhead_s=0.0)
    records = []
    for k in ks:
        for p in points:
            context = p.prompt_len + 8
            seconds = (steps.verify_step(MODEL, TRUE, p.batch_size, k, context) + per_step
                       + drafting.draft_time(method, hw=free, batch_size=p.batch_size, k=k, context_len=context,
                                             target=MODEL) + k * per_pass)
            records.append(calibrate.draft_sample(p, k, 16, [(seconds * 10, 10)])[1])
    return records


def test_the_two_k_fit_separates_a_heads_cost_per_step_from_its_cost_per_pass():
    # What the headline met on a CPU: EAGLE-1's speculative step grew ~6 ms a draft pass where one figure per
    # pass, fitted at one K, priced 9.5: a cost paid once a step (the proposer's set-up, the first pass over the
    # accepted positions) was spread over the three passes timed and multiplied at K = 8.
    per_pass, per_step = -0.5e-3, 9e-3
    samples = [profile_fit.DraftSample(r["batch_size"], r["k"], r["context_len"], r["seconds_per_pass"])
               for r in _two_cost_passes("eagle", per_pass, per_step, calibrate.DRAFT_KS)]
    fitted_pass, fitted_step, residuals = profile_fit.fit_draft_costs(samples, method="eagle", target=MODEL,
                                                                      head=None, hw=TRUE)
    assert (fitted_pass, fitted_step) == pytest.approx((per_pass, per_step), rel=1e-6)
    assert max(map(abs, residuals)) < 1e-9
    # Noise on the samples: least squares over more than two K still finds both.
    noisy = [replace(s, seconds=s.seconds * (1.0 + 0.002 * (-1) ** i))
             for i, s in enumerate(samples + [profile_fit.DraftSample(r["batch_size"], r["k"], r["context_len"],
                                                                      r["seconds_per_pass"])
                                              for r in _two_cost_passes("eagle", per_pass, per_step, (4, 6))])]
    fitted_pass, fitted_step, _ = profile_fit.fit_draft_costs(noisy, method="eagle", target=MODEL, head=None, hw=TRUE)
    assert fitted_step == pytest.approx(per_step, abs=1e-3) and fitted_pass == pytest.approx(per_pass, abs=0.3e-3)
    # One K cannot tell them apart, nor one sample; each is refused in one line naming what is missing.
    at_three = [profile_fit.DraftSample(r["batch_size"], r["k"], r["context_len"], r["seconds_per_pass"])
                for r in _two_cost_passes("eagle", per_pass, per_step, (3, 3))]
    with pytest.raises(ValueError, match="two K or more .* all are at K=3"):
        profile_fit.fit_draft_costs(at_three, method="eagle", target=MODEL, head=None, hw=TRUE)
    with pytest.raises(ValueError, match="at least 2 passes"):
        profile_fit.fit_draft_costs(samples[:1], method="eagle", target=MODEL, head=None, hw=TRUE)
    with pytest.raises(ValueError, match="EAGLE head"):
        profile_fit.fit_draft_costs(samples, method="ngram", target=MODEL, head=None, hw=TRUE)


def test_a_calibration_at_two_k_prices_every_k_of_the_head_and_the_one_k_fit_did_not(tmp_path, monkeypatch, capsys):
    per_pass, per_step = {"eagle3": 2e-3, "eagle": -0.5e-3}, {"eagle3": 1e-3, "eagle": 9e-3}
    # Each head's cells are composed at both K, its head's engine spec drafting that K (pure: no engine).
    cells, _ = calibrate._draft_cells(calibrate.engine_overrides([], 8192))
    for method in per_pass:
        assert [c.engine_spec(prepare=False).speculative_config["num_speculative_tokens"]
                for c in cells[method]] == list(calibrate.DRAFT_KS)
    fitted = {m: calibrate.fit_head(m, {"name": m}, _two_cost_passes(m, per_pass[m], per_step[m], calibrate.DRAFT_KS),
                                    MODEL, "float32", TRUE) for m in per_pass}
    for m, f in fitted.items():
        assert f[:2] == pytest.approx((per_pass[m], per_step[m]))
    text = calibrate.format_draft_fit("eagle", *fitted["eagle"][::2], fitted["eagle"][1])
    assert "-0.50 ms per draft pass + 9.00 ms per speculative step, whatever K (fitted at K=2, 8)" in text
    assert "eagle -0.50 ms per pass + 9.00 ms per step" in calibrate.format_heads_timed(
        {m: f[0] for m, f in fitted.items()}, "", {m: f[1] for m, f in fitted.items()})
    profile = calibrate.with_head_overheads(TRUE, {m: f[0] for m, f in fitted.items()},
                                            {m: f[1] for m, f in fitted.items()})
    samples, step_records = _synthetic_samples()
    _, step_fitted = calibrate.fit(samples, step_records, MODEL, "my-cpu")
    doc = calibrate.profile_document(
        profile, step_fitted, model={"name": "m", "path": "embedded:x", "dtype": "float32"}, device="CPU",
        measured_at="2026-01-01T00:00:00+00:00", vllm_version="0.32.0", settings={},
        draft_records=fitted["eagle3"][2], draft_method="eagle3", head_records={m: f[2] for m, f in fitted.items()})
    assert doc["head_draft_step_overhead_ms"] == {"eagle3": 1.0, "eagle": 9.0}
    path = tmp_path / "p.yaml"
    calibrate.write_profile(doc, path)
    loaded = prediction.load_hardware_file(path).profile
    free = replace(TRUE, draft_overhead_s=0.0)
    for method in per_pass:
        one_pass = drafting.draft_time(method, hw=free, batch_size=1, k=1, context_len=600.0, target=MODEL)
        for k in (2, 4, 8):
            # The model's speculative step: the per-step cost once, the per-pass cost k times.
            step = speedup.speculative_step(method, target=MODEL, hw=loaded, batch_size=1, k=k, context_len=600.0)
            assert step == pytest.approx(steps.verify_step(MODEL, loaded, 1, k, 600.0) + per_step[method]
                                         + k * (one_pass + per_pass[method]), rel=1e-9)
    # Fitted at one K (3) as before, the same machine's EAGLE-1 step is priced 9 ms / 3 too high a pass:
    # at K = 8 its draft 15 ms over what it costs.
    one_k, _ = profile_fit.fit_draft_overhead(
        [profile_fit.DraftSample(r["batch_size"], r["k"], r["context_len"], r["seconds_per_pass"])
         for r in _two_cost_passes("eagle", per_pass["eagle"], per_step["eagle"], (3,))],
        method="eagle", target=MODEL, head=None, hw=TRUE, signed=True)
    assert one_k == pytest.approx(per_pass["eagle"] + per_step["eagle"] / 3)
    old = replace(TRUE, head_overheads=(("eagle", one_k),))
    over = (drafting.draft_time("eagle", hw=old, batch_size=1, k=8, context_len=600.0, target=MODEL)
            - drafting.draft_time("eagle", hw=loaded, batch_size=1, k=8, context_len=600.0, target=MODEL))
    assert over == pytest.approx(5 * per_step["eagle"] / 3, rel=1e-6)
    # --refit fits both again from the stored samples at both K.
    monkeypatch.setattr(prediction, "model_profile", lambda path, dtype, name="m": MODEL)
    out = tmp_path / "refit.yaml"
    assert calibrate.main(["--refit", str(path), "--out", str(out), "--device-rates", "40,1"]) == 0
    refit = yaml.safe_load(out.read_text())
    assert refit["head_draft_step_overhead_ms"] == pytest.approx({"eagle3": 1.0, "eagle": 9.0}, rel=1e-3)
    assert "+ 9.00 ms per speculative step" in capsys.readouterr().out


def test_a_profile_timed_at_one_k_loads_and_prices_as_it_did(tmp_path, monkeypatch):
    # A profile written before heads were timed at two K: no head_draft_step_overhead_ms, its draft samples at
    # one K. It loads with no cost per step, prices every K as per-pass x K, and a refit keeps it so.
    records = _two_cost_passes("eagle", -0.5e-3, 0.0, (3,))
    overhead, per_step, fitted = calibrate.fit_head("eagle", {"name": "eagle"}, records, MODEL, "float32", TRUE)
    assert overhead == pytest.approx(-0.5e-3) and per_step == 0.0
    samples, step_records = _synthetic_samples()
    _, step_fitted = calibrate.fit(samples, step_records, MODEL, "my-cpu")
    doc = calibrate.profile_document(
        calibrate.with_head_overheads(TRUE, {"eagle": overhead}, {"eagle": per_step}), step_fitted,
        model={"name": "m", "path": "embedded:x", "dtype": "float32"}, device="CPU",
        measured_at="2026-01-01T00:00:00+00:00", vllm_version="0.32.0", settings={},
        draft_records=fitted, draft_method="eagle", head_records={"eagle": fitted})
    assert "head_draft_step_overhead_ms" not in doc
    loaded = profiles.HardwareProfile.from_mapping(doc)
    assert loaded.head_step_overheads == ()
    as_written = replace(loaded, head_step_overheads=())
    free = replace(TRUE, draft_overhead_s=0.0)
    for k in (2, 8):
        one_pass = drafting.draft_time("eagle", hw=free, batch_size=1, k=1, context_len=600.0, target=MODEL)
        priced = drafting.draft_time("eagle", hw=loaded, batch_size=1, k=k, context_len=600.0, target=MODEL)
        assert priced == pytest.approx(k * (one_pass - 0.5e-3), rel=1e-9)
        assert priced == drafting.draft_time("eagle", hw=as_written, batch_size=1, k=k, context_len=600.0, target=MODEL)
    path = tmp_path / "old.yaml"
    calibrate.write_profile(doc, path)
    monkeypatch.setattr(prediction, "model_profile", lambda path, dtype, name="m": MODEL)
    out = tmp_path / "refit.yaml"
    assert calibrate.main(["--refit", str(path), "--out", str(out), "--device-rates", "40,1"]) == 0
    refit = yaml.safe_load(out.read_text())
    assert "head_draft_step_overhead_ms" not in refit and refit["head_draft_overhead_ms"]["eagle"] < 0
    with pytest.raises(ValueError, match="head_draft_step_overhead_ms"):
        profiles.HardwareProfile.from_mapping(dict(doc, head_draft_step_overhead_ms=[1.0]))


def test_heads_left_out_are_not_timed_and_a_bad_heads_value_is_refused_before_any_engine(capsys):
    # Two engines per head: a demo whose sweep runs EAGLE-3 alone can leave EAGLE-1 untimed, said as such.
    planned = calibrate.planned_engines(calibrate.argument_parser().parse_args(["--heads", "eagle3"]))
    assert list(planned.heads) == ["eagle3"] and planned.skipped == "eagle: left out by --heads"
    assert [c.method for c in planned.cells] == ["baseline", "eagle3", "eagle3", "ngram"]
    assert "(not timed: eagle: left out by --heads)" in calibrate.format_heads_timed({"eagle3": 2e-3}, planned.skipped)
    assert calibrate.main(["--heads", "eagle,medusa"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --heads expects a comma-separated list of eagle3, eagle (or none); got 'eagle,medusa'")
    # A grid with no head (the demo's, with method=ngram) times none.
    planned = calibrate.planned_engines(calibrate.argument_parser().parse_args(["--heads", "none"]))
    assert planned.heads == {} and [c.method for c in planned.cells] == ["baseline", "ngram"]


def test_a_head_left_out_is_recorded_and_added_later_on_its_own_engines(tmp_path, monkeypatch):
    # make demo's calibration (--heads eagle3) records EAGLE-1 as left out, which refuses its sweeps
    # (prediction.heads_left_out); --add-heads eagle then times EAGLE-1 alone, at both K, and adds it.
    measured: list[tuple[str, int, int]] = []
    started: list[str] = []
    monkeypatch.setattr(calibrate, "EngineWorker", _timed_engine(measured, started))
    out = tmp_path / "calibrated.yaml"
    monkeypatch.setattr(prediction, "calibrated_path", lambda: out)
    assert calibrate.main(["--rounds=1", "--heads", "eagle3", "--device-rates", "40,1"]) == 0
    assert started == ["baseline", "eagle3", "eagle3", "ngram"]
    before = yaml.safe_load(out.read_text())
    assert before["settings"]["heads_left_out"] == ["eagle"] and set(before["head_draft_samples"]) == {"eagle3"}
    assert prediction.heads_left_out(["ngram", "eagle"], None) == ["eagle"]
    assert prediction.heads_left_out(["ngram", "eagle3"], None) == []

    started.clear()
    measured.clear()
    assert calibrate.main(["--add-heads", "eagle"]) == 0
    assert started == ["eagle"] * len(calibrate.DRAFT_KS) and {m[0] for m in measured} == {"draft"}
    after = yaml.safe_load(out.read_text())
    assert after["settings"]["heads_left_out"] == [] and prediction.heads_left_out(["eagle"], None) == []
    assert sorted(r["k"] for r in after["head_draft_samples"]["eagle"]) == list(calibrate.DRAFT_KS)
    # What was there stays: the target's samples and fit, EAGLE-3's and ngram's costs, the draft overhead
    # other drafters pay (EAGLE-3's, the first head's).
    for key in ("samples", "memory_bandwidth_gbps", "fixed_overhead_ms", "draft_overhead_ms", "lookup_samples"):
        assert after[key] == before[key]
    assert {m: after["head_draft_overhead_ms"][m] for m in ("eagle3", "ngram")} == {
        m: before["head_draft_overhead_ms"][m] for m in ("eagle3", "ngram")}
    # EAGLE-1 fitted as a full calibration fits it: the same cost per pass, priced with its own head.
    monkeypatch.setattr(calibrate, "EngineWorker", _timed_engine([]))
    full = tmp_path / "full.yaml"
    assert calibrate.main(["--rounds=1", "--device-rates", "40,1", "--out", str(full)]) == 0
    whole = yaml.safe_load(full.read_text())
    assert after["head_draft_overhead_ms"]["eagle"] == pytest.approx(whole["head_draft_overhead_ms"]["eagle"], rel=1e-6)
    loaded = prediction.load_hardware_file(out).profile
    assert dict(loaded.head_overheads)["eagle"] == pytest.approx(after["head_draft_overhead_ms"]["eagle"] / 1e3)
    assert whole["settings"]["heads_left_out"] == []


def test_add_heads_refuses_without_a_profile_or_with_a_bad_head(tmp_path, capsys):
    assert calibrate.main(["--add-heads", "medusa", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "--add-heads expects a comma-separated list of eagle3, eagle; got 'medusa'" in capsys.readouterr().err
    assert calibrate.main(["--add-heads", "eagle", "--out", str(tmp_path / "p.yaml")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'p.yaml'}: ")


def _cell(*overrides: str, method: str = "eagle3"):
    from specbench.config import cell_from_config

    return cell_from_config(calibrate._compose(list(overrides), (f"method={method}",)))


def test_a_narrowed_calibration_records_its_range_and_a_sweep_outside_it_has_the_rest_timed_first(tmp_path, monkeypatch):
    # make demo's calibration measures what its grid prices (batch 1 and 4 at 16 and 512 tokens, EAGLE-3 at K=4):
    # 4 grid points of 8 and one head engine of two, said in the profile. A later sweep outside that range has
    # the rest of the default calibration timed first and is priced as after a full one; a sweep inside it,
    # nothing; where the timing fails, the sweep is refused naming the command.
    measured: list[tuple[str, int, int]] = []
    started: list[str] = []
    monkeypatch.setattr(calibrate, "EngineWorker", _timed_engine(measured, started))
    out = tmp_path / "calibrated.yaml"
    monkeypatch.setattr(prediction, "calibrated_path", lambda: out)
    assert calibrate.main(["--rounds=1", "--heads", "eagle3", "--batch-sizes", "1,4", "--prompt-lengths", "16,512",
                           "--draft-ks", "4", "--device-rates", "40,1"]) == 0
    assert started == ["baseline", "eagle3", "ngram"]
    assert sorted(m[1:] for m in measured if m[0] == "target") == [(1, 16), (1, 512), (4, 16), (4, 512)]
    narrowed = yaml.safe_load(out.read_text())
    assert narrowed["settings"]["narrowed_to"] == {"batch_sizes": [1, 4], "prompt_lengths": [16, 512], "draft_ks": [4]}
    assert [r["k"] for r in narrowed["head_draft_samples"]["eagle3"]] == [4]

    demo_cells = [_cell("sweep=cpu_demo", f"batch_size={b}", f"workload={w}", method=m)
                  for b in (1, 4) for w in ("summarize", "creative") for m in ("baseline", "ngram", "eagle3")]
    head_ks = {"eagle3": {4}, "eagle": set(calibrate.DRAFT_KS)}  # EAGLE-1 added later (--add-heads): at both K

    def gaps_of(cells):
        return prediction.coverage_gaps(narrowed["settings"]["narrowed_to"], map(calibrate.priced_extent, cells),
                                        head_ks)

    assert gaps_of(demo_cells) == []
    outside = [_cell("sweep=cpu_demo", "batch_size=16"), _cell("sweep=cpu_demo", "num_speculative_tokens=2"),
               _cell("sweep=cpu_demo", "workload.max_prompt_tokens=1024", method="ngram")]
    assert gaps_of([_cell("sweep=cpu_demo", "num_speculative_tokens=2", method="eagle")]) == []
    gaps = gaps_of(outside)
    assert gaps[0] == "batch 16 above its 4" and "eagle3 at K=2, its head timed at K=4" in gaps
    assert any(g.startswith("summarize prompts of up to ") and g.endswith("above its 512") for g in gaps)

    started.clear()
    measured.clear()
    calibrate.time_missing(demo_cells, None, False)  # inside the range: nothing timed
    calibrate.time_missing(outside, {"name": "rtx4090"}, False)  # priced with a named profile: nothing timed
    assert started == []
    monkeypatch.setattr(calibrate, "complete", lambda path, verbose: 1)
    with pytest.raises(calibrate.ConfigError, match="`python -m specbench.calibrate --complete` times it"):
        calibrate.time_missing(outside[:1], None, False)
    monkeypatch.undo()
    monkeypatch.setattr(calibrate, "EngineWorker", _timed_engine(measured, started))
    monkeypatch.setattr(prediction, "calibrated_path", lambda: out)
    calibrate.time_missing(outside[:1], None, False)
    # The target's engine for the 4 points left out, then EAGLE-3's head at both default K; ngram's stays.
    assert started == ["baseline", "eagle3", "eagle3"]
    assert sorted(m[1:] for m in measured if m[0] == "target") == [(1, 1024), (4, 1024), (16, 16), (64, 16)]
    completed = yaml.safe_load(out.read_text())
    assert "narrowed_to" not in completed["settings"] and "refit_from" not in completed["settings"]
    assert sorted(r["k"] for r in completed["head_draft_samples"]["eagle3"]) == list(calibrate.DRAFT_KS)
    assert completed["draft_samples"]["method"] == "eagle3" and len(completed["draft_samples"]["samples"]) == 2
    started.clear()
    calibrate.time_missing(outside, None, False)  # completed: nothing more to time
    assert started == []
    # As a full calibration on the same engines fits it: the target's rates, each drafter's costs.
    full = tmp_path / "full.yaml"
    assert calibrate.main(["--rounds=1", "--heads", "eagle3", "--device-rates", "40,1", "--out", str(full)]) == 0
    whole = yaml.safe_load(full.read_text())
    assert "narrowed_to" not in whole["settings"] and len(completed["samples"]) == len(whole["samples"])
    for key in ("memory_bandwidth_gbps", "peak_tflops", "fixed_overhead_ms", "kv_bandwidth_gbps", "draft_overhead_ms"):
        assert completed[key] == pytest.approx(whole[key], rel=1e-6), key
    for key in ("head_draft_overhead_ms", "head_draft_step_overhead_ms"):
        assert completed[key] == pytest.approx(whole[key], rel=1e-6, abs=1e-9), key


def _narrower_line(out: str) -> str | None:
    """The line of ``out`` that names a narrowed calibration's gaps, if any (one at most)."""
    lines = [line for line in out.splitlines() if "was measured for a narrower sweep" in line]
    assert len(lines) <= 1, lines
    return lines[0] if lines else None


def test_the_plan_says_which_cells_a_narrowed_calibration_prices_outside_its_range(narrowed_profile, monkeypatch,
                                                                                     capsys):
    # make demo's grid lies inside what its narrowed calibration measured: no word of it. A wider grid is priced
    # outside it: one line names what, says its predictions are extrapolated and which command measures the rest;
    # the plan itself times nothing.
    from specbench import plan

    started: list[str] = []
    monkeypatch.setattr(calibrate, "EngineWorker", _timed_engine([], started))
    assert plan.main(["sweep=cpu_demo"]) == 0
    assert _narrower_line(capsys.readouterr().out) is None
    assert plan.main(["sweep=cpu_demo", "batch_size=1,16", "num_speculative_tokens=2"]) == 0
    line = _narrower_line(capsys.readouterr().out)
    assert line is not None and line.startswith(f"the calibrated profile {narrowed_profile} was measured")
    assert "(batch 16 above its 4; eagle3 at K=2, its head timed at K=4)" in line
    assert "the predictions for those cells are extrapolated" in line
    assert "`python -m specbench.calibrate --complete` times the rest" in line
    assert started == [] and "narrowed_to" in narrowed_profile.read_text()  # nothing timed, nothing completed
    # Priced with a named profile, the calibrated one's range does not matter.
    assert plan.main(["sweep=cpu_demo", "batch_size=16", "hardware=cpu-amd-epyc-2-cores"]) == 0
    assert _narrower_line(capsys.readouterr().out) is None


def test_draft_ks_are_checked_before_any_engine(capsys):
    assert calibrate.main(["--draft-ks", "4,0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --draft-ks expects comma-separated positive integers, got '4,0'"


def test_complete_leaves_a_full_calibration_alone_and_refuses_without_a_profile(tmp_path, monkeypatch, capsys):
    started: list[str] = []
    monkeypatch.setattr(calibrate, "EngineWorker", _timed_engine([], started))
    full = tmp_path / "full.yaml"
    assert calibrate.main(["--rounds=1", "--heads", "eagle3", "--device-rates", "40,1", "--out", str(full)]) == 0
    before, started[:] = full.read_text(), []
    assert calibrate.main(["--complete", "--out", str(full)]) == 0
    assert started == [] and full.read_text() == before
    assert "(not narrowed: nothing to complete)" in capsys.readouterr().out
    assert calibrate.main(["--complete", "--out", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'none.yaml'}: ")
