"""Checks and shaping of the values every statistic here takes: finite arrays, a confidence level, positive
ratios, and the engine runs a set of cells was measured in together."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence

import numpy as np


def _finite_array(values: Sequence[float], name: str) -> np.ndarray:
    """Return values as a 1-D float array, rejecting NaN and infinities.

    A NaN timing is a broken measurement; letting it through would turn
    every summary into NaN far from where the fault happened.
    """
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite, got {array.tolist()}")
    return array


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")


def _confidence_tag(confidence: float) -> str:
    # "%g" turns 0.95 into "95" and 0.975 into "97.5", hiding float noise.
    return f"{confidence * 100:g}"


def _in_common_runs(cells: Sequence[Mapping[Hashable, float]]) -> tuple[list[Hashable], list[np.ndarray | None]]:
    """The engine runs most of ``cells`` were measured in, and each cell's log ratios in them (None for a
    cell missing one: it failed there). A cell measured in an extra run enters with the common runs only."""
    shared = Counter(frozenset(ratios) for ratios in cells).most_common(1)[0][0]
    runs = sorted(shared, key=str)
    logs = [_finite_array([math.log(ratios[r]) for r in runs], "ratios") if shared <= set(ratios) else None
            for ratios in cells]
    return runs, logs


def _positive(ratios: Sequence[float]) -> Sequence[float]:
    if any(r <= 0 for r in ratios):
        raise ValueError(f"ratios must be positive, got {list(ratios)}")
    return ratios
