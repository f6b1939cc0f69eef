"""Argument checks shared by the analytic model: every public function refuses out-of-range input
with the argument's name and the allowed range.
"""

from __future__ import annotations

import math
import numbers


def check_int(name: str, value: int, minimum: int) -> int:
    # bool is an Integral, but True as a batch size is always a caller bug.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_real(
    name: str, value: float, low: float, high: float = math.inf, *, low_open: bool = False
) -> float:
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (low < value if low_open else low <= value)
        and value <= high
    )
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{']' if high < math.inf else ')'}"
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return float(value)
