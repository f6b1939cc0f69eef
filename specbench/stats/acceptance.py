"""Draft acceptance: the per-token acceptance alpha fitted to per-position rates (:func:`fit_alpha`), and the
share of an output that loops (:func:`repeated_ngram_share`), which prompt lookup drafts perfectly."""

from __future__ import annotations

import numbers
from collections.abc import Sequence


def repeated_ngram_share(token_ids: Sequence[int], n: int = 4) -> float:
    """Share of an output's n-grams that already occurred earlier in the same output.

    Near 0 for ordinary text; near 1 for an output caught in a loop (small
    models under greedy decoding repeat one sentence to max_tokens). Loops
    matter to speculation: prompt lookup drafts them perfectly, so a few
    looping requests can carry a workload's pooled acceptance length.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = [tuple(token_ids[i : i + n]) for i in range(len(token_ids) - n + 1)]
    if not grams:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeated = 0
    for gram in grams:
        repeated += gram in seen
        seen.add(gram)
    return repeated / len(grams)


def _probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a finite number in [0, 1], got {value!r}")
    return float(value)


def fit_alpha(rates: Sequence[float]) -> float:
    """Per-token acceptance alpha whose geometric prefix model best fits rates.

    Under independent acceptance, 0-based position i is accepted with
    unconditional probability alpha^(i+1). The fit minimises
    L(alpha) = sum_i (alpha^(i+1) - rates[i])^2 over alpha in [0, 1]. L need
    not be unimodal for arbitrary rates, so a 1001-point grid picks the best
    bracket, then bisection on dL/dalpha = 2 sum_i (i+1) alpha^i (alpha^(i+1) -
    rates[i]) inside it locates the minimum to floating-point precision.
    Dimensionless, in [0, 1].
    """
    checked = [_probability(f"rates[{i}]", r) for i, r in enumerate(rates)]
    if not checked:
        raise ValueError("rates must not be empty")

    def loss(alpha: float) -> float:
        return sum((alpha ** (i + 1) - r) ** 2 for i, r in enumerate(checked))

    def slope(alpha: float) -> float:
        return sum((i + 1) * alpha**i * (alpha ** (i + 1) - r) for i, r in enumerate(checked))

    grid = [j / 1000 for j in range(1001)]
    j = min(range(len(grid)), key=lambda j: loss(grid[j]))
    low, high = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    if slope(low) >= 0.0:
        return low
    if slope(high) <= 0.0:
        return high
    while high - low > 1e-15:
        mid = (low + high) / 2
        if slope(mid) < 0.0:
            low = mid
        else:
            high = mid
    return (low + high) / 2
