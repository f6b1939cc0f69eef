"""Workloads: the prompts a cell submits, loaded from a config and tokenized.

See :mod:`specbench.workloads.sources` for the sources (built-in files,
Spec-Bench, any JSON-lines file, Hugging Face datasets) and how prompts are
filtered by length and drawn, and :mod:`specbench.workloads.tokens` for
their token lengths before any engine loads (what validation checks).
"""

from specbench.workloads.sources import (
    NAMES,
    SELECTIONS,
    SOURCE_KEYS,
    SOURCES,
    SPEC_BENCH_CATEGORIES,
    SPEC_BENCH_WORKLOAD_CATEGORIES,
    Prompt,
    Tokenizer,
    Workload,
    WorkloadError,
    WorkloadSchema,
    estimated_requests,
    load_prompts,
    load_workload,
    validate_workload_config,
)
from specbench.workloads.tokens import PromptLengths, check_source, prompt_lengths

__all__ = [
    "NAMES",
    "SELECTIONS",
    "SOURCE_KEYS",
    "SOURCES",
    "SPEC_BENCH_CATEGORIES",
    "SPEC_BENCH_WORKLOAD_CATEGORIES",
    "Prompt",
    "PromptLengths",
    "Tokenizer",
    "Workload",
    "WorkloadError",
    "WorkloadSchema",
    "check_source",
    "estimated_requests",
    "load_prompts",
    "load_workload",
    "prompt_lengths",
    "validate_workload_config",
]
