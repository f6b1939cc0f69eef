"""Speedup and the decisions derived from it: the predicted decode speedup, the mean TPOT of a
batch that thins, its dilution by prefill in wall time, batch tails, the break-even batch size
and the best K per batch size.

Units throughout: seconds, bytes, FLOPs, tokens. Standard library only: the model runs and is
tested without vLLM, torch or a GPU.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence

from specbench.analytic.acceptance import expected_tokens_per_pass
from specbench.analytic.checks import check_int, check_real
from specbench.analytic.drafting import cost_model, draft_time
from specbench.analytic.profiles import HardwareProfile, ModelProfile
from specbench.analytic.steps import plain_decode_step, verify_step


def predicted_decode_speedup(
    *,
    method: str,
    k: int,
    batch_size: int,
    tokens_per_pass: float,
    target: ModelProfile,
    hw: HardwareProfile,
    context_len: float,
    draft: ModelProfile | None = None,
    draft_tokens_per_pass: float | None = None,
) -> float:
    """Predicted decode speedup of speculation over plain decoding (dimensionless).

    S(B, K) = E * T_plain(B) / (T_verify(B, K) + T_draft(B, K)), with
    E = tokens_per_pass (tokens per target pass, e.g. expected_tokens_per_pass
    or a measured value, in [1, K + 1]). draft_tokens_per_pass is passed to
    verify_step (default K: every pass carries a full draft). 1 for method
    "baseline" or k = 0.
    """
    cost_model(method)  # an unknown method is refused, even at K = 0
    k = check_int("k", k, 0)
    if method == "baseline" or k == 0:
        return 1.0
    tokens_per_pass = check_real("tokens_per_pass", tokens_per_pass, 1.0, k + 1.0)
    plain = plain_decode_step(target, hw, batch_size, context_len)
    return tokens_per_pass * plain / speculative_step(
        method, target=target, hw=hw, batch_size=batch_size, k=k, context_len=context_len,
        draft=draft, draft_tokens_per_pass=draft_tokens_per_pass,
    )


def speculative_step(
    method: str,
    *,
    target: ModelProfile,
    hw: HardwareProfile,
    batch_size: int,
    k: int,
    context_len: float,
    draft: ModelProfile | None = None,
    draft_tokens_per_pass: float | None = None,
) -> float:
    """Seconds of one speculative decode step: the drafter's passes, then the target verifying them.

    T_verify(B, K) (:func:`verify_step`, draft_tokens_per_pass drafted
    tokens per sequence, default K) + T_draft(B, K) (:func:`draft_time`).
    """
    return verify_step(target, hw, batch_size, k, context_len, draft_tokens_per_pass) + draft_time(
        method, hw=hw, batch_size=batch_size, k=k, context_len=context_len, draft=draft, target=target)


def end_to_end_speedup(
    decode_speedup: float,
    prefill_s: float,
    plain_decode_s: float,
    draft_prefill_s: float = 0.0,
    *,
    plain_tail: float = 1.0,
    speculative_tail: float = 1.0,
) -> float:
    """Wall-time speedup when only decode speeds up: (P + g_p D) / (P + P_d + g_s D / S).

    prefill_s (P) and plain_decode_s (D) are the times a plain engine spends
    prefilling and decoding the same batch, every request at the mean length;
    decode_speedup (S) is the decode speedup (predicted_decode_speedup);
    draft_prefill_s (P_d) is what the drafter adds to the prefill
    (:func:`draft_prefill_time`: a draft model or EAGLE head processes the
    prompts too). Prefill dilutes S towards 1 as P grows, which on long
    prompts and large batches it does. The tails (g_p, g_s >= 1,
    :func:`batch_tail`) say how much longer each side's batch decodes than
    its mean request: a batch ends with its slowest request, and under
    speculation requests differ far more in passes than in tokens.
    """
    decode_speedup = check_real("decode_speedup", decode_speedup, 0.0, low_open=True)
    prefill_s = check_real("prefill_s", prefill_s, 0.0)
    plain_decode_s = check_real("plain_decode_s", plain_decode_s, 0.0)
    draft_prefill_s = check_real("draft_prefill_s", draft_prefill_s, 0.0)
    plain_tail = check_real("plain_tail", plain_tail, 1.0)
    speculative_tail = check_real("speculative_tail", speculative_tail, 1.0)
    if prefill_s + plain_decode_s == 0.0:
        return 1.0
    return (prefill_s + plain_tail * plain_decode_s) / (
        prefill_s + draft_prefill_s + speculative_tail * plain_decode_s / decode_speedup
    )


def mean_tpot(
    passes: Sequence[Sequence[float]],
    output_tokens: Sequence[Sequence[float]],
    step_s: Callable[[int], float],
    *,
    prefill_steps: int = 1,
    mixed_step_s: float = 0.0,
) -> float:
    """The token-weighted mean TPOT of batches decoded one after another, as the measured ``tpot_s_mean``:
    every request's time from its first token to its last, summed, over the tokens between, summed.

    ``passes[i][r]`` and ``output_tokens[i][r]``: request r of batch i, in the
    order it was submitted, decodes its output tokens after the first (which
    its prefill emits) in that many passes; ``step_s(b)`` is one pass over b
    sequences. Two things set a request's TPOT apart from step_s(B) / tokens
    per pass:

    - The batch thins. Requests finish after different numbers of passes
      (under speculation they differ far more in passes than in tokens), and
      the passes a request makes after others finished run at the smaller
      batch, which steps faster: pass n runs at the requests still decoding
      (:func:`batch_decode_time`). At batch 8 on ngram's summarize cells the
      stragglers need six times the passes of the quickest.
    - Prefill chunks. Where a batch's prompts take ``prefill_steps`` = s > 1
      steps (:func:`steps.prefill_steps`), the request whose prefill ends in
      step j (evenly over the s steps, in submission order) decodes its first
      min(s - j, passes) passes beside the later chunks, each costing
      ``mixed_step_s``. Plain or speculative alike, this dilutes the TPOT
      ratio towards 1: on 2 CPU cores a 4096-token step of ~650-token
      summarize prompts takes seconds, a decode step tens of ms.

    Requests of one output token have no TPOT and add nothing.
    """
    prefill_steps = check_int("prefill_steps", prefill_steps, 1)
    mixed_step_s = check_real("mixed_step_s", mixed_step_s, 0.0)
    step_s = functools.cache(step_s)
    seconds, decoded = 0.0, 0.0
    for batch_passes, batch_outputs in zip(passes, output_tokens, strict=True):
        if len(batch_passes) != len(batch_outputs):
            raise ValueError(f"one pass count per request: {len(batch_passes)} passes, {len(batch_outputs)} outputs")
        counts = sorted(check_real("passes", p, 0.0) for p in batch_passes)
        for position, (count, output) in enumerate(zip(batch_passes, batch_outputs)):
            tokens = check_real("output_tokens", output, 1.0) - 1.0
            if tokens == 0.0:
                continue
            ends_in = position * prefill_steps // len(batch_passes) + 1
            beside_chunks = min(prefill_steps - ends_in, count)
            seconds += beside_chunks * mixed_step_s + _thinning_time(counts, step_s, beside_chunks, count)
            decoded += tokens
    if decoded == 0.0:
        raise ValueError("no request with more than one output token: no TPOT")
    return seconds / decoded


def _thinning_time(counts: Sequence[float], step_s: Callable[[int], float], start: float, end: float) -> float:
    """Seconds of passes start to end of a batch whose requests need ``counts`` passes (sorted): pass n runs
    over the requests that need more than n."""
    total, n = 0.0, start
    for finished, count in enumerate(counts):
        if count > n:
            upto = min(count, end)
            total += (upto - n) * step_s(len(counts) - finished)
            n = upto
        if n >= end:
            break
    return total


def batch_decode_time(passes: Sequence[float], step_s: Callable[[int], float]) -> float:
    """Decode time of one batch whose request i needs ``passes[i]`` passes.

    The batch steps until its slowest request is done, with one sequence
    fewer each time a request finishes: with the counts sorted,
    sum_j (p_(j) - p_(j-1)) * step_s(B - j + 1). ``step_s(b)`` is the time of
    one step over b sequences (:func:`plain_decode_step`, or a verify step
    plus its draft).
    """
    counts = sorted(check_real("passes", p, 0.0) for p in passes)
    return _thinning_time(counts, step_s, 0.0, counts[-1]) if counts else 0.0


def batch_tail(batches: Sequence[Sequence[float]], step_s: Callable[[int], float]) -> float:
    """How much longer batches decode than their mean request would, at full batch.

    Summed over ``batches`` (each a list of per-request pass counts):
    :func:`batch_decode_time` over mean(passes) * step_s(B). 1 when every
    request of a batch needs as many passes; above 1 as they spread, less so
    where a thinner batch steps faster.
    """
    actual = sum(batch_decode_time(b, step_s) for b in batches if b)
    even = sum(statistics.fmean(b) * step_s(len(b)) for b in batches if b)
    return actual / even if even > 0 else 1.0


def break_even_batch_size(batch_sizes: Sequence[int], speedups: Sequence[float]) -> float | None:
    """Batch size at which a speedup curve first falls below 1.

    batch_sizes must be strictly increasing. With i the first point whose
    speedup is < 1, the crossing is interpolated linearly in log2(batch)
    between points i-1 and i: log2 b = log2 b_{i-1} + (1 - s_{i-1}) /
    (s_i - s_{i-1}) * (log2 b_i - log2 b_{i-1}). Returns batch_sizes[0] if
    the curve starts below 1, None if it never falls below 1.
    """
    if len(batch_sizes) != len(speedups):
        raise ValueError(
            "batch_sizes and speedups must have equal length, "
            f"got {len(batch_sizes)} and {len(speedups)}"
        )
    sizes = [check_int(f"batch_sizes[{i}]", b, 1) for i, b in enumerate(batch_sizes)]
    if any(b >= c for b, c in zip(sizes, sizes[1:])):
        raise ValueError(f"batch_sizes must be strictly increasing, got {sizes}")
    values = [check_real(f"speedups[{i}]", s, 0.0) for i, s in enumerate(speedups)]
    for i, s in enumerate(values):
        if s < 1.0:
            if i == 0:
                return float(sizes[0])
            s0, b0, b1 = values[i - 1], math.log2(sizes[i - 1]), math.log2(sizes[i])
            return 2.0 ** (b0 + (1.0 - s0) / (s - s0) * (b1 - b0))
    return None


def best_k(
    *,
    method: str,
    batch_size: int,
    candidate_ks: Sequence[int],
    alpha: float,
    target: ModelProfile,
    hw: HardwareProfile,
    context_len: float,
    draft: ModelProfile | None = None,
) -> tuple[int, float]:
    """The K maximising predicted_decode_speedup with tokens_per_pass = E(alpha, K), and that speedup.

    K = 0 (no speculation, speedup 1) is always a candidate, so the answer is
    never a slowdown; ties go to the smaller K.
    """
    best = (0, 1.0)
    for k in sorted(set(candidate_ks)):
        speedup = predicted_decode_speedup(
            method=method, k=k, batch_size=batch_size,
            tokens_per_pass=expected_tokens_per_pass(alpha, k),
            target=target, hw=hw, context_len=context_len, draft=draft,
        )
        if speedup > best[1]:
            best = (k, speedup)
    return best


def num_speculative_tokens_per_batch_size(
    best_k_by_batch: Mapping[int, int],
) -> list[tuple[int, int, int]]:
    """Schedule of K by batch size, from the best K found on a grid of batch sizes.

    Returns (start, end, K) ranges with both ends inclusive that cover batch
    sizes 1..max(grid) without gaps or overlaps. Grid point b_j's K applies
    from b_j to b_{j+1} - 1; the first range starts at 1 (the smallest grid
    point's K extends downwards); the last ends at the largest grid point;
    neighbouring ranges with equal K merge.
    Example: {1: 4, 4: 4, 16: 2, 64: 0} -> [(1, 15, 4), (16, 63, 2), (64, 64, 0)].
    """
    if not best_k_by_batch:
        raise ValueError("best_k_by_batch must not be empty")
    grid = sorted(
        (check_int("batch size", b, 1), check_int(f"K for batch size {b}", k, 0))
        for b, k in best_k_by_batch.items()
    )
    schedule: list[tuple[int, int, int]] = []
    for j, (batch, k) in enumerate(grid):
        end = grid[j + 1][0] - 1 if j + 1 < len(grid) else batch
        if schedule and schedule[-1][2] == k:
            schedule[-1] = (schedule[-1][0], end, k)
        else:
            schedule.append((1 if j == 0 else batch, end, k))
    return schedule
