"""The execution mode vLLM resolved for an engine, read from its ``VllmConfig``.

Apart from :mod:`specbench.engine.worker` (which reads it inside vLLM's worker) so that
:mod:`specbench.engine.serving` (which reads it from ``AsyncLLM``'s front end) need not import the
worker, nor the worker the serving engine's module: neither imports the other at module level or
inside a function. Pure attribute reads: no vLLM import.
"""

from __future__ import annotations

from typing import Any

from specbench.engine import EngineMode


def engine_mode(vllm_config: Any, use_v2_model_runner: bool | None = None) -> EngineMode:
    """The execution mode vLLM resolved, from a running engine's ``VllmConfig``.

    ``use_v2_model_runner``: what the worker chose when it built its model
    runner (``GPUWorker.use_v2_model_runner``, which the CPU worker inherits);
    None reads the config's property, which decides it from the same facts
    (``VLLM_USE_V2_MODEL_RUNNER``, Triton, the speculative method).
    """
    scheduler, compilation = vllm_config.scheduler_config, vllm_config.compilation_config
    v2 = vllm_config.use_v2_model_runner if use_v2_model_runner is None else use_v2_model_runner
    graphs = compilation.cudagraph_mode
    return EngineMode(
        model_runner="V2" if v2 else "V1",
        async_scheduling=bool(scheduler.async_scheduling),
        cudagraph_mode=getattr(graphs, "name", str(graphs)),
        cudagraph_capture_sizes=tuple(sorted(int(n) for n in compilation.cudagraph_capture_sizes or ())),
        max_num_batched_tokens=int(scheduler.max_num_batched_tokens),
        max_num_seqs=int(scheduler.max_num_seqs),
        prefix_caching=bool(vllm_config.cache_config.enable_prefix_caching),
    )
