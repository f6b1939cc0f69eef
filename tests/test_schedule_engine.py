"""A K schedule (method.k_schedule) changes K at run time in the real engine.

vLLM looks the K up per engine step from the number of requests scheduled, and
the engine worker counts the drafts proposed at each position
(``drafted_per_pos``). Schedule [[1,1,1],[2,64,3]]: a request decoded alone
drafts one token a step, so no position past the first is ever drafted; two
requests together draft three, so the third position is. Summarize prompts,
where prompt lookup finds drafts; the prefix cache prefills each prompt once. The scheduled cells are
measured in the test's process (conftest.run_here), without their baselines.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_here

pytestmark = pytest.mark.engine


def test_the_schedule_switches_k_with_the_batch_size(tmp_path: Path) -> None:
    # The scheduled cells alone, on one engine in this process: their baselines measure nothing asked here.
    ran = run_here(
        ["method=ngram", "method.k_schedule=[[1,1,1],[2,64,3]]", "batch_size=1,2", "workload=summarize",
         "workload.num_prompts=2", "workload.selection=first", "workload.max_prompt_tokens=480",
         "workload.max_tokens=16", "repetitions=1", "engine_runs=1", "attempts=1", "warmup=false",
         "engine.enable_prefix_caching=true"],
        tmp_path, measure=lambda cell: not cell.is_baseline, finish=False,
    )
    scheduled = ran.results.set_index("batch_size")
    assert list(scheduled["method"]) == ["ngram", "ngram"]
    assert set(scheduled["method_label"]) == {"ngram K=[1:1, 2-64:3]"}
    assert set(scheduled["num_speculative_tokens"]) == {3}  # the schedule's largest K
    assert [list(r) for r in scheduled.loc[1, "k_schedule"]] == [[1, 1, 1], [2, 64, 3]]
    alone, together = (list(scheduled.loc[b, "drafted_per_pos"]) for b in (1, 2))
    assert alone[0] > 0 and not any(alone[1:]), alone  # K=1 at batch size 1
    assert len(together) >= 3 and together[2] > 0, together  # K=3 while two requests decode
