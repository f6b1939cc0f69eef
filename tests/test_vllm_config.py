"""Every GPU cell specbench ships is one vLLM itself accepts, checked here without a GPU.

For each shipped GPU grid (the presets written for a GPU, and the commands of
the README's "Quickstart on a GPU") the cells come from specbench's own
planning (:func:`specbench.plan.grid_jobs` and :func:`specbench.sweep.plan_cells`,
as the sweep expands and validates them; the calibration's from
:mod:`specbench.calibrate`), and each distinct engine's ``LLM`` keyword
arguments (:meth:`specbench.engine.EngineSpec.llm_kwargs`) go through vLLM's
own configuration: ``EngineArgs(...).create_engine_config()`` builds the
ModelConfig of target and drafter, the SpeculativeConfig (vocabulary sizes,
EAGLE architectures resolved through vLLM's model registry, draft lengths)
and the engine config. What vLLM refuses there, a GPU engine would refuse
at its start, after the weights were downloaded.

It also asserts the model runner each engine gets on CUDA: vLLM's own
``VllmConfig._get_v2_model_runner_unsupported_features`` on the config it
built (V1 where it names anything) must be what specbench's plan shows
(:func:`specbench.methods.model_runner`). That rule reads the
speculative and parallel configs only, so the CPU platform does not bend it.

The checkpoints are the published ``config.json`` files of the hub models
the model configs name, shipped in ``tests/data/hub-configs/<org>/<name>/``
(each folder's SOURCE says where it comes from). The EAGLE heads' are not
read from the hub: the thoughtworks Qwen2.5-7B EAGLE-3 head's shape is
verified (:func:`test_the_thoughtworks_eagle3_heads_shipped_shape_is_the_checkpoints`)
but its other fields are reconstructed; the yuhuili heads' are the EAGLE
authors' configs from their repository, leptonai's is written in their
format. For the heads this checks vLLM's rules on those shapes, not that
vLLM loads the file the hub serves at the pinned revision. No weights
(``load_format="dummy"``), no tokenizer (``skip_tokenizer_init``). The
cells are composed as on a CUDA build of vLLM (``${cpu_engine:}`` false:
CUDA graphs).

What this cannot see, and a GPU engine's start still can refuse: vLLM here
takes its CPU platform's branches, which turn async scheduling off and empty
the CUDA-graph capture sizes (so capture-size handling, V1's rounding of them
to multiples of K+1, and async scheduling per method are untested here); the
runner is read from the rule, not from ``use_v2_model_runner`` (which also
asks for Triton); AWQ's conversion to Marlin kernels and its dtype checks
need a CUDA device; no weights load (dummy), so no memory is profiled and
vLLM's free-memory check at start never runs; and no tokenizer loads
(``skip_tokenizer_init``), so a draft whose tokenizer the V1 proposer loads
(the heterogeneous-vocabulary draft) is checked for its files only by
:mod:`specbench.hub` (``tests/test_hub.py``).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Sequence

import pytest
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from specbench import calibrate, config, methods, models, plan
from specbench.config import cell_from_config
from specbench.engine import worker
from specbench.sweep import plan_cells

ROOT = Path(__file__).resolve().parents[1]
HUB_CONFIGS = ROOT / "tests" / "data" / "hub-configs"

# The presets written for a GPU (sweeps/), and k_sweep on Llama with EAGLE-1 listed again, as its
# comment says to (its engines include those of k_sweep model=llama-3.1-8b-instruct alone).
GPU_GRIDS = {
    "batch_decay": ["sweep=batch_decay"],
    "k_sweep": ["sweep=k_sweep"],
    "full_grid": ["sweep=full_grid"],
    "serving_4090": ["sweep=serving_4090"],
    "k_sweep-llama": ["sweep=k_sweep", "model=llama-3.1-8b-instruct", "method=ngram,eagle,eagle3,draft_model"],
}


def readme_gpu_commands() -> list[tuple[str, list[str]]]:
    """The specbench commands of the README's "Quickstart on a GPU", as (command, overrides).

    ``command`` is ``plan``, ``calibrate`` or ``sweep`` (``python -m specbench``);
    a sweep's ``-m`` is dropped (its overrides are the grid either way).
    """
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart on a GPU", 1)[1].split("\n## ", 1)[0]
    commands = []
    for line in section.splitlines():
        line = line.split("#", 1)[0].strip()
        match = re.match(r"python -m specbench(\.plan|\.calibrate)?\s(.*)", line)
        if match:
            name = (match.group(1) or ".sweep")[1:]
            commands.append((name, [a for a in shlex.split(match.group(2)) if a != "-m"]))
    return commands


def _grid_cells(overrides: Sequence[str]) -> list[Any]:
    """The cells (baselines included) of the grid a sweep with these overrides runs, validated by specbench."""
    jobs = plan.grid_jobs(overrides)
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        planned = plan_cells(jobs, plan.GridComposer())
    GlobalHydra.instance().clear()
    return [p.cell for p in planned]


def _calibration_cells(argv: Sequence[str]) -> list[Any]:
    """The engines ``python -m specbench.calibrate`` starts for this command line, as calibrate plans them
    (:func:`specbench.calibrate.planned_engines`): the target's, graphs for every batch it decodes, then
    each head's it times, then ngram's."""
    return calibrate.planned_engines(calibrate.argument_parser().parse_args(list(argv))).cells


def _local(reference: str) -> str:
    """A hub id as the folder of its shipped config.json; anything else unchanged."""
    if reference.count("/") != 1 or reference.startswith((".", "/", "~")):
        return reference
    folder = HUB_CONFIGS / reference
    assert (folder / "config.json").is_file(), (
        f"{reference}: no published config.json shipped in {folder.relative_to(ROOT)} (add it, with its SOURCE)")
    return str(folder)


def engines(cells: Sequence[Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each distinct engine of the cells: its LLM kwargs (hub ids made local folders) and a label naming a cell."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for cell in cells:
        kwargs = cell.engine_spec(prepare=False).llm_kwargs()
        key = json.dumps(kwargs, sort_keys=True)
        if key in found:
            continue
        kwargs["model"] = _local(kwargs["model"])
        speculative = kwargs.get("speculative_config")
        if speculative and speculative.get("model"):
            kwargs["speculative_config"] = dict(speculative, model=_local(speculative["model"]))
        label = (f"{cell.identity['model']['name']} {methods.label(cell.identity['method'], cell.k)} "
                 f"max_model_len={cell.identity['engine']['max_model_len']}")
        found[key] = (label, kwargs)
    return found


def vllm_build(kwargs: dict[str, Any]) -> tuple[str | None, str | None]:
    """vLLM's own configuration of an engine of these LLM kwargs: what it says against it (None when it builds),
    and the model runner it gives the engine on CUDA (None when refused): V1 where
    ``_get_v2_model_runner_unsupported_features`` names anything, else V2."""
    from vllm.engine.arg_utils import EngineArgs

    # Each architecture's first inspection on a machine would otherwise import vLLM again in a process of its own.
    worker._inspect_models_in_process()
    try:
        built = EngineArgs(**kwargs, skip_tokenizer_init=True, load_format="dummy").create_engine_config()
    except Exception as exc:  # vLLM raises pydantic, Value and NotImplemented errors alike
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        # A pydantic error's first line names the class; the second holds vLLM's message, then its input.
        message = lines[1] if len(lines) > 1 and lines[0].startswith("1 validation error") else lines[0]
        message = re.sub(r"^Value error, | \[type=.*$| Supported architectures: .*$", "", message)
        return f"{type(exc).__name__}: {message}", None
    return None, "V1" if built._get_v2_model_runner_unsupported_features() else "V2"


def vllm_refusal(kwargs: dict[str, Any]) -> str | None:
    """What vLLM's own configuration says against an engine of these LLM kwargs; None when it builds."""
    return vllm_build(kwargs)[0]


def _refusals(cells: Sequence[Any]) -> list[str]:
    """What vLLM refuses of the cells' engines, and every engine whose runner on CUDA is not the plan's."""
    found = []
    for label, kwargs in engines(cells).values():
        why, runner = vllm_build(kwargs)
        planned = methods.model_runner("V2", kwargs.get("speculative_config"))
        if why:
            found.append(f"{label}: {why}")
        elif runner != planned:
            found.append(f"{label}: vLLM gives it Model Runner {runner} on CUDA, specbench's plan says {planned}")
    return found


@pytest.fixture
def gpu_build(monkeypatch):
    """Compose as on a CUDA build of vLLM (``${cpu_engine:}`` false)."""
    monkeypatch.setattr(config, "cpu_engine", lambda: False)


@pytest.mark.parametrize("grid", sorted(GPU_GRIDS))
def test_every_engine_of_a_gpu_grid_is_accepted_by_vllm(grid, gpu_build):
    refused = _refusals(_grid_cells(GPU_GRIDS[grid]))
    assert not refused, f"vLLM refuses {len(refused)} engine(s) of {grid}:\n" + "\n".join(refused)


@pytest.mark.parametrize("command", readme_gpu_commands(), ids=lambda c: " ".join([c[0], *c[1]]))
def test_every_engine_of_the_readme_gpu_commands_is_accepted_by_vllm(command, gpu_build):
    name, overrides = command
    cells = _calibration_cells(overrides) if name == "calibrate" else _grid_cells(overrides)
    assert cells
    refused = _refusals(cells)
    assert not refused, f"vLLM refuses {len(refused)} engine(s) of {name} {' '.join(overrides)}:\n" + "\n".join(refused)


def test_the_readme_gpu_section_lists_its_commands():
    """The parser finds the three commands (a section rewritten past it would leave the test above empty)."""
    assert [name for name, _ in readme_gpu_commands()] == ["plan", "calibrate", "sweep"]


def _compose(overrides: Sequence[str]) -> Any:
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        from hydra import compose

        cfg = compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()
    return cfg


def _hub_ids() -> set[str]:
    """Every hub id a model config (conf/model/) names: target, drafts, heads."""
    import yaml

    found = set()
    for path in (ROOT / "conf" / "model").glob("*.yaml"):
        model = yaml.safe_load(path.read_text())
        for reference in [model["path"], *model.get("drafts", {}).values(), model.get("eagle"), model.get("eagle3")]:
            if isinstance(reference, str) and reference.count("/") == 1 and ":" not in reference:
                found.add(reference)
    return found


def test_every_hub_model_a_model_config_names_has_its_published_config_shipped():
    ids = _hub_ids()
    assert {"Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"} <= ids
    for reference in ids:
        folder = HUB_CONFIGS / reference
        assert (folder / "config.json").is_file() and (folder / "SOURCE").read_text().strip(), reference


@pytest.mark.parametrize("reference", sorted(models.PUBLISHED_CONFIGS))
def test_published_shape_facts_are_the_shipped_config_files(reference):
    shipped = json.loads((HUB_CONFIGS / reference / "config.json").read_text())
    for key, value in models.PUBLISHED_CONFIGS[reference].items():
        if key == "quantization_config":  # the facts name what the memory model reads of it
            assert {k: shipped[key][k] for k in value} == value, reference
        else:
            assert shipped[key] == value, (reference, key)


def test_published_llama_shapes_price_the_parameter_counts_of_the_model_cards():
    from specbench.analytic import profiles

    def count(reference: str) -> int:
        return profiles.ModelProfile.from_config_json(models.PUBLISHED_CONFIGS[reference],
                                                      dtype="bfloat16").num_params

    assert count("meta-llama/Llama-3.1-8B-Instruct") == 8_030_261_248
    assert count("meta-llama/Llama-3.2-1B-Instruct") == 1_235_814_400


def test_vllm_has_no_eagle1_class_for_qwen2_and_refuses_its_head_through_its_registry():
    """The refusal specbench makes before any engine (config._check_eagle_architecture) is vLLM's own."""
    from vllm.model_executor.models import ModelRegistry

    from specbench.engine import speculative_draft_architectures

    registered = set(ModelRegistry.get_supported_archs())
    read = speculative_draft_architectures()
    assert read is not None and read <= registered  # the table specbench reads is the registry's
    assert "EagleLlamaForCausalLM" in read and "EagleQwen2ForCausalLM" not in registered
    # vLLM's own configuration resolves the shipped Qwen EAGLE-1 head through that registry, and refuses it.
    head = {"method": "eagle", "model": str(HUB_CONFIGS / "leptonai/EAGLE-Qwen2.5-7B-Instruct"),
            "num_speculative_tokens": 2}
    refusal = vllm_refusal({"model": str(HUB_CONFIGS / "Qwen/Qwen2.5-7B-Instruct"), "dtype": "bfloat16",
                            "max_model_len": 2048, "speculative_config": head})
    assert refusal is not None and "['EagleQwen2ForCausalLM'] are not supported" in refusal
    llama = {"method": "eagle", "model": str(HUB_CONFIGS / "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"),
             "num_speculative_tokens": 2}
    assert vllm_refusal({"model": str(HUB_CONFIGS / "meta-llama/Llama-3.1-8B-Instruct"), "dtype": "bfloat16",
                         "max_model_len": 2048, "speculative_config": llama}) is None


@pytest.mark.parametrize("model", ["qwen2.5-7b-instruct", "qwen2.5-7b-instruct-awq"])
def test_eagle1_on_qwen_is_refused_before_any_engine_with_one_error_naming_the_key(model):
    errors = config.validate(_compose([f"model={model}", "method=eagle"]))
    assert len(errors) == 1
    assert errors[0].startswith("method=eagle (model.eagle) with model.path=Qwen/Qwen2.5-7B-Instruct")
    assert "EagleQwen2ForCausalLM" in errors[0] and "use method=eagle3" in errors[0]
    # A head named by hand is refused the same way: it would load as the same missing class.
    [again] = config.validate(_compose([f"model={model}", "method=eagle",
                                        "model.eagle=leptonai/EAGLE-Qwen2.5-7B-Instruct"]))
    assert "EagleQwen2ForCausalLM" in again
    assert config.validate(_compose(["model=llama-3.1-8b-instruct", "method=eagle"])) == []


def test_a_draft_of_another_vocabulary_runs_with_vllms_mapping_or_is_refused_naming_the_key():
    qwen = ["model=qwen2.5-7b-instruct", "method=draft_model", "method.draft=small"]
    cell = cell_from_config(_compose(qwen))
    speculative = cell.identity["method"]["speculative_config"]
    assert speculative["use_heterogeneous_vocab"] is True  # the model config lists its small draft
    local = dict(speculative, model=str(HUB_CONFIGS / "Qwen/Qwen2.5-0.5B-Instruct"))
    target = {"model": str(HUB_CONFIGS / "Qwen/Qwen2.5-7B-Instruct"), "dtype": "bfloat16", "max_model_len": 2048}
    assert vllm_build(dict(target, speculative_config=local)) == (None, "V1")  # V2 has no vocabulary mapping
    assert methods.model_runner("V2", local) == "V1"
    unmapped = {k: v for k, v in local.items() if k != "use_heterogeneous_vocab"}
    refusal = vllm_refusal(dict(target, speculative_config=unmapped))
    assert refusal is not None and "should have the same vocabulary size" in refusal
    # specbench refuses the same cell before any engine, naming the model config's key.
    [error] = config.validate(_compose(qwen + ["model.heterogeneous_vocab_drafts=[]"]))
    assert error.startswith("method=draft_model (model.drafts.small): draft Qwen/Qwen2.5-0.5B-Instruct has a "
                            "vocabulary of 151936 tokens, target Qwen/Qwen2.5-7B-Instruct 152064")
    assert "model.heterogeneous_vocab_drafts" in error
    # Sampled drafts cannot be mapped: vLLM refuses them, and so does specbench, first.
    sampled = qwen + ["+method.speculative_config.draft_sample_method=probabilistic"]
    assert any("drafts greedily only" in e for e in config.validate(_compose(sampled)))
    refusal = vllm_refusal(dict(target, speculative_config=dict(local, draft_sample_method="probabilistic")))
    assert refusal is not None and "only supports greedy draft" in refusal
    # A draft of the target's own vocabulary keeps the speculative_config it had.
    same = cell_from_config(_compose(["model=llama-3.1-8b-instruct", "method=draft_model"]))
    assert "use_heterogeneous_vocab" not in same.identity["method"]["speculative_config"]


def test_the_plan_shows_the_model_runner_each_cell_gets(gpu_build):
    """The README's GPU plan: V1 for the 0.5B heterogeneous-vocabulary draft (its baseline on V2), V2 for the rest;
    the CPU build runs V1 whatever the method."""
    rows = plan.make_plan(["sweep=k_sweep", "model=qwen2.5-7b-instruct-awq", "hardware=rtx4090",
                           "num_speculative_tokens=2", "workload=summarize"])
    runners = {r.label.split()[0]: r.model_runner for r in rows}
    assert runners == {"baseline": "V2", "ngram": "V2", "eagle3": "V2", "draft_model/small": "V1"}
    assert "runner" in plan.format_plan(rows, 0.7).splitlines()[0]
    for method in ("suffix", "custom_class"):
        assert methods.model_runner("V2", {"method": method}) == "V1"
    assert methods.model_runner("V1", {"method": "eagle3"}) == "V1"
    assert methods.model_runner("V2", {"method": "eagle3", "parallel_drafting": True}) == "V1"


def test_each_model_config_computes_in_a_dtype_its_vllm_quantization_path_takes():
    """The AWQ target runs in bfloat16 (Qwen2 activations can overflow float16): vLLM 0.32's CUDA AWQ path takes it."""
    import torch
    import yaml
    from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig

    for path in sorted((ROOT / "conf" / "model").glob("*.yaml")):
        model = yaml.safe_load(path.read_text())
        shipped = HUB_CONFIGS / model["path"] / "config.json"
        quantization = json.loads(shipped.read_text()).get("quantization_config") if shipped.is_file() else None
        if quantization and quantization["quant_method"] == "awq":
            assert getattr(torch, model["dtype"]) in AutoAWQConfig.get_supported_act_dtypes(), path.name
            assert model["dtype"] == "bfloat16", path.name


def test_the_thoughtworks_eagle3_heads_shipped_shape_is_the_checkpoints():
    """Its config.json could not be read from here: only its shape fields are verified, by the 358,758,400
    floating-point parameters a public report loaded from revision ff17dda64a036cf5bd7bc56c0ab728325f1c0d0b
    (7 KV heads and intermediate 14336, not the 4 and 18944 of SpecForge's training config). The project's
    own head profile of the shipped config gives exactly that count, plus its int64 d2t map."""
    from specbench.analytic import drafting, prediction
    from specbench.analytic.profiles import ModelProfile

    reference = "thoughtworks/Qwen2.5-7B-Instruct-Eagle3"
    shipped = json.loads((HUB_CONFIGS / reference / "config.json").read_text())
    assert "ff17dda64a036cf5bd7bc56c0ab728325f1c0d0b" in (HUB_CONFIGS / reference / "SOURCE").read_text()
    target = prediction.model_profile("Qwen/Qwen2.5-7B-Instruct", "bfloat16")
    head = drafting.eagle_head_profile(target, "eagle3", ModelProfile.from_config_json(shipped, dtype="bfloat16"))
    d2t = shipped["draft_vocab_size"] * 8 // 2  # int64 offsets, counted in bfloat16 widths
    assert head.num_params - d2t == 358_758_400
    assert (shipped["num_key_value_heads"], shipped["intermediate_size"]) == (7, 14336)


def test_every_hub_checkpoint_a_model_config_names_is_pinned_to_a_commit():
    import yaml

    from specbench import hub

    for path in sorted((ROOT / "conf" / "model").glob("*.yaml")):
        model = yaml.safe_load(path.read_text())
        named = {r for r in [model["path"], *model.get("drafts", {}).values(), model.get("eagle"), model.get("eagle3")]
                 if isinstance(r, str) and hub.is_hub_id(r)}
        revisions = model.get("revisions") or {}
        assert set(revisions) == named, path.name  # every hub id it names, and nothing else
        for reference, revision in revisions.items():  # each a commit: none left on main
            assert isinstance(revision, str) and hub.is_commit(revision), (path.name, reference, revision)
        assert config.validate(_compose([f"model={path.stem}"])) == [], path.name


def test_a_shipped_config_file_of_a_pinned_revision_is_that_revisions_file():
    """Where public sources give the SHA-256 of a pinned revision's config.json, the shipped file is that file."""
    import hashlib

    import yaml

    shipped = HUB_CONFIGS / "Qwen" / "Qwen2.5-0.5B-Instruct-AWQ"
    pinned = yaml.safe_load((ROOT / "conf" / "model" / "qwen2.5-7b-instruct-awq.yaml").read_text())["revisions"]
    assert pinned["Qwen/Qwen2.5-0.5B-Instruct-AWQ"] in (shipped / "SOURCE").read_text()
    digest = hashlib.sha256((shipped / "config.json").read_bytes()).hexdigest()
    assert digest == "bd20ae34a91eb38230b870d39f56677d1cda1e8b6688ad627e6efb6ca9f44090"


def test_the_calibration_engines_checked_are_the_ones_calibrate_starts(gpu_build):
    """Built by calibrate's own plan, not a copy: the target's engine captures graphs for every batch it decodes,
    and each head calibrate times is there (on Qwen2, EAGLE-3's only), then the ngram engine it times."""
    [overrides] = [o for name, o in readme_gpu_commands() if name == "calibrate"]
    cells = _calibration_cells(overrides)
    assert [c.method for c in cells] == ["baseline", *["eagle3"] * len(calibrate.DRAFT_KS), "ngram"]
    assert set(calibrate.DEFAULT_BATCH_SIZES) <= set(cells[0].engine_spec(prepare=False).cudagraph_capture_sizes)
    heads = _calibration_cells(["model=llama-3.1-8b-instruct"])
    assert [c.method for c in heads] == ["baseline", *(m for m in calibrate.DRAFT_METHODS for _ in calibrate.DRAFT_KS),
                                         *calibrate.LOOKUP_METHODS]
