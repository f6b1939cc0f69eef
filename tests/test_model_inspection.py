"""A CPU engine worker inspects its model classes in its own process, filling vLLM's model-info cache."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import pytest

from specbench.engine import worker


def _no_process(*args: Any, **kwargs: Any) -> NoReturn:
    raise AssertionError(f"vLLM started a process to inspect a model class: {args[0] if args else kwargs}")


def test_a_cpu_worker_inspects_a_model_class_without_a_new_process_and_vllm_caches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = pytest.importorskip("vllm.model_executor.models.registry")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("on a GPU the worker keeps vLLM's own process for the inspection")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    # vLLM's way, a process of its own (`python -m vllm.model_executor.models.registry`, ~9 s on 2 cores),
    # fails the test if the worker leaves it in place; restored after the test.
    monkeypatch.setattr(registry, "_run_in_subprocess", _no_process)
    llama = registry.ModelRegistry.models["LlamaForCausalLM"]
    cached = tmp_path / "modelinfos" / "vllm-model_executor-models-llama-LlamaForCausalLM.json"

    worker._inspect_models_in_process()
    info = llama.inspect_model_cls()

    assert (info.architecture, info.is_text_generation_model, info.is_pooling_model) == ("LlamaForCausalLM", True, False)
    assert cached.is_file(), "vLLM did not write its model-info cache"
    # The next engine on this machine reads the cache: nothing is inspected again.
    monkeypatch.setattr(registry, "_run_in_subprocess", _no_process)
    # (As read back from JSON: its tuples are lists.)
    assert json.loads(json.dumps(asdict(llama.inspect_model_cls()))) == json.loads(json.dumps(asdict(info)))
