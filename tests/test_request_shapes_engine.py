"""Request shapes through the real async engine: each request sent with its own drawn lengths.

One baseline serving cell, six requests at 4 req/s (one warm-up), outputs drawn around 8 tokens and prompts
cut to lengths drawn around 64, EOS ignored so that every request decodes exactly its drawn length.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_here

from specbench import load

pytestmark = pytest.mark.engine


def test_each_request_decodes_its_drawn_output_length_from_a_prompt_of_its_drawn_length(tmp_path: Path) -> None:
    # The one cell, measured in this process (conftest.run_here): nothing here reads a merge or a report.
    ran = run_here(
        ["method=baseline", "workload=summarize", "workload.num_prompts=2", "workload.selection=first",
         "workload.max_prompt_tokens=480", "workload.max_tokens=16", "load.request_rate=4", "load.num_requests=6",
         "load.warmup_requests=1", "load.output_len=8", "load.input_len=64", "load.range_ratio=0.5",
         "load.ignore_eos=true", "engine_runs=1", "attempts=1"], tmp_path, finish=False,
    )
    [row] = [r for _, r in ran.results.iterrows()]
    assert "-rate4-in64-out8-rr0.5-" in row["cell_id"]
    seed = int(row["seed"])
    outputs = load.drawn_lengths(8, 0.5, 6, load.shape_seed("outputs", seed, 0))
    inputs = load.drawn_lengths(64, 0.5, 6, load.shape_seed("inputs", seed, 0))
    assert len(set(outputs)) > 1  # the draw spreads them, so the check below tells requests apart
    # Every request sent, warm-up included, decoded exactly the max_tokens drawn for it (EOS ignored).
    assert list(row["output_tokens_per_request"]) == list(outputs)
    # The measured prompts were cut to their drawn lengths (each summarize prompt is longer than 96 tokens).
    assert row["prompt_tokens"] == sum(inputs[1:])
