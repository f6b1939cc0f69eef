"""EAGLE and EAGLE-3 draft heads that specbench trains for its own targets, and ships.

No published head exists for the embedded SmolLM2-135M-Instruct target, so
specbench self-distils its own (``python -m specbench.heads train``, see
:mod:`specbench.heads.__main__`) and ships the result as package data under
``specbench/heads/shipped/<target>-<method>/``. A model config names a
shipped head as ``heads:<target>-<method>``; :func:`specbench.models.resolve`
(which owns every kind of checkpoint reference) turns that into the folder vLLM loads.

Modules: :mod:`~specbench.heads.human` (human-written training prompts),
:mod:`~specbench.heads.decontamination` (no phrase shared with an evaluation set),
:mod:`~specbench.heads.features` (the target's answers and states),
:mod:`~specbench.heads.modules` (the heads in PyTorch, as vLLM computes
them), :mod:`~specbench.heads.train` (objective, offline acceptance,
checkpoint format). The target's answers are decoded by vLLM, through
:mod:`specbench.engine.worker` (the engine layer imports it, nothing else); the heads train in
plain torch.
"""

from __future__ import annotations

from pathlib import Path

from specbench import paths

HEADS_CACHE_HINT = "$SPECBENCH_CACHE/heads or ~/.cache/specbench/heads"


def head_name(target: str, method: str) -> str:
    """The folder name of ``target``'s head for ``method``."""
    return f"{target}-{method}"


def default_output_dir() -> Path:
    """Where ``train`` writes heads unless told otherwise (never over the shipped ones).

    Beside the embedded models, under the same cache root (``$SPECBENCH_CACHE``).
    """
    return paths.heads_dir()
