"""conftest.run_here, the engine tests' grid measured in the test's process: its engines fork from the session's server.

The session's engine fork server (specbench.engine.worker_context) starts with the environment of the first engine
or forked script, the defaults of EngineSpec and run_forked: no preload, no huge pages. An engine whose start
environment differs is spawned instead and imports vLLM again (about 10 s on 2 cores), which is what run_here saves.
"""

from __future__ import annotations

import pytest
from conftest import HERE

from specbench.config import cell_from_config
from specbench.engine import EngineSpec, start_environment

SESSION = EngineSpec(model="m", dtype="float32", seed=0, max_model_len=64, max_num_seqs=1, enforce_eager=True,
                     enable_prefix_caching=False, gpu_memory_utilization=0.9, cpu_kvcache_space_gib=1)


@pytest.mark.parametrize("overrides", [
    ["method=ngram", "model.dtype=bfloat16"],
    ["method=ngram", "temperature=1.0"],
    ["method=baseline", "workload.num_prompts=2", "load.request_rate=4", "load.num_requests=6"],
])
def test_a_grid_measured_here_starts_its_engines_as_the_sessions_fork_server_does(compose_cell, overrides):
    spec = cell_from_config(compose_cell([*overrides, *HERE])).engine_spec(prepare=False)
    assert start_environment(spec.preload, spec.cpu_huge_pages) == start_environment(
        SESSION.preload, SESSION.cpu_huge_pages)
    # Without HERE, the configured defaults (huge pages) would spawn every engine.
    default = cell_from_config(compose_cell(overrides)).engine_spec(prepare=False)
    assert start_environment(default.preload, default.cpu_huge_pages) != start_environment(
        SESSION.preload, SESSION.cpu_huge_pages)
