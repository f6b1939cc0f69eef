"""Refusals end the command cleanly: their lines, a non-zero exit, no Python traceback.

Each case runs a real entry point in a subprocess, as a user would, on one
class of refusal (validation, workload loading, a Hydra override, a damaged
results file). None of them gets as far as starting an engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``python <args>`` with this checkout's specbench first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("HYDRA_FULL_ERROR", None)  # that switch asks for the traceback on purpose
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def assert_refused(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    for text in expected:
        assert text in output, output


@pytest.fixture()
def bad_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": oops}\n', encoding="utf-8")
    return path


def sweep(*overrides: str, multirun: bool, out: Path) -> list[str]:
    dirs = [f"hydra.run.dir={out / 'run'}", f"hydra.sweep.dir={out / 'sweep'}"]
    return ["-m", "specbench", *(["-m"] if multirun else []), *overrides, *dirs]


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["method=medusa"], ["method/medusa", "Available options in 'method'"]),
        (["num_speculative_tokens=0"], ["num_speculative_tokens=0 must be an integer in 1..64"]),
        (["method=draft_model", "model.drafts.small=/no/such/draft"],
         ["model.drafts.small", "/no/such/draft", "no such directory"]),
        (["method=eagle", "model.eagle=null"],
         ["method=eagle (model.eagle) is not set",
          "python -m specbench.heads train --method eagle --target embedded:smollm2-135m-instruct"]),
        (["batch_size=1", "no_such_key=3"], ["Could not override 'no_such_key'"]),
        (["passes=3"], ["passes=3: this key was renamed engine_runs", "use engine_runs=3"]),
        (["engine.max_model_len=long"], ["Value 'long' of type 'str' could not be converted to Integer",
                                         "full_key: engine.max_model_len"]),
    ],
    ids=["unknown-method", "k-below-1", "missing-draft", "eagle-without-head", "unknown-key", "renamed-key",
         "wrong-type"],
)
def test_config_refusals(tmp_path: Path, overrides: list[str], expected: list[str], multirun: bool) -> None:
    assert_refused(run(sweep(*overrides, multirun=multirun, out=tmp_path), tmp_path), *expected)
    assert not (tmp_path / "sweep" / "cells").exists() and not (tmp_path / "run" / "cells").exists()


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
def test_malformed_prompt_file_is_refused_before_any_cell(tmp_path: Path, bad_jsonl: Path, multirun: bool) -> None:
    overrides = ["workload.source=jsonl", f"workload.path={bad_jsonl}", "batch_size=1,2" if multirun else "batch_size=1"]
    result = run(sweep(*overrides, multirun=multirun, out=tmp_path), tmp_path)
    assert_refused(result, f"{bad_jsonl}:2: malformed JSON line")
    assert not (tmp_path / "sweep" / "cells").exists() and not (tmp_path / "run" / "cells").exists()


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
def test_too_few_prompts_within_max_prompt_tokens_are_refused_before_any_cell(tmp_path: Path, multirun: bool) -> None:
    from specbench import models

    if not (Path(models.resolve("embedded:smollm2-135m-instruct", prepare=False)) / "tokenizer.json").is_file():
        pytest.skip("the embedded model is not prepared: validation has no tokenizer to count with")
    overrides = ["workload=summarize", "workload.num_prompts=32", "workload.max_prompt_tokens=512",
                 "batch_size=1,8" if multirun else "batch_size=1"]
    result = run(sweep(*overrides, multirun=multirun, out=tmp_path), tmp_path)
    assert result.returncode == 2
    assert_refused(result, "workload.num_prompts=32 but only 9 prompts of summarize (source=builtin) fit "
                           "workload.max_prompt_tokens=512 (29 of 38 are longer")
    assert not (tmp_path / "sweep" / "cells").exists() and not (tmp_path / "run" / "cells").exists()


@pytest.mark.parametrize("module", ["specbench.report", "specbench.analytic.prediction", "specbench.analytic.recommend"])
def test_corrupt_results_file(tmp_path: Path, module: str) -> None:
    damaged = tmp_path / "results.parquet"
    damaged.write_bytes(b"PAR1 this is not a parquet file")
    assert_refused(run(["-m", module, str(damaged)], tmp_path), str(damaged), "not a readable Parquet file")


def test_a_misspelt_key_in_a_users_own_workload_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "conf" / "workload").mkdir(parents=True)
    text = (REPO / "conf" / "workload" / "creative.yaml").read_text().replace("max_tokens:", "max_token:")
    (tmp_path / "conf" / "workload" / "mine.yaml").write_text(text)
    result = run(sweep(f"--config-dir={tmp_path / 'conf'}", "workload=mine", multirun=False, out=tmp_path), tmp_path)
    assert_refused(result, "Key 'max_token' not in 'WorkloadSchema'", "full_key: workload.max_token")


def test_calibrate_refuses_an_unknown_model(tmp_path: Path) -> None:
    assert_refused(run(["-m", "specbench.calibrate", "model=nope"], tmp_path), "model/nope")


def test_calibrate_refuses_an_invalid_setting(tmp_path: Path) -> None:
    result = run(["-m", "specbench.calibrate", "engine.max_model_len=0"], tmp_path)
    assert_refused(result, "exceeds engine.max_model_len=0")
