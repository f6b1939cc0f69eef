"""The calibration fit: turns measured step times (and draft passes) into an effective
hardware profile by least squares. Measuring them is :mod:`specbench.calibrate`'s job.

Units throughout: seconds, bytes, FLOPs, tokens. Standard library only: the model runs and is
tested without vLLM, torch or a GPU.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from specbench.analytic.checks import check_int, check_real
from specbench.analytic.drafting import EAGLE_FC_INPUTS, cost_model, draft_time
from specbench.analytic.profiles import HardwareProfile, ModelProfile
from specbench.analytic.steps import check_step, pass_work, roofline_time, verify_step


@dataclass(frozen=True)
class StepSample:
    """One measured forward pass: num_tokens tokens over num_seqs sequences,
    each attending to context_len cached tokens, took `seconds`; logits of
    them went through the LM head (None: all, as in decode; a prefill reads
    one per sequence)."""

    num_tokens: float
    num_seqs: int
    context_len: float
    seconds: float
    logits: float | None = None


def _golden_section(f: Callable[[float], float], low: float, high: float, tol: float) -> float:
    shrink = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = low + (1 - shrink) * (high - low), low + shrink * (high - low)
    fa, fb = f(a), f(b)
    while high - low > tol:
        if fa <= fb:
            high, b, fb = b, a, fa
            a = low + (1 - shrink) * (high - low)
            fa = f(a)
        else:
            low, a, fa = a, b, fb
            b = low + shrink * (high - low)
            fb = f(b)
    return (low + high) / 2


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """x with matrix @ x = rhs by Gaussian elimination with partial pivoting; None if (nearly) singular.

    ``matrix`` is a Gram matrix of unit-norm columns (diagonal 1), so a pivot
    below 1e-9 means two columns are parallel to within float precision.
    """
    n = len(rhs)
    m = [row[:] + [rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-9:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            factor = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= factor * m[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _nonnegative_least_squares(rows: Sequence[Sequence[float]], required: int) -> tuple[float, list[float]]:
    """min sum_i (rows_i . x - 1)^2 over x >= 0 with x[required] > 0, by trying every support.

    Columns are scaled to unit norm first, so that bytes, FLOPs and counts
    (1e9 apart) solve alike. Few columns (<= 5) make the 2^n supports cheap,
    and the best feasible support is the exact optimum; a support whose
    columns are parallel is skipped (a smaller one fits as well). Returns the
    loss and x.
    """
    n = len(rows[0])
    norms = [math.sqrt(sum(r[j] ** 2 for r in rows)) or 1.0 for j in range(n)]
    scaled = [[r[j] / norms[j] for j in range(n)] for r in rows]
    gram = [[sum(r[i] * r[j] for r in scaled) for j in range(n)] for i in range(n)]
    moment = [sum(r[i] for r in scaled) for i in range(n)]
    best: tuple[float, list[float]] = (math.inf, [0.0] * n)
    for mask in range(1 << n):
        support = [j for j in range(n) if mask >> j & 1]
        if required not in support:
            continue
        x_support = _solve([[gram[i][j] for j in support] for i in support], [moment[i] for i in support])
        if x_support is None or min(x_support) < 0.0:
            continue
        x = [0.0] * n
        for j, value in zip(support, x_support):
            x[j] = value
        loss = sum((sum(r[j] * x[j] for j in support) - 1.0) ** 2 for r in scaled)
        if loss < best[0]:
            best = (loss, x)
    return best[0], [x / norms[j] for j, x in enumerate(best[1])]


def fit_hardware_profile(
    samples: Sequence[StepSample], model: ModelProfile, *, name: str
) -> tuple[HardwareProfile, list[float]]:
    """Effective hardware profile under which step_time reproduces measured passes.

    Fits the six rates of :class:`HardwareProfile` (memory bandwidth W, peak
    P, KV bandwidth W_kv, attention rate P_att, overheads c and s per
    sequence) in
    t_i = c + s * n_i + max(B_i / W, F_i / P) + K_i / W_kv + A_i / P_att
    (B_i weight bytes, F_i linear FLOPs, K_i KV bytes and A_i attention FLOPs
    that step_time charges sample i, n_i its sequences) by minimising
    sum_i (t_i / seconds_i - 1)^2. With v = 1 / P and rho = P / W (the ridge
    intensity, FLOP/byte) t_i is linear in (v, 1/W_kv, 1/P_att, c, s) for
    fixed rho: those come from a non-negative least-squares solve, and only
    log(rho) is searched (a 201-point grid, then golden section). A rate
    whose cost the samples cannot see (its coefficient 0) comes back as inf.

    The terms separate only if the samples vary them independently: plain
    decode steps alone move linear FLOPs and sequences together, and KV bytes
    and attention FLOPs together. Prefill steps (many tokens per sequence,
    logits at one) break both ties; :mod:`specbench.calibrate` measures both.

    rho is searched only between the smallest and largest sample intensity
    F_i / B_i: beyond either end every sample sits on one side of the ridge
    and the loss is flat. So when all samples are memory-bound, where P is only
    bounded below, the fit reports the smallest peak that keeps every sample
    memory-bound; likewise the smallest bandwidth when all are compute-bound.

    Returns the profile (source "calibrated", units as HardwareProfile) and the
    per-sample relative residuals predicted / measured - 1.
    """
    if len(samples) < 6:
        raise ValueError(
            "samples must hold at least 6 measurements (6 rates are fitted), "
            f"got {len(samples)}"
        )
    work, seconds = [], []
    for i, s in enumerate(samples):
        num_tokens, num_seqs, context_len = check_step(s.num_tokens, s.num_seqs, s.context_len)
        logits = None if s.logits is None else check_real(f"samples[{i}].logits", s.logits, 1.0, num_tokens)
        work.append(pass_work(model, num_tokens, num_seqs, context_len, logits=logits))
        seconds.append(check_real(f"samples[{i}].seconds", s.seconds, 0.0, low_open=True))

    def solve(log_rho: float) -> tuple[float, list[float]]:
        rho = math.exp(log_rho)
        rows = [[max(rho * w.weight_bytes, w.linear_flops) / t, w.kv_bytes / t, w.attention_flops / t,
                 1.0 / t, w.num_seqs / t] for w, t in zip(work, seconds)]
        return _nonnegative_least_squares(rows, required=0)

    intensities = [math.log(w.linear_flops / w.weight_bytes) for w in work]
    low, high = min(intensities), max(intensities)
    grid = [low + (high - low) * j / 200 for j in range(201)]
    losses = [solve(x)[0] for x in grid]
    # Ties (samples that cannot tell weight reads from fixed cost, e.g. all memory-bound)
    # go to the largest ridge: the smallest peak that still explains every sample.
    j = max(j for j, loss in enumerate(losses) if loss <= min(losses) + 1e-12)
    refined = _golden_section(
        lambda x: solve(x)[0], grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)], tol=1e-9
    )
    log_rho = refined if solve(refined)[0] < losses[j] - 1e-12 else grid[j]
    loss, (v, per_kv_byte, per_attention_flop, c, per_seq) = solve(log_rho)
    if not math.isfinite(loss) or v <= 0.0:
        raise ValueError(
            "samples do not show step time growing with work; bandwidth and peak cannot be fitted"
        )
    profile = HardwareProfile(
        name=name,
        memory_bandwidth=1.0 / (v * math.exp(log_rho)),
        peak_flops=1.0 / v,
        fixed_overhead_s=c,
        per_seq_overhead_s=per_seq,
        kv_bandwidth=1.0 / per_kv_byte if per_kv_byte > 0.0 else math.inf,
        attention_flops=1.0 / per_attention_flop if per_attention_flop > 0.0 else math.inf,
        source="calibrated",
        notes=f"fitted to {len(samples)} step-time samples of {model.name}",
    )
    residuals = [roofline_time(profile, w) / t - 1.0 for w, t in zip(work, seconds)]
    return profile, residuals


@dataclass(frozen=True)
class DraftSample:
    """One measured speculative decode pass: batch_size sequences at context_len,
    each verifying k drafted tokens (EAGLE drafts K on every pass), took
    `seconds` (decode seconds over verified drafts: draft passes included)."""

    batch_size: int
    k: int
    context_len: float
    seconds: float


def fit_draft_overhead(
    samples: Sequence[DraftSample],
    *,
    method: str,
    target: ModelProfile,
    head: ModelProfile | None,
    hw: HardwareProfile,
) -> tuple[float, list[float]]:
    """Per-draft-pass fixed cost under which step time and draft time reproduce measured passes.

    A speculative pass costs verify_step + k draft passes, each the head's
    roofline work plus a fixed cost d (:func:`draft_time`). With the target's
    profile ``hw`` already fitted, each sample gives
    d_i = (seconds_i - verify_i - k * work_i) / k; d is their median, floored
    at 0 (a fit of the target that overprices verification can push one
    below). Returns d in seconds and each sample's relative residual
    predicted / measured - 1 under it.
    """
    cost_model(method)  # an unknown method is refused before the EAGLE-only check below
    if method not in EAGLE_FC_INPUTS:
        raise ValueError(f"method must be an EAGLE head ({', '.join(EAGLE_FC_INPUTS)}); got {method!r}")
    if not samples:
        raise ValueError("samples must not be empty")
    free = replace(hw, draft_overhead_s=0.0)
    # Per sample: measured seconds, and the pass priced without the draft overhead.
    priced = []
    for i, s in enumerate(samples):
        k = check_int(f"samples[{i}].k", s.k, 1)
        seconds = check_real(f"samples[{i}].seconds", s.seconds, 0.0, low_open=True)
        base = verify_step(target, hw, s.batch_size, k, s.context_len) + draft_time(
            method, hw=free, batch_size=s.batch_size, k=k, context_len=s.context_len, draft=head, target=target)
        priced.append((k, seconds, base))
    overhead = max(statistics.median((seconds - base) / k for k, seconds, base in priced), 0.0)
    residuals = [(base + k * overhead) / seconds - 1.0 for k, seconds, base in priced]
    return overhead, residuals
