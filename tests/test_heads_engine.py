"""The shipped EAGLE heads in the real vLLM engine: loaded whole, exact, and accepting drafts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file, save_file

from specbench import models

pytestmark = pytest.mark.engine


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=1200)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_every_tensor_vllm_loads_for_a_shipped_head_comes_from_its_file(method):
    done = run("specbench.heads", "verify", f"heads:smollm2-135m-instruct-{method}", "--method", method)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tensors of the" in done.stdout and "equal its file" in done.stdout


def test_verify_catches_a_tensor_missing_from_the_file(tmp_path):
    """vLLM itself loads such a head silently (EAGLE's load_weights skips its check)."""
    shipped = models.shipped_head_path("heads:smollm2-135m-instruct-eagle")
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(shipped / "config.json", broken / "config.json")
    tensors = load_file(str(shipped / "model.safetensors"))
    del tensors["layers.0.mlp.down_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    done = run("specbench.heads", "verify", str(broken), "--method", "eagle")
    assert done.returncode == 1
    assert "model.layers.0.mlp.down_proj.weight: not in the file" in done.stdout


def test_eagle_and_eagle3_run_exact_with_accepted_drafts(tmp_path):
    done = run(
        "specbench", "-m", "method=eagle,eagle3", "num_speculative_tokens=2", "workload=creative",
        "workload.num_prompts=2", "workload.max_tokens=16", "repetitions=1", "engine_runs=1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = pd.read_parquet(tmp_path / "sweep" / "results.parquet")
    spec = results[results["method"].isin(["eagle", "eagle3"])]
    assert sorted(spec["method"]) == ["eagle", "eagle3"]
    assert (spec["status"] == "ok").all() and spec["exact_match"].all()
    assert (spec["acceptance_length"] > 1.0).all()
