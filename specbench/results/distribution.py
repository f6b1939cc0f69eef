"""Exactness in distribution: do a speculative cell's samples come from its baseline's distribution?

At temperature > 0 speculative decoding is exact in distribution, not token
for token: its rejection rule accepts a draft token with probability
min(1, p/q) and resamples from the residual otherwise, so every output
token has the target's distribution. The check draws, untimed, ``SAMPLES``
seeded samples of the first ``TOKENS`` tokens for each of a cell's first
``PROMPTS`` prompts, from the baseline and from the speculative engine
(independent seeds: :func:`specbench.sampling.distribution_seed`), and
compares them:

- the statistic (:func:`statistic`) is Pearson's two-sample chi-square over
  the token counts at each (prompt, position), summed over prompts and
  positions (a sequence that ended counts as its own token, :data:`ENDED`).
  Positions start at :data:`specbench.sampling.FIRST_CHECKED_POSITION`: both
  engines draw the first token from the prompt's logits with the target's
  own sampler, before any draft, so its counts are noise to this comparison;
- positions within one prompt's samples are dependent (each conditions on
  the ones before), so the sum has no chi-square law. Its p-value comes from
  a permutation test that exchanges whole sampled sequences between the two
  groups within each prompt (:func:`permutation_p_value`): under the null
  hypothesis all of one prompt's sequences are independent draws from one
  distribution, hence exchangeable, and the test is valid whatever the
  dependence (up to the Monte Carlo error of its finite permutations);
- its power (:func:`detectable_deviation`) is stated as the smallest
  deviation it detects with 80% power at the level Holm's adjustment applies
  to a lone deviating cell (alpha / m over m checked cells): the total-variation
  distance delta by which every position of the baseline's own empirical
  distribution is moved toward its most likely token (what a sampler biased
  toward the argmax, such as argmax drafting accepted without its
  correction, does), simulated with a fixed seed.

A sweep checks many cells, so :func:`holm` adjusts their p-values
(Holm's step-down: the chance that any exact cell is called inexact stays
at most alpha); a cell whose adjusted p-value is below :data:`ALPHA` fails.
A permutation p-value cannot fall below 1 / (1 + permutations), so the
permutations grow with the cells checked (:func:`permutations_for`): with a
fixed 1,999, past 100 cells not even the smallest p-value could clear
alpha / m, and the check could fail nothing.
Pure: numpy only, no engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specbench.sampling import FIRST_CHECKED_POSITION

# The check's default size (conf/config.yaml distribution_check.*): prompts x samples x tokens
# per cell and engine run, its cost measured per cell (distribution_check_s); pooled over
# 2 engine runs each side has 64 samples per prompt.
PROMPTS = 4
SAMPLES = 32
TOKENS = 8
# Each check prompt is cut to its last this many tokens: every sample prefills its prompt
# (the engines run without a prefix cache), and 128 full summarize prompts would cost minutes on CPU.
PROMPT_TOKENS = 64
ALPHA = 0.05
POWER = 0.8
PERMUTATIONS = 1999
# Total-variation distances the power simulation tries, smallest first.
DEVIATIONS = (0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
POWER_SIMULATIONS = 200
# A check that passes counts only if it detects, with 80% power, a deviation of at most this total-variation
# distance at the positions a draft decided; a weaker one leaves its cell "untested" (results.merge).
MAX_DETECTABLE_TV = 0.3
# The smallest attainable p-value, 1 / (1 + permutations), is kept this many times below the alpha / m
# Holm needs for the most significant of m cells (and the power simulation this many runs beyond its quantile).
FLOOR_MARGIN = 10
# Power simulations run in blocks of this many, to bound their memory.
SIMULATION_BLOCK = 1000
# Tokens seen fewer times than this at a position (both groups) are counted as one (Cochran's rule).
MIN_COUNT = 5
# A sequence that ended before a position shows this token there.
ENDED = -1

Samples = Sequence[Sequence[Sequence[int]]]  # per prompt, per sample: token ids


def _codes(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], tokens: int) -> np.ndarray:
    """One prompt's samples, both groups stacked (a first), as (samples, compared positions) ids: positions
    FIRST_CHECKED_POSITION to ``tokens - 1``, padded with ENDED."""
    rows = [list(s[:tokens]) + [ENDED] * (tokens - len(s[:tokens])) for s in [*a, *b]]
    return np.array(rows, dtype=np.int64).reshape(len(rows), tokens)[:, FIRST_CHECKED_POSITION:]


def _dense(codes: np.ndarray) -> list[np.ndarray]:
    """Per position, the token ids renumbered 0..T-1, tokens seen fewer than :data:`MIN_COUNT` times
    there (both groups together) merged into one category.

    Rare tokens make Pearson's statistic noisy without telling the groups apart;
    merging them depends only on the pooled counts, which no permutation
    changes, so the test stays exact.
    """
    dense = []
    for j in range(codes.shape[1]):
        values, inverse, counts = np.unique(codes[:, j], return_inverse=True, return_counts=True)
        rare = counts < MIN_COUNT
        renumber = np.where(rare, 0, np.cumsum(~rare))  # 0: the merged rare tokens
        dense.append(renumber[inverse.ravel()])
    return dense


def _chi_square(in_a: np.ndarray, dense: Sequence[np.ndarray], n_a: int, n_b: int) -> np.ndarray:
    """Summed two-sample chi-square for each row of ``in_a`` (groups x samples, 1 where in group a).

    Per position: X^2 = n_a n_b sum_t (a_t/n_a - b_t/n_b)^2 / (a_t + b_t).
    """
    total = np.zeros(in_a.shape[0])
    for codes in dense:
        onehot = np.zeros((codes.size, int(codes.max()) + 1))
        onehot[np.arange(codes.size), codes] = 1.0
        pooled = onehot.sum(axis=0)
        a = in_a @ onehot
        b = pooled - a
        seen = pooled > 0  # the merged rare category may be empty
        total += n_a * n_b * (((a[:, seen] / n_a - b[:, seen] / n_b) ** 2) / pooled[seen]).sum(axis=1)
    return total


def statistic(baseline: Samples, speculative: Samples, tokens: int = TOKENS) -> float:
    """The summed chi-square of two sample sets (per prompt, per sample: token ids)."""
    _check(baseline, speculative)
    value = 0.0
    for a, b in zip(baseline, speculative):
        in_a = np.zeros((1, len(a) + len(b)))
        in_a[0, : len(a)] = 1.0
        value += float(_chi_square(in_a, _dense(_codes(a, b, tokens)), len(a), len(b))[0])
    return value


def permutation_p_value(
    baseline: Samples, speculative: Samples, *, tokens: int = TOKENS, permutations: int = PERMUTATIONS,
    seed: int = 0,
) -> float:
    """The permutation p-value of :func:`statistic`: whole sequences exchanged within each prompt.

    (1 + permutations at least as extreme) / (1 + permutations), so never 0;
    deterministic for a given ``seed``.
    """
    _check(baseline, speculative)
    rng = np.random.default_rng(seed)
    observed = 0.0
    permuted = np.zeros(permutations)
    for a, b in zip(baseline, speculative):
        n_a, n_b = len(a), len(b)
        dense = _dense(_codes(a, b, tokens))
        labels = np.zeros((permutations + 1, n_a + n_b))
        labels[0, :n_a] = 1.0
        order = np.argsort(rng.random((permutations, n_a + n_b)), axis=1)
        np.put_along_axis(labels[1:], order[:, :n_a], 1.0, axis=1)
        values = _chi_square(labels, dense, n_a, n_b)
        observed += values[0]
        permuted += values[1:]
    # A relative tolerance: equal tables summed in another order must count as ties.
    extreme = int(np.sum(permuted >= observed * (1 - 1e-9)))
    return (1 + extreme) / (1 + permutations)


def permutations_for(cells: int, *, alpha: float = ALPHA) -> int:
    """Permutations for a sweep that checks ``cells`` cells at family level ``alpha``: at least
    :data:`PERMUTATIONS`, and enough that the smallest p-value, 1 / (1 + permutations), is
    :data:`FLOOR_MARGIN` times below ``alpha / cells`` (Holm's threshold for the most significant cell).
    At 0.05, 16 cells: 3,199; 100 cells: 19,999."""
    if cells < 1:
        raise ValueError(f"cells must be >= 1, got {cells}")
    return max(PERMUTATIONS, math.ceil(FLOOR_MARGIN * cells / alpha) - 1)


def verified_share(samples: Samples, tokens: int, drafts: int | None, accepted: int | None) -> float:
    """The share of the check's compared positions that a verify pass with a draft decided.

    Each such pass emits its accepted draft tokens and one of the target's own,
    so drafts + accepted positions came out of a verification; the rest the
    target sampled alone, where a proposer's defect cannot act. Positions
    compared: each sample's from :data:`FIRST_CHECKED_POSITION` up to
    ``tokens``. 1.0 where the counts are unknown (the old, optimistic
    assumption, stated as such by the caller's documentation).
    """
    if drafts is None or accepted is None:
        return 1.0
    compared = sum(max(0, min(len(s), tokens) - FIRST_CHECKED_POSITION) for prompt in samples for s in prompt)
    return min(1.0, (drafts + accepted) / compared) if compared else 0.0


def detectable_deviation(
    baseline: Samples, n_speculative: Sequence[int] | None = None, *, tokens: int = TOKENS,
    alpha: float = ALPHA, simulations: int | None = None, seed: int = 0, verified: float = 1.0,
) -> float | None:
    """The smallest total-variation distance (of :data:`DEVIATIONS`) the test detects with 80% power at ``alpha``.

    ``alpha``: the level the cell is judged at; over m checked cells Holm judges a lone deviating cell
    at ALPHA / m. ``simulations`` (default: :data:`POWER_SIMULATIONS`, or :data:`FLOOR_MARGIN` / alpha
    where more are needed to put the null's 1 - alpha quantile inside the simulated values).

    Simulated from the baseline's own samples, per prompt: both groups are
    resampled from them (sizes: the baseline's and ``n_speculative``, default
    the same), and for the alternative every position of the speculative
    group is moved by delta toward that position's most likely token (each
    token replaced by it with probability delta / (1 - its share)): a
    distance of delta in total variation at every position, the drift of a
    sampler biased toward the argmax (argmax drafts accepted without the
    rejection rule's correction). Positions whose token is certain cannot
    move and are left alone. The critical value is the null simulation's 95%
    quantile (an approximation of the permutation test's, which conditions
    on the data). None when no deviation tried is detected that often, or
    when the baseline's samples are all alike (nothing to move).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha}")
    if simulations is None:
        simulations = max(POWER_SIMULATIONS, math.ceil(FLOOR_MARGIN / alpha))
    rng = np.random.default_rng(seed)
    sizes = list(n_speculative) if n_speculative is not None else [len(a) for a in baseline]
    prompts = []
    for a, n_b in zip(baseline, sizes):
        # Renumbered once, rare tokens merged by the baseline's own counts: an approximation of
        # the test's merging by pooled counts that lets every simulation be counted at once.
        dense = _dense(_codes(a, [], tokens))
        modes = np.array([np.bincount(codes).argmax() for codes in dense])
        shares = np.array([np.bincount(codes).max() / codes.size for codes in dense])
        prompts.append((np.stack(dense, axis=1), modes, shares, n_b))
    if all(np.all(shares >= 1.0) for _, _, shares, _ in prompts):
        return None

    def simulate(delta: float) -> np.ndarray:
        return np.concatenate([simulate_block(delta, min(SIMULATION_BLOCK, simulations - start))
                               for start in range(0, simulations, SIMULATION_BLOCK)])

    def simulate_block(delta: float, simulations: int) -> np.ndarray:
        total = np.zeros(simulations)
        for codes, modes, shares, n_b in prompts:
            n_a = codes.shape[0]
            a = codes[rng.integers(0, n_a, (simulations, n_a))]  # simulations x n_a x tokens
            b = codes[rng.integers(0, n_a, (simulations, n_b))]
            if delta > 0:
                chance = verified * np.where(
                    shares < 1.0, np.minimum(1.0, delta / np.maximum(1.0 - shares, 1e-12)), 0.0)
                b = np.where(rng.random(b.shape) < chance, modes, b)
            for j in range(codes.shape[1]):
                width = int(codes[:, j].max()) + 1
                offsets = np.arange(simulations)[:, None] * width
                count_a = np.bincount((offsets + a[:, :, j]).ravel(), minlength=simulations * width)
                count_b = np.bincount((offsets + b[:, :, j]).ravel(), minlength=simulations * width)
                count_a = count_a.reshape(simulations, width).astype(float)
                count_b = count_b.reshape(simulations, width).astype(float)
                pooled = count_a + count_b
                terms = np.divide((count_a / n_a - count_b / n_b) ** 2, pooled, out=np.zeros_like(pooled),
                                  where=pooled > 0)
                total += n_a * n_b * terms.sum(axis=1)
        return total

    critical = float(np.quantile(simulate(0.0), 1 - alpha))
    for delta in DEVIATIONS:
        if float(np.mean(simulate(delta) > critical)) >= POWER:
            return delta
    return None


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order): reject where the adjusted value is below alpha."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _check(baseline: Samples, speculative: Samples) -> None:
    if len(baseline) != len(speculative) or any(len(a) == 0 or len(b) == 0 for a, b in zip(baseline, speculative)):
        raise ValueError("the two sample sets must have the same prompts, each with at least one sample")
