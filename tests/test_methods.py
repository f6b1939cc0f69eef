"""The method registry: one entry (plus its conf/method/<name>.yaml) makes a method known everywhere;
a method with a drafter of its own adds its cost model, and touches nothing else."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rows import make_row
from specbench import config, methods
from specbench.analytic import drafting, prediction, profiles, steps
from specbench.results.schema import method_label, method_variant

TOY_YAML = """\
# Prompt lookup over longer n-grams: a toy method added the way docs/architecture.md says.
name: toy
speculative_config:
  method: ngram
  num_speculative_tokens: ${num_speculative_tokens}
  prompt_lookup_min: 3
  prompt_lookup_max: 8
"""


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The method registry and the cost models, restored after the test."""
    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))
    monkeypatch.setattr(drafting, "COST_MODELS", dict(drafting.COST_MODELS))


def test_every_registered_method_has_a_config_and_a_price_the_theory_knows():
    conf = Path(config.__file__).parent / "conf" / "method"
    for name in methods.names():
        assert (conf / f"{name}.yaml").is_file(), name
        assert methods.cost(name) in drafting.COST_MODELS, name
    assert {p.stem for p in conf.glob("*.yaml")} == set(methods.names())


def test_each_method_specific_key_is_typed_and_read_by_a_registered_method():
    conf = Path(config.__file__).parent / "conf" / "method"
    # k_schedule is every scheduling method's (methods.check_schedule), not one method's own key.
    fields = set(methods.MethodSchema.__dataclass_fields__) - {"name", "speculative_config", methods.SCHEDULE}
    assert fields == set(methods.own_keys())
    for key, reader in methods.own_keys().items():
        assert methods.get(reader) is not None, reader
        assert f"\n{key}:" in "\n" + (conf / f"{reader}.yaml").read_text(), (key, reader)


@pytest.mark.parametrize(("method", "k", "label", "variant"), [
    ({"name": "baseline"}, 0, "baseline", "baseline"),
    ({"name": "ngram"}, 4, "ngram K=4", "ngram"),
    ({"name": "controlled", "alpha": 0.6}, 4, "controlled alpha=0.6 K=4", "controlled alpha=0.6"),
    ({"name": "draft_model", "draft": "l24"}, 2, "draft_model/l24 K=2", "draft_model/l24"),
    ({"name": "eagle3"}, 8, "eagle3 K=8", "eagle3"),
    ({"name": "ngram", "k_schedule": [[1, 4, 4], [5, 5, 3], [6, 64, 2]]}, 4, "ngram K=[1-4:4, 5:3, 6-64:2]", "ngram"),
    ({"name": "medusa"}, 3, "medusa K=3", "medusa"),  # not registered: its name
])
def test_a_label_names_the_method_its_own_keys_and_k(method, k, label, variant):
    assert methods.label(method, k) == label
    # Rows written before the column (schema 7) get the same label from their config on read.
    row = {"method": method["name"], "num_speculative_tokens": k,
           "config_json": json.dumps({"method": method, "num_speculative_tokens": k})}
    assert method_label(row) == label and method_variant(row) == variant
    assert method_label(row | {"method_label": "as written"}) == "as written"


def test_a_methods_own_hooks_reach_its_cell_and_engine(compose_cell):
    from specbench import controlled

    cell = config.cell_from_config(compose_cell(["method=controlled", "method.alpha=0.5"]))
    assert cell.identity["method"]["alpha"] == 0.5
    assert dict(cell.engine_spec(prepare=False).worker_env)[controlled.ALPHA_ENV] == "0.5"
    assert methods.entry("controlled").reference_pass and not methods.entry("ngram").reference_pass
    plain = config.cell_from_config(compose_cell(["method=ngram"]))
    assert controlled.ALPHA_ENV not in dict(plain.engine_spec(prepare=False).worker_env)


def test_variants_of_one_method_are_told_apart_and_chosen_again_by_their_overrides():
    controlled = methods.entry("controlled")
    assert controlled.variant({"alpha": 0.6}) != controlled.variant({"alpha": 0.9})
    assert controlled.overrides({"alpha": 0.6}) == ["method=controlled", "method.alpha=0.6"]
    assert methods.entry("draft_model").overrides({"draft": "self"}) == ["method=draft_model", "method.draft=self"]
    # method.draft picks speculative_config.model, which the identity holds already: it stays out of it.
    assert methods.entry("draft_model").identity({"speculative_config": None, "draft": "self"}) == {
        "name": "draft_model", "speculative_config": None}
    with pytest.raises(ValueError, match="method='medusa' is not one of baseline"):
        methods.entry("medusa")


def test_a_toy_method_joins_validation_pricing_and_the_engine_spec(registry, compose_cell, tmp_path):
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "toy.yaml").write_text(TOY_YAML)
    overrides = ["method=toy", "num_speculative_tokens=3", f"hydra.searchpath=[file://{tmp_path}]"]
    unregistered = config.validate(compose_cell(overrides))
    assert any("method='toy' is not one of baseline, ngram" in e for e in unregistered), unregistered

    methods.register(methods.Method("toy", cost="ngram"))
    cfg = compose_cell(overrides)
    assert config.validate(cfg) == []
    spec = config.cell_from_config(cfg).engine_spec()
    assert spec.speculative_config == {"method": "ngram", "num_speculative_tokens": 3,
                                       "prompt_lookup_min": 3, "prompt_lookup_max": 8}
    assert methods.cost("toy") == "ngram"


# A method with a drafter of its own touches these three files, and no other: the test below builds
# each of them (its YAML in a config folder on Hydra's search path, its registry entry and its cost
# model registered in-process) and gets a validated cell, its label and a priced prediction.
OWN_COST_MODEL_FILES = (
    "conf/method/<name>.yaml",  # the speculative_config handed to vLLM, and the method's own keys
    "specbench/methods.py",  # its registry entry: cost model, checkpoint, own keys (typed in MethodSchema)
    "specbench/analytic/drafting.py",  # its DraftCost, added with register_cost
)

LOOKAHEAD_YAML = """\
# A toy drafter whose every drafted token costs a tenth of a plain decode step of the target.
name: lookahead
speculative_config:
  method: ngram
  num_speculative_tokens: ${num_speculative_tokens}
  prompt_lookup_min: 2
  prompt_lookup_max: 4
"""


@dataclass(frozen=True)
class TenthOfAStep:
    """The toy's cost model (:class:`specbench.analytic.drafting.DraftCost`): per drafted token a
    tenth of the target's plain decode step at this batch; nothing on the prompts, no weights."""

    def drafter(self, target: profiles.ModelProfile, checkpoint: profiles.ModelProfile | None) -> None:
        return None

    def step_time(self, *, hw, batch_size, k, context_len, draft, target) -> float:
        return k * steps.plain_decode_step(target, hw, batch_size, context_len) / 10

    def prefill_time(self, *, hw, batch_size, prompt_len, max_step_tokens, draft, target) -> float:
        return 0.0


def test_a_method_with_its_own_cost_model_touches_three_files(registry, compose_cell, tmp_path):
    assert OWN_COST_MODEL_FILES[1] == "specbench/" + Path(methods.__file__).name
    assert OWN_COST_MODEL_FILES[2] == "specbench/analytic/" + Path(drafting.__file__).name
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "lookahead.yaml").write_text(LOOKAHEAD_YAML)  # file 1
    methods.register(methods.Method("lookahead", cost="lookahead"))  # file 2
    drafting.register_cost("lookahead", TenthOfAStep())  # file 3

    overrides = ["method=lookahead", "num_speculative_tokens=3", "workload=creative",
                 f"hydra.searchpath=[file://{tmp_path}]"]
    cfg = compose_cell(overrides)
    assert config.validate(cfg) == []
    cell = config.cell_from_config(cfg)
    assert methods.label(cell.config["method"], cell.k) == "lookahead K=3"

    hardware = yaml.safe_load((Path(config.__file__).parent / "conf/hardware/cpu-amd-epyc-2-cores.yaml").read_text())
    choice = prediction.HardwareChoice(profiles.HardwareProfile.from_mapping(hardware), "cpu")
    row = make_row("lookahead", k=3, method_label="lookahead K=3", config_json=json.dumps(cell.config))
    [priced] = prediction.with_predicted_speedups([row], choice)
    assert priced["prediction_note"] is None, priced["prediction_note"]
    # The same cell priced as a free draft (ngram's cost model) gains more: the toy's drafter was paid for.
    methods.register(methods.Method("lookahead", cost="ngram"))
    [free] = prediction.with_predicted_speedups([row], choice)
    assert 1.0 < priced["predicted_decode_speedup"] < free["predicted_decode_speedup"]
    # Exactly its cost: the speculative step is the verify step plus 3 tenths of a plain step.
    acceptance = prediction.decode_acceptance(row)
    target = prediction.model_profile(cell.config["model"]["path"], row.get("dtype") or cell.config["model"]["dtype"])
    context = prediction.context_length(row)
    hw = choice.profile
    plain = steps.plain_decode_step(target, hw, 1, context)
    verify = steps.verify_step(target, hw, 1, 3, context, acceptance.draft_tokens_per_pass)
    assert priced["predicted_decode_speedup"] == pytest.approx(
        acceptance.tokens_per_pass * plain / (verify + 3 * plain / 10))


def test_a_method_with_a_head_checkpoint_is_checked_before_any_engine(registry, compose_cell, tmp_path):
    methods.register(methods.Method("eagle", cost="eagle", checkpoint=None))
    assert config.validate(compose_cell(["method=eagle", f"model.eagle={tmp_path}/none"])) == []
    methods.register(methods.Method("eagle", cost="eagle", checkpoint="head"))
    errors = config.validate(compose_cell(["method=eagle", f"model.eagle={tmp_path}/none"]))
    assert len(errors) == 1 and "method=eagle (model.eagle)" in errors[0], errors


def test_variants_of_one_method_are_separate_series_rows_and_schedules(tmp_path):
    from rows import write_results

    from specbench.analytic import recommend
    from specbench.report import memory, plots, tables

    def controlled(alpha: float, k: int, batch: int, speedup: float) -> dict:
        cfg = {"method": {"name": "controlled", "alpha": alpha}, "num_speculative_tokens": k,
               "batch_size": batch, "workload": {"name": "summarize"}, "model": {"name": "smollm2-135m"}}
        return make_row("controlled", k, batch, speedup=speedup, config_json=json.dumps(cfg),
                        cell_id=f"controlled-a{alpha}-k{k}-b{batch}", **kv)

    kv = {"kv_cache_tokens": 1000, "drafter_weight_bytes": 0, "kv_requests_fit": 4}
    rows = [make_row("baseline", batch=b, **kv) for b in (1, 4)]
    rows += [controlled(a, k, b, s) for a, s in ((0.5, 1.1), (0.9, 1.8)) for k in (2, 4) for b in (1, 4)]
    # Written before the column: the labels come from each row's config on read.
    df, missing = tables.load_frame(write_results(tmp_path, rows, drop=["method_label"]))
    assert "method_label" in missing
    series = [(label, variant, k) for label, variant, k, _ in plots._series(tables.compared(df))]
    assert series == [("controlled alpha=0.5 K=2", "controlled alpha=0.5", 2),
                      ("controlled alpha=0.5 K=4", "controlled alpha=0.5", 4),
                      ("controlled alpha=0.9 K=2", "controlled alpha=0.9", 2),
                      ("controlled alpha=0.9 K=4", "controlled alpha=0.9", 4)]
    enc = plots.Encoding.for_frame(df)
    assert enc.colour("controlled alpha=0.5") != enc.colour("controlled alpha=0.9")
    assert [r.drafter for r in memory.memory_table(df)] == ["baseline", "controlled alpha=0.5", "controlled alpha=0.9"]
    assert [s.method for s in tables.schedules(df)] == ["controlled alpha=0.5", "controlled alpha=0.9"]
    assert [r.label for r in recommend.recommend(tables.records(tables.compared(df)))] == [
        "controlled alpha=0.5 on summarize (smollm2-135m)", "controlled alpha=0.9 on summarize (smollm2-135m)"]


def test_suffix_is_checked_for_the_package_vllm_imports_and_refuses_a_k_schedule(monkeypatch, tmp_path):
    suffix = {"name": "suffix", "speculative_config": {"method": "suffix", "num_speculative_tokens": 4}}
    check = methods.entry("suffix").check
    assert check is not None
    monkeypatch.syspath_prepend(str(tmp_path))
    package = tmp_path / methods.SUFFIX_PACKAGE
    package.mkdir()
    try:
        # Installed but broken (its native kernels fail to load): as unusable as missing, as vLLM judges it.
        (package / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open shared object file')\n")
        (problem,) = check(suffix)
        assert "arctic-inference" in problem and methods.SUFFIX_INSTALL in problem and "libcudart" in problem
        (package / "__init__.py").write_text("")
        assert check(suffix) == []
    finally:  # a stand-in package must not outlive the test: others ask whether the real one is installed
        sys.modules.pop(methods.SUFFIX_PACKAGE, None)
    # Its proposer asserts the scheduled K is num_speculative_tokens: a schedule would fail at the first step.
    (refusal,) = methods.check_schedule("suffix", [[1, 4, 4], [5, 64, 2]], 8)
    assert "suffix_decoding.py" in refusal and "custom_class" not in refusal
    assert methods.cost("suffix") == "ngram" and not methods.pads_drafts("suffix", "V1")


def test_engines_load_only_vllms_own_plugins_and_rows_say_which(monkeypatch):
    """arctic-inference (installed for method=suffix) registers a general plugin that patches vLLM: no engine
    may load it, whatever it measures; vLLM's own plugins stay allowed and a user's VLLM_PLUGINS is kept."""
    import importlib.metadata

    import vllm.plugins

    from specbench import engine
    from specbench.engine import worker

    installed = list(importlib.metadata.entry_points(group=engine.PLUGIN_GROUP))
    arctic = importlib.metadata.EntryPoint("arctic_inference", "arctic_inference.vllm.plugins:arctic_inference_plugin",
                                           engine.PLUGIN_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [*installed, arctic] if group == engine.PLUGIN_GROUP else [])
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    allowed = engine.worker_environment(None)["VLLM_PLUGINS"].split(",")
    assert "arctic_inference" not in allowed
    assert set(allowed) == {ep.name for ep in installed} or allowed == [""]
    # The worker applies that environment; vLLM parses it as an allowlist, and the row names what it let in.
    monkeypatch.setenv("VLLM_PLUGINS", ",".join(allowed))
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", True)
    assert worker.loaded_plugins() == tuple(sorted(ep.name for ep in installed))
    monkeypatch.delenv("VLLM_PLUGINS")  # unset: vLLM loads every installed one, the patching one too
    assert "arctic_inference" in worker.loaded_plugins()
    monkeypatch.setenv("VLLM_PLUGINS", "arctic_inference")  # a user's choice is theirs, and recorded
    assert engine.worker_environment(None)["VLLM_PLUGINS"] == "arctic_inference"
