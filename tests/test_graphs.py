"""CUDA graphs that cover the grid (specbench.analytic.graphs): capture sizes, their memory, the engine
each cell gets, and what vLLM does with the list."""

from __future__ import annotations

import json

import pytest

from specbench import grid
from specbench.analytic import footprint, graphs, memory, prediction
from specbench.config import cell_from_config
from specbench.engine import EngineSpec
from specbench.plan import format_plan, make_plan
from specbench.sweep import engine_starts, plan_cells

SCHEDULE = {"num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 64, 2]]}


def test_capture_sizes_cover_every_decode_step_up_to_the_batch():
    sizes = graphs.capture_sizes(128, 4, None)
    # batch_decay at batch 128, K=4: 640 tokens, past vLLM's default 512-token ceiling.
    assert sizes[-1] == 640 == graphs.largest_step(128, 4, None)
    assert all(5 * n in sizes for n in range(1, 129) if n in graphs.token_grid(128) or n == 128)
    # An off-grid step (100 x 5 = 500) is captured as itself: vLLM's token grid jumps 496 -> 512.
    assert 500 in graphs.capture_sizes(100, 4, None) and 500 not in graphs.token_grid(500)
    # full_grid at 64 x 9.
    assert graphs.capture_sizes(64, 8, None)[-1] == 576
    # A baseline: its batch, nothing beyond.
    assert graphs.capture_sizes(100, 0, None)[-3:] == (88, 96, 100)
    # A step limit (max_num_batched_tokens) drops larger sizes, as vLLM does.
    assert graphs.capture_sizes(128, 4, None, step_limit=512)[-1] == 512


def test_a_k_schedule_gets_the_sizes_of_each_tier():
    assert graphs.step_tiers(100, 4, SCHEDULE) == {5: 4, 3: 100}
    sizes = graphs.capture_sizes(100, 4, SCHEDULE)
    assert {5, 10, 20} <= set(sizes) and 300 == sizes[-1] == graphs.largest_step(100, 4, SCHEDULE)
    # Below the second tier only K=4 steps: 3 x 5 at most.
    assert graphs.capture_sizes(3, 4, SCHEDULE) == (1, 2, 4, 5, 8, 10, 15)


def test_the_graph_batch_is_the_engines_then_the_cells_then_the_loads():
    offline = {"engine": {"max_num_seqs": 256}, "batch_size": 8}
    assert graphs.graph_batch(offline) == 8
    assert graphs.graph_batch({**offline, "engine": {"max_num_seqs": 256, "cudagraph_batch_size": 64}}) == 64
    serving = {**offline, "batch_size": 1, "load": {"request_rate": 2.0, "num_requests": 100}}
    assert graphs.graph_batch(serving) == 100
    assert graphs.graph_batch({**serving, "load": {"request_rate": 2.0, "num_requests": 100,
                                                   "max_concurrency": 16}}) == 16


def test_graph_memory_follows_vllms_profile_shape_and_leaves_the_kv_cache_less():
    model = prediction.model_profile("Qwen/Qwen2.5-7B-Instruct", "bfloat16")
    small, large = graphs.capture_sizes(8, 0, None), graphs.capture_sizes(128, 4, None)
    assert footprint.cuda_graph_bytes([model], ()) == 0
    # Model Runner V2: the pool of the largest capture, every PIECEWISE graph (one per compiled piece, 29 for
    # Qwen2.5-7B's 28 layers) at every size, and the FULL graphs past the first at vLLM's 1 MiB floor.
    pieces = footprint.compiled_pieces(model)
    assert pieces == 29

    def beyond_pool(sizes):
        return len(sizes) * pieces * footprint.PIECE_GRAPH_BYTES + (len(sizes) - 1) * footprint.GRAPH_OVERHEAD_BYTES

    assert footprint.cuda_graph_bytes([model], small) - beyond_pool(small) \
        == pytest.approx(8 / 640 * (footprint.cuda_graph_bytes([model], large) - beyond_pool(large)), abs=1)
    budget = footprint.MemoryBudget(total_bytes=40 * footprint.GIB)
    common = dict(batch_size=8, prompt_len=64, output_len=32, k=4, max_model_len=512, step_tokens=2048)
    eager = footprint.engine_memory(model, None, budget, **common)
    graphed = footprint.engine_memory(model, None, budget, **common, capture_sizes=large)
    assert graphed.graph_bytes == footprint.cuda_graph_bytes([model], large) > 0 == eager.graph_bytes
    assert eager.kv_pool_bytes - graphed.kv_pool_bytes == graphed.graph_bytes
    assert graphed.fixed_bytes - eager.fixed_bytes == graphed.graph_bytes


def test_only_a_gpu_profile_without_enforce_eager_prices_graphs():
    cfg = {"engine": {"enforce_eager": False, "max_num_seqs": 256, "max_num_batched_tokens": None},
           "method": {"name": "ngram", "speculative_config": {"num_speculative_tokens": 4}},
           "num_speculative_tokens": 4, "batch_size": 128}
    gpu = {"memory_bytes": 24 * footprint.GIB, "max_num_batched_tokens": 8192}
    assert memory.capture_sizes(cfg, gpu)[-1] == 640
    assert memory.capture_sizes({**cfg, "engine": {**cfg["engine"], "enforce_eager": True}}, gpu) == ()
    assert memory.capture_sizes(cfg, {"memory_gb": 25}) == ()


def test_llm_kwargs_hand_vllm_the_sizes_only_when_not_eager():
    spec = EngineSpec(model="m", dtype="bfloat16", seed=0, max_model_len=512, max_num_seqs=8, enforce_eager=False,
                      enable_prefix_caching=False, gpu_memory_utilization=0.9, cpu_kvcache_space_gib=1,
                      cudagraph_capture_sizes=(1, 2, 4, 5, 8))
    assert spec.llm_kwargs()["compilation_config"] == {"cudagraph_capture_sizes": [1, 2, 4, 5, 8]}
    eager = EngineSpec(**{**spec.__dict__, "enforce_eager": True})
    assert "compilation_config" not in eager.llm_kwargs()
    assert "compilation_config" not in EngineSpec(**{**spec.__dict__, "cudagraph_capture_sizes": ()}).llm_kwargs()


def test_cells_that_share_an_engine_share_graphs_covering_the_largest(compose_cell, monkeypatch):
    from specbench import config

    monkeypatch.setattr(config, "cpu_engine", lambda: False)  # a CUDA build: graphs on
    jobs = [("method=ngram", "num_speculative_tokens=4", f"batch_size={b}", "engine_runs=1") for b in (1, 16, 128)]
    planned = plan_cells(jobs, compose_cell)
    specs = {(p.cell.method, p.cell.batch_size): p.cell.engine_spec(prepare=False) for p in planned}
    # One engine per method, as before the graphs: the batch does not split an engine.
    assert engine_starts(planned) == 2
    assert {s.cudagraph_capture_sizes[-1] for (m, _), s in specs.items() if m == "ngram"} == {640}
    assert {s.cudagraph_capture_sizes[-1] for (m, _), s in specs.items() if m == "baseline"} == {128}
    assert specs[("ngram", 1)].llm_kwargs()["compilation_config"]["cudagraph_capture_sizes"][-1] == 640
    # The job composed from a planned cell's overrides builds the same engine; the identity is the cell's.
    for p in planned:
        again = cell_from_config(compose_cell(list(p.overrides)))
        assert again.engine_spec(prepare=False) == p.cell.engine_spec(prepare=False)
        assert again.cell_id == p.cell.cell_id == cell_from_config(compose_cell(
            [o for o in p.overrides if not o.startswith(grid.GRAPH_BATCH_KEY)])).cell_id
    # A single run: the cell covers its own steps (batch x (K+1)), its baseline its batch.
    single = grid.single_run_cells(cell_from_config(compose_cell(list(jobs[1]))), 1)
    assert {p.cell.method: p.cell.engine_spec(prepare=False).cudagraph_capture_sizes[-1] for p in single} == {
        "baseline": 16, "ngram": 80}


def test_plan_shows_the_capture_sizes_and_graph_memory_of_a_gpu_grid():
    rows = make_plan(["sweep=batch_decay", "model=qwen2.5-7b-instruct-awq", "hardware=rtx4090",
                      "method=ngram", "workload=summarize", "batch_size=1,128"])
    by_label = {r.label: r for r in rows}
    spec, base = by_label["ngram K=4 b=1 summarize"], by_label["baseline K=0 b=1 summarize"]
    # Batch 1 runs on the engine that serves batch 128: its graphs cover 128 x 5.
    assert spec.estimate.capture_sizes[-1] == 640 and base.estimate.capture_sizes[-1] == 128
    assert spec.estimate.graph_bytes > base.estimate.graph_bytes > 0
    text = format_plan(rows, 0.7)
    assert "capture" in text and "graphs" in text and "640 (67)" in text and "largest step 640 tokens" in text
    # An explicitly eager engine captures nothing.
    eager = make_plan(["model=qwen2.5-7b-instruct-awq", "hardware=rtx4090", "engine.enforce_eager=true"])
    assert all(r.estimate.graph_bytes == 0 for r in eager) and "eager" in format_plan(eager, 0.7)
    # A step beyond max_num_batched_tokens cannot be one graph: the plan says so.
    over = make_plan(["model=qwen2.5-7b-instruct-awq", "hardware=rtx4090", "method=ngram",
                      "num_speculative_tokens=4", "batch_size=128", "engine.max_num_batched_tokens=512"])
    assert any(r.step_over_limit for r in over)
    assert "step 640 > max_num_batched_tokens 512, no graph" in format_plan(over, 0.7)


# The CPU build turns graphs off; the sizing rule itself is platform-independent Python. What vLLM's config
# machinery makes of three requests: the list specbench hands it, a largest size alone, neither.
_SIZED = """
import json

from vllm.config.compilation import CUDAGraphMode
from vllm.engine.arg_utils import EngineArgs

from specbench import models
from specbench.analytic import graphs

config = EngineArgs(
    model=str(models.resolve("embedded:smollm2-135m-instruct")), skip_tokenizer_init=True, max_num_seqs=256,
    max_num_batched_tokens=8192,
    speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
).create_engine_config()
compilation = config.compilation_config


def sized(sizes, largest):
    config.model_config.enforce_eager = False
    compilation.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    compilation.cudagraph_capture_sizes, compilation.max_cudagraph_capture_size = sizes, largest
    config._set_cudagraph_sizes()
    return [list(compilation.cudagraph_capture_sizes), compilation.max_cudagraph_capture_size]


ours = list(graphs.capture_sizes(100, 4, None))
print(json.dumps({"ours": ours, "given": sized(ours, None), "largest_alone": sized(None, 500),
                  "default": sized(None, None)}))
"""


@pytest.mark.engine  # not an engine, but vLLM's config machinery: vLLM is imported once for the engine pass
def test_vllm_keeps_the_list_and_a_largest_size_alone_misses_off_grid_decode_steps():
    # In a process forked from the engine fork server, which has imported vLLM: this one never does.
    from conftest import run_forked

    done = run_forked(_SIZED, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    ours = found["ours"]
    assert found["given"] == [ours, 500]
    assert 500 not in found["largest_alone"][0]  # truncated to the grid's 496: 100 requests x 5 get no graph
    assert max(found["default"][0]) == 512  # the default ceiling: 128 x 5 = 640 gets none


def test_graph_memory_is_shaped_like_each_runners_accounting(monkeypatch):
    """V2 measures PIECEWISE graphs in full (every compiled piece at every size) and extrapolates FULL ones;
    V1 extrapolates both from the second size, at least 1 MiB a size. The old charge, 2 x 1 MiB per size plus
    the pool, was a fraction of either for the README's 4090 engines."""
    model = prediction.model_profile("Qwen/Qwen2.5-7B-Instruct-AWQ", "bfloat16")
    sizes = graphs.capture_sizes(64, 4, None)
    pool = footprint.cuda_graph_bytes([model], sizes[-1:]) - 29 * footprint.PIECE_GRAPH_BYTES
    n, mib = len(sizes), footprint.GRAPH_OVERHEAD_BYTES
    v2 = footprint.cuda_graph_bytes([model], sizes, "V2")
    v1 = footprint.cuda_graph_bytes([model], sizes, "V1")
    assert v2 == pool + n * 29 * footprint.PIECE_GRAPH_BYTES + (n - 1) * mib
    assert v1 == pool + 29 * footprint.PIECE_GRAPH_BYTES + (n - 1) * max(29 * footprint.PIECE_GRAPH_BYTES, mib) \
        + (n - 1) * mib
    old = pool + 2 * n * mib
    assert v2 > 2 * (old - pool) + pool and v1 == v2  # pieces above the floor: both count every size's graphs
    # A drafter's pieces are captured too.
    head = prediction.model_profile("Qwen/Qwen2.5-0.5B-Instruct", "bfloat16")
    both = footprint.cuda_graph_bytes([model, head], sizes, "V2")
    assert both - v2 > n * footprint.compiled_pieces(head) * footprint.PIECE_GRAPH_BYTES
    with pytest.raises(ValueError, match="model_runner"):
        footprint.cuda_graph_bytes([model], sizes, "V3")
    # Below the floor, V1's extrapolation reserves vLLM's 1 MiB a size, V2 only what the graphs hold.
    monkeypatch.setattr(footprint, "PIECE_GRAPH_BYTES", 1024)
    assert footprint.cuda_graph_bytes([model], sizes, "V1") - footprint.cuda_graph_bytes([model], sizes, "V2") \
        == (n - 1) * (mib - 29 * 1024)


def test_v1_rounds_the_capture_list_to_multiples_of_k_plus_1():
    """CompilationConfig.adjust_cudagraph_sizes_for_spec_decode, for engines vLLM runs on V1."""
    from vllm.config.compilation import CompilationConfig

    for batch, k in ((1, 4), (8, 2), (64, 4), (37, 3)):
        sizes = graphs.capture_sizes(batch, k, None)
        vllm_config = CompilationConfig(cudagraph_capture_sizes=list(sizes), max_cudagraph_capture_size=max(sizes))
        vllm_config.adjust_cudagraph_sizes_for_spec_decode(k + 1)
        assert graphs.v1_capture_sizes(sizes, k + 1) == tuple(vllm_config.cudagraph_capture_sizes), (batch, k)
        assert batch * (k + 1) in graphs.v1_capture_sizes(sizes, k + 1)  # the widest decode step keeps its graph
    assert graphs.v1_capture_sizes((1, 2, 4, 5), 5) == (5,) and graphs.v1_capture_sizes((1, 2), 1) == (1, 2)
    # The plan's engines: the heterogeneous-vocabulary draft runs on V1 and gets the rounded list; V2 keeps it.
    cfg = {"engine": {"enforce_eager": False, "max_num_seqs": 256, "max_num_batched_tokens": None},
           "method": {"name": "draft_model", "speculative_config": {"method": "draft_model", "num_speculative_tokens": 4,
                                                                   "use_heterogeneous_vocab": True}},
           "num_speculative_tokens": 4, "batch_size": 64}
    gpu = {"memory_bytes": 24 * footprint.GIB, "max_num_batched_tokens": 8192}
    assert memory.model_runner(cfg, gpu) == "V1"
    assert memory.capture_sizes(cfg, gpu) == graphs.v1_capture_sizes(graphs.capture_sizes(64, 4, None), 5)
    same = {**cfg, "method": {"name": "draft_model", "speculative_config": {"method": "draft_model",
                                                                          "num_speculative_tokens": 4}}}
    assert memory.model_runner(same, gpu) == "V2"
    assert memory.capture_sizes(same, gpu) == graphs.capture_sizes(64, 4, None)
