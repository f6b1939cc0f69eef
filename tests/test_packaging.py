"""An installed (non-editable) specbench finds its configs, presets and sweeper from anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    return next(out.glob("specbench-*.whl"))


def test_wheel_carries_configs_presets_data_and_plugin(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "specbench/conf/config.yaml",
        "specbench/conf/method/ngram.yaml",
        "specbench/conf/hydra/sweeper/specbench.yaml",
        "specbench/conf/sweep/cpu_demo.yaml",
        "specbench/workloads/data/summarize.jsonl",
        "specbench/heads/shipped/smollm2-135m-instruct-eagle/model.safetensors",
        "specbench/heads/shipped/smollm2-135m-instruct-eagle3/config.json",
        "hydra_plugins/specbench_sweeper/__init__.py",
    ):
        assert required in names, required


def test_installed_copy_composes_from_another_directory(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run(
        [sys.executable, "-m", "specbench", "sweep=cpu_demo", "--cfg", "hydra", "--package", "hydra.sweeper"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "SpecbenchSweeper" in done.stdout and "workload: summarize,creative" in done.stdout
    where = subprocess.run([sys.executable, "-c", "import specbench; print(specbench.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip().startswith(str(site))
