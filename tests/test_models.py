"""The embedded model: prepared once, safely under concurrency, into loadable folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specbench import models


@pytest.mark.engine  # converts a real GGUF: tens of seconds
def test_two_processes_preparing_at_once_make_one_complete_checkpoint(tmp_path):
    env = dict(os.environ, SPECBENCH_CACHE=str(tmp_path))
    script = "from specbench import models; print(models.prepare_embedded('smollm2-135m-instruct-l24'))"
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    folder = tmp_path / "models" / "smollm2-135m-instruct-l24"
    assert outputs == [str(folder), str(folder)]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        "smollm2-135m-instruct-l24", "smollm2-135m-instruct-l24.lock"]  # no leftover staging folders
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 24 and "quantization_config" not in config
    assert (folder / "model.safetensors").stat().st_size > 100e6
    assert (folder / models.COMPLETE_MARKER).is_file()


def test_references_resolve_and_unknown_names_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty hub cache: a hub id not on disk stays as it is
    assert models.resolve("Qwen/Qwen2.5-7B-Instruct", prepare=False) == "Qwen/Qwen2.5-7B-Instruct"
    assert models.resolve("embedded:smollm2-135m-instruct", prepare=False).endswith("smollm2-135m-instruct")
    with pytest.raises(ValueError, match="allowed: embedded:smollm2-135m-instruct, embedded:smollm2-135m-instruct-l24"):
        models.resolve("embedded:gpt-5")
