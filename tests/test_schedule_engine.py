"""A K schedule (method.k_schedule) changes K at run time in the real engine.

vLLM looks the K up per engine step from the number of requests scheduled, and
the engine worker counts the drafts proposed at each position
(``drafted_per_pos``). Schedule [[1,1,1],[2,64,3]]: a request decoded alone
drafts one token a step, so no position past the first is ever drafted; two
requests together draft three, so the third position is. Summarize prompts,
where prompt lookup finds drafts; the prefix cache prefills each prompt once.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from conftest import specbench

pytestmark = pytest.mark.engine


def test_the_schedule_switches_k_with_the_batch_size(tmp_path: Path) -> None:
    done = specbench(
        "-m", "method=ngram", "method.k_schedule=[[1,1,1],[2,64,3]]", "batch_size=1,2", "workload=summarize",
        "workload.num_prompts=2", "workload.selection=first", "workload.max_prompt_tokens=480",
        "workload.max_tokens=16", "repetitions=1", "engine_runs=1", "attempts=1", "warmup=false",
        "engine.enable_prefix_caching=true",
        f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = pd.read_parquet(tmp_path / "sweep" / "results.parquet")
    scheduled = rows[rows["method"] == "ngram"].set_index("batch_size")
    assert set(scheduled["method_label"]) == {"ngram K=[1:1, 2-64:3]"}
    assert set(scheduled["num_speculative_tokens"]) == {3}  # the schedule's largest K
    assert [list(r) for r in scheduled.loc[1, "k_schedule"]] == [[1, 1, 1], [2, 64, 3]]
    alone, together = (list(scheduled.loc[b, "drafted_per_pos"]) for b in (1, 2))
    assert alone[0] > 0 and not any(alone[1:]), alone  # K=1 at batch size 1
    assert len(together) >= 3 and together[2] > 0, together  # K=3 while two requests decode
