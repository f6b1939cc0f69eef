"""EAGLE and EAGLE-3 draft heads that specbench trains for its own targets, and ships.

No published head exists for the embedded SmolLM2-135M-Instruct target, so
specbench self-distils its own (``python -m specbench.heads train``, see
:mod:`specbench.heads.__main__`) and ships the result as package data under
``specbench/heads/shipped/<target>-<method>/``. A model config names a
shipped head as ``heads:<target>-<method>``; :func:`specbench.models.resolve`
turns that into the folder vLLM loads.

Modules: :mod:`~specbench.heads.corpus` (training prompts),
:mod:`~specbench.heads.features` (the target's answers and states),
:mod:`~specbench.heads.modules` (the heads in PyTorch, as vLLM computes
them), :mod:`~specbench.heads.train` (objective, offline acceptance,
checkpoint format). The target's answers are decoded by vLLM, through
:mod:`specbench.engine` (the one module that imports it); the heads train in
plain torch.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

HEADS_PREFIX = "heads:"
HEADS_CACHE_HINT = "$SPECBENCH_CACHE/heads or ~/.cache/specbench/heads"


def head_name(target: str, method: str) -> str:
    """The folder name of ``target``'s head for ``method``."""
    return f"{target}-{method}"


def shipped_dir() -> Path:
    """The package folder holding the shipped heads."""
    return Path(str(importlib.resources.files("specbench.heads") / "shipped"))


def default_output_dir() -> Path:
    """Where ``train`` writes heads unless told otherwise (never over the shipped ones).

    Beside the embedded models, under the same cache root (``$SPECBENCH_CACHE``).
    """
    from specbench import models  # models resolves heads: references, so import it late

    return models.cache_dir().parent / "heads"


def is_shipped(reference: str) -> bool:
    """True when ``reference`` names a shipped head (``heads:<name>``)."""
    return reference.startswith(HEADS_PREFIX)


def shipped_path(reference: str) -> Path:
    """The folder of a ``heads:<name>`` reference; ValueError naming the shipped heads if unknown."""
    name = reference[len(HEADS_PREFIX) :]
    folder = shipped_dir() / name
    if not (folder / "config.json").is_file():
        available = sorted(p.name for p in shipped_dir().iterdir() if (p / "config.json").is_file())
        raise ValueError(
            f"unknown shipped head {reference!r}; shipped: "
            + (", ".join(HEADS_PREFIX + n for n in available) or "none")
        )
    return folder
