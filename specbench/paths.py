"""Where specbench keeps what it prepares once per machine: one cache root and its folders.

``$SPECBENCH_CACHE`` (default ``~/.cache/specbench``) holds the embedded
models (``models/``), heads trained here (``heads/``) and calibrated hardware
profiles (``hardware/``). One module owns the root so that no module has to
reach it through another's folder.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache root: ``$SPECBENCH_CACHE``, else ``~/.cache/specbench``."""
    return Path(os.environ.get("SPECBENCH_CACHE") or Path.home() / ".cache" / "specbench")


def models_dir() -> Path:
    """Prepared embedded checkpoints."""
    return cache_root() / "models"


def heads_dir() -> Path:
    """Heads that ``python -m specbench.heads train`` writes (never over the shipped ones)."""
    return cache_root() / "heads"


def hardware_dir() -> Path:
    """Calibrated hardware profiles (``python -m specbench.calibrate``)."""
    return cache_root() / "hardware"
