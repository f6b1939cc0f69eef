"""Imported once by the engine workers' fork server, so that each worker starts with vLLM loaded.

Importing vLLM (and torch and transformers with it) takes about 10 s on two
CPU cores: a sweep of ten engines paid it ten times. The fork server
(:func:`specbench.engine.worker_context`) imports this module once; every
engine worker is then a fork of a process that has already imported vLLM
but has built no engine, started no threads and touched no device.

What the import prints goes to ``$SPECBENCH_ENGINE_LOG`` when it is set, as the
workers' own output does, so the terminal stays quiet.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from specbench.logs import ENGINE_LOG_ENV, redirect_output

if os.environ.get(ENGINE_LOG_ENV):
    redirect_output(Path(os.environ[ENGINE_LOG_ENV]))

import torch  # noqa: E402,F401
import transformers  # noqa: E402,F401
import vllm  # noqa: E402,F401
import vllm.entrypoints.llm  # noqa: E402,F401

# What vLLM 0.32 imports only as an engine starts, found by tracing the imports of offline CPU engines'
# starts (plain, ngram, EAGLE-3): ~730 modules, the model runner's most, which every start imported again
# (~2 s on 2 cores, docs/results/2026-12-04-timings.md), imported here once instead. Left out:
# vllm.v1.spec_decode.ngram_proposer, which imports numba: with numba loaded, the scan of every module that
# vLLM's CPU platform runs as an engine starts fails ("'_lib_fn_wrapper' object has no attribute 'get'",
# docs/vllm-on-cpu.md, pitfall 1), so an ngram engine imports it itself, after that scan. A name another
# vLLM version lacks is skipped: its engines import what they need as they start.
ENGINE_START_MODULES = (
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.attention.backends.cpu_attn",
    "vllm.model_executor.layers.quantization.online.base",
    "vllm.distributed.elastic_ep.elastic_execute",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.v1.pool.flash_maxsim",
    "vllm.compilation.backends",
    "vllm.transformers_utils.configs.eagle",
    "vllm.transformers_utils.configs.speculators",
)
for _name in ENGINE_START_MODULES:
    try:
        importlib.import_module(_name)
    except ImportError:
        pass
