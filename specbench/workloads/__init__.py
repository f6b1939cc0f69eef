"""Workloads: the prompts a cell submits, loaded from a config and tokenized.

See :mod:`specbench.workloads.sources` for the sources (built-in files,
Spec-Bench, any JSON-lines file, Hugging Face datasets) and how prompts are
filtered by length and drawn.
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
    check_source,
    estimated_requests,
    load_prompts,
    load_workload,
    validate_workload_config,
)

__all__ = [
    "NAMES",
    "SELECTIONS",
    "SOURCE_KEYS",
    "SOURCES",
    "SPEC_BENCH_CATEGORIES",
    "SPEC_BENCH_WORKLOAD_CATEGORIES",
    "Prompt",
    "Tokenizer",
    "Workload",
    "WorkloadError",
    "WorkloadSchema",
    "check_source",
    "estimated_requests",
    "load_prompts",
    "load_workload",
    "validate_workload_config",
]
