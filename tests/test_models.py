"""The embedded model: prepared once, safely under concurrency, into loadable folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specbench import models


# The conversion stands in for the real one (tens of seconds) in both processes: what is tested here is the lock, the
# staging folder and the rename; the real conversion is tested below, once. Both processes wait for each other
# before they prepare, so that the second reaches the lock while the first converts.
_RACE = """
import sys, time
from pathlib import Path
from specbench import models

shared = Path(sys.argv[1])
def convert(checkpoint, out, gguf):
    with open(shared / "conversions", "a") as log:  # one line per conversion that ran
        log.write(checkpoint.name + "\\n")
    time.sleep(2)
    (out / "config.json").write_text("{}")

models._convert = convert
(shared / f"ready-{sys.argv[2]}").touch()
while len(list(shared.glob("ready-*"))) < 2:
    time.sleep(0.05)
print(models.prepare_embedded("smollm2-135m-instruct-l24"))
"""


def test_two_processes_preparing_at_once_make_one_complete_checkpoint(tmp_path):
    env = dict(os.environ, SPECBENCH_CACHE=str(tmp_path))
    shared = tmp_path / "shared"
    shared.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(shared), str(i)], env=env, stdout=subprocess.PIPE,
                              text=True) for i in range(2)]
    outputs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    folder = tmp_path / "models" / "smollm2-135m-instruct-l24"
    assert outputs == [str(folder), str(folder)]
    # Converted once: the other process waited on the lock and found the checkpoint complete.
    assert (shared / "conversions").read_text() == "smollm2-135m-instruct-l24\n"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        "smollm2-135m-instruct-l24", "smollm2-135m-instruct-l24.lock"]  # no leftover staging folders
    assert (folder / "config.json").is_file() and (folder / models.COMPLETE_MARKER).is_file()


def test_the_embedded_draft_is_the_targets_first_24_layers_in_a_loadable_folder():
    # The folder `make setup` converted from the real GGUF (`specbench.models prepare`, as a new machine
    # runs it), the one the engine tests load: converting it again here took 24 s of the engine pass.
    folder = models.prepare_embedded("smollm2-135m-instruct-l24")
    assert folder.name == "smollm2-135m-instruct-l24"
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
