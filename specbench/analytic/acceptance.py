"""Acceptance: how many tokens one target pass yields, E(alpha, K) = sum_{i=0..K} alpha^i.

Units throughout: seconds, bytes, FLOPs, tokens. Standard library only: the model runs and is
tested without vLLM, torch or a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from specbench.analytic.checks import check_int, check_real


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Expected tokens emitted per target forward pass with K drafted tokens.

    E(alpha, K) = sum_{i=0..K} alpha^i = (1 - alpha^(K+1)) / (1 - alpha), and
    K + 1 at alpha = 1. alpha is the per-token acceptance probability, taken
    independent across positions; K = k drafted tokens per pass. Result in
    tokens per target pass, in [1, K + 1].
    """
    alpha = check_real("alpha", alpha, 0.0, 1.0)
    k = check_int("k", k, 0)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _check_rates(rates: Sequence[float]) -> list[float]:
    return [check_real(f"rates[{i}]", r, 0.0, 1.0) for i, r in enumerate(rates)]


def expected_tokens_from_rates(rates: Sequence[float]) -> float:
    """Expected tokens per drafted pass from measured per-position acceptance rates.

    rates[i] = accepted_at_position_i / drafts, as vLLM reports them. These are
    unconditional (position i accepted implies every earlier one was), so
    sum(rates) is the mean number of accepted draft tokens per draft and
    E = 1 + sum(rates), the 1 being the target's own token. Result in tokens
    per target pass that carried a draft (vLLM's acceptance length); empty
    rates give 1.
    """
    return 1.0 + sum(_check_rates(rates))
