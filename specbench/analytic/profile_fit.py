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
from specbench.analytic.steps import check_step, overlap, pass_work, roofline_time, verify_step


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


def _nonnegative_least_squares(
    rows: Sequence[Sequence[float]], required: int, lower: Sequence[float] | None = None
) -> tuple[float, list[float]]:
    """min sum_i (rows_i . x - 1)^2 over x >= lower with x[required] > lower[required], by trying every support.

    ``lower`` (default 0) bounds each coefficient below: x = lower + y with
    y >= 0 turns it into a non-negative problem. Columns are scaled to unit
    norm first, so that bytes, FLOPs and counts (1e9 apart) solve alike. Few
    columns (<= 5) make the 2^n supports cheap, and the best feasible support
    is the exact optimum; a support whose columns are parallel is skipped (a
    smaller one fits as well). Returns the loss and x.
    """
    n = len(rows[0])
    lower = [0.0] * n if lower is None else list(lower)
    rhs = [1.0 - sum(r[j] * lower[j] for j in range(n)) for r in rows]
    norms = [math.sqrt(sum(r[j] ** 2 for r in rows)) or 1.0 for j in range(n)]
    scaled = [[r[j] / norms[j] for j in range(n)] for r in rows]
    gram = [[sum(r[i] * r[j] for r in scaled) for j in range(n)] for i in range(n)]
    moment = [sum(r[i] * y for r, y in zip(scaled, rhs)) for i in range(n)]
    best: tuple[float, list[float]] = (math.inf, [0.0] * n)
    for mask in range(1 << n):
        support = [j for j in range(n) if mask >> j & 1]
        if required not in support and lower[required] <= 0.0:
            continue
        y_support = _solve([[gram[i][j] for j in support] for i in support], [moment[i] for i in support])
        if y_support is None or (support and min(y_support) < 0.0):
            continue
        y = [0.0] * n
        for j, value in zip(support, y_support):
            y[j] = value
        loss = sum((sum(r[j] * y[j] for j in support) - t) ** 2 for r, t in zip(scaled, rhs))
        if loss < best[0]:
            best = (loss, y)
    return best[0], [lower[j] + y / norms[j] for j, y in enumerate(best[1])]


# The overlap exponents the fit tries (see steps.roofline_time): from no
# overlap (1) to a plain roofline's max() (inf). The H200 table's optimum
# (2.5) and the CPU's (1.25) lie inside; steps of 0.25 move its step times < 1%.
OVERLAP_EXPONENTS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, math.inf)


@dataclass(frozen=True)
class DeviceBounds:
    """What the device can do at most, the ceiling of every fitted rate.

    copy_bandwidth (bytes/s) bounds the weight and KV-cache bandwidth,
    matmul_flops (FLOP/s, dense, at the model's dtype) the matmul and
    attention rates; each is measured on the device (a large tensor copy,
    a large matmul: :func:`specbench.gpu_timing.device_rates`) or taken from a
    datasheet, as ``source`` says. A read-only stream runs a little faster
    than a copy (which also writes), so the bound on bandwidths is
    copy_bandwidth x (1 + slack); matmul_flops x (1 + slack) likewise.
    """

    copy_bandwidth: float
    matmul_flops: float
    source: str = "measured"
    slack: float = 0.05

    def __post_init__(self) -> None:
        check_real("copy_bandwidth", self.copy_bandwidth, 0.0, low_open=True)
        check_real("matmul_flops", self.matmul_flops, 0.0, low_open=True)
        check_real("slack", self.slack, 0.0)

    @property
    def max_bandwidth(self) -> float:
        """The largest bandwidth a fit may report, bytes/s."""
        return self.copy_bandwidth * (1.0 + self.slack)

    @property
    def max_flops(self) -> float:
        """The largest FLOP rate a fit may report, FLOP/s."""
        return self.matmul_flops * (1.0 + self.slack)


def fit_hardware_profile(
    samples: Sequence[StepSample],
    model: ModelProfile,
    *,
    name: str,
    bounds: DeviceBounds | None = None,
    shared_attention: bool = False,
    per_layer_fixed: bool = False,
) -> tuple[HardwareProfile, list[float]]:
    """Effective hardware profile under which step_time reproduces measured passes.

    Fits the rates of :class:`HardwareProfile` (memory bandwidth W, peak P,
    KV bandwidth W_kv, attention rate P_att, overheads c and s per sequence,
    overlap exponent p) in
    t_i = c + s * n_i + ((B_i / W)^p + (F_i / P)^p)^(1/p) + X_i / W + K_i / W_kv + A_i / P_att
    (B_i weight bytes, F_i linear FLOPs, X_i activation bytes, K_i KV bytes
    and A_i attention FLOPs that step_time charges sample i, n_i its
    sequences) by minimising sum_i (t_i / seconds_i - 1)^2. With v = 1 / P
    and rho = P / W (the ridge intensity, FLOP/byte) t_i is linear in
    (v, 1/W_kv, 1/P_att, c, s) for fixed rho and p: those come from a
    non-negative least-squares solve, and log(rho) is searched (a 121-point
    grid, then golden section) for each p of :data:`OVERLAP_EXPONENTS`. A
    rate whose cost the samples cannot see (its coefficient 0) comes back
    as inf, or at its bound when ``bounds`` are given.

    ``bounds`` (the device's measured copy bandwidth and matmul rate) cap
    every rate: W and W_kv at bounds.max_bandwidth, P and P_att at
    bounds.max_flops. Without them a fit trades weight reads for fixed cost
    freely (both are constant over the batch) and reports bandwidths no
    device has. :func:`fit_warnings` says when a rate sits at its bound.
    ``shared_attention`` prices attention FLOPs at P instead of fitting
    P_att: on a GPU they run on the same tensor cores, and a grid at one or
    two contexts cannot tell attention FLOPs from KV reads well enough to
    carry P_att to other contexts (fitted at 512 tokens alone, a free P_att
    of 61 TFLOP/s overprices the H200's 2048-token passes by 23%).
    ``per_layer_fixed`` fits the fixed cost per decoder layer
    (per_layer_overhead_s, c / num_layers) instead of per pass: the same fit
    for one model, but it carries to models of other depths and to one-layer
    draft heads (a GPU's kernel latency; see steps.roofline_time).

    The terms separate only if the samples vary them independently: plain
    decode steps alone move linear FLOPs and sequences together, and KV bytes
    and attention FLOPs together. Prefill steps (many tokens per sequence,
    logits at one) or verify passes (several tokens per sequence) break both
    ties; :mod:`specbench.calibrate` measures them.

    rho is searched only between the smallest and largest sample intensity
    F_i / B_i (widened by a factor 4 each way when p is finite, where the
    blend reaches past the ridge): beyond that the loss is flat. Ties go to
    the largest rho: when all samples are memory-bound, where P is only
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
    min_per_byte = 0.0 if bounds is None else 1.0 / bounds.max_bandwidth
    min_per_flop = 0.0 if bounds is None else 1.0 / bounds.max_flops

    def solve(log_rho: float, p: float) -> tuple[float, list[float]]:
        rho = math.exp(log_rho)
        shared = 1.0 if shared_attention else 0.0
        rows = [[(overlap(rho * w.weight_bytes, w.linear_flops, p) + rho * w.activation_bytes
                  + shared * w.attention_flops) / t,
                 w.kv_bytes / t, (1.0 - shared) * w.attention_flops / t,
                 (w.num_layers if per_layer_fixed else 1.0) / t, w.num_seqs / t]
                for w, t in zip(work, seconds)]
        # v = 1 / P is at least 1 / P_max, and 1 / W = v * rho at least 1 / W_max.
        lower = [max(min_per_flop, min_per_byte / rho), min_per_byte, (1.0 - shared) * min_per_flop, 0.0, 0.0]
        return _nonnegative_least_squares(rows, required=0, lower=lower)

    intensities = [math.log(w.linear_flops / w.weight_bytes) for w in work]
    best: tuple[float, float, float] | None = None  # loss, log_rho, p
    # Ties go to the larger exponent: the plain roofline unless the samples show otherwise.
    for p in reversed(OVERLAP_EXPONENTS):
        widen = 0.0 if math.isinf(p) else math.log(4.0)
        low, high = min(intensities) - widen, max(intensities) + widen
        grid = [low + (high - low) * j / 120 for j in range(121)]
        losses = [solve(x, p)[0] for x in grid]
        # Ties (samples that cannot tell weight reads from fixed cost, e.g. all memory-bound)
        # go to the largest ridge: the smallest peak that still explains every sample.
        j = max(j for j, loss in enumerate(losses) if loss <= min(losses) + 1e-12)
        refined = _golden_section(
            lambda x: solve(x, p)[0], grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)], tol=1e-9
        )
        log_rho = refined if solve(refined, p)[0] < losses[j] - 1e-12 else grid[j]
        loss = solve(log_rho, p)[0]
        if best is None or loss < best[0] - 1e-12:
            best = (loss, log_rho, p)
    assert best is not None
    _, log_rho, p = best
    loss, (v, per_kv_byte, per_attention_flop, c, per_seq) = solve(log_rho, p)
    if not math.isfinite(loss) or v <= 0.0:
        raise ValueError(
            "samples do not show step time growing with work; bandwidth and peak cannot be fitted"
        )
    profile = HardwareProfile(
        name=name,
        memory_bandwidth=1.0 / (v * math.exp(log_rho)),
        peak_flops=1.0 / v,
        fixed_overhead_s=0.0 if per_layer_fixed else c,
        per_layer_overhead_s=c if per_layer_fixed else 0.0,
        per_seq_overhead_s=per_seq,
        kv_bandwidth=1.0 / per_kv_byte if per_kv_byte > 0.0 else math.inf,
        attention_flops=None if shared_attention else (
            1.0 / per_attention_flop if per_attention_flop > 0.0 else math.inf),
        overlap_exponent=p,
        source="calibrated",
        notes=f"fitted to {len(samples)} step-time samples of {model.name}",
    )
    residuals = [roofline_time(profile, w) / t - 1.0 for w, t in zip(work, seconds)]
    return profile, residuals


# Residuals beyond this, or a rate at its bound, make a calibration say the profile is suspect.
RESIDUAL_WARNING = 0.10


def fit_warnings(
    profile: HardwareProfile, residuals: Sequence[float], bounds: DeviceBounds | None,
    labels: Sequence[str] | None = None,
) -> list[str]:
    """What makes a fitted profile suspect, one sentence each (empty: nothing).

    ``labels`` name the samples (e.g. "B=64 q=3 C=512") in the residual
    warning; default: their index.

    A rate at its bound (within 0.1%) means the samples wanted a faster device
    than this one: another term (often the fixed cost) is mispriced, and the
    rate is a ceiling, not a measurement. A residual beyond
    :data:`RESIDUAL_WARNING` means the step model does not describe a sample.
    """
    out = []
    if bounds is not None:
        rates = (("weight bandwidth", profile.memory_bandwidth, bounds.max_bandwidth, 1e9, "GB/s"),
                 ("KV bandwidth", profile.kv_read_bandwidth, bounds.max_bandwidth, 1e9, "GB/s"),
                 ("matmul rate", profile.peak_flops, bounds.max_flops, 1e12, "TFLOP/s"),
                 ("attention rate", profile.attention_peak_flops, bounds.max_flops, 1e12, "TFLOP/s"))
        for label, value, bound, unit, unit_name in rates:
            if value >= bound * (1.0 - 1e-3):
                out.append(f"{label} {value / unit:.4g} {unit_name} sits at its bound ({bounds.source} "
                           f"{bound / unit:.4g} {unit_name}): a ceiling, not a measurement")
    worst = max(range(len(residuals)), key=lambda i: abs(residuals[i]), default=None)
    if worst is not None and abs(residuals[worst]) > RESIDUAL_WARNING:
        count = sum(abs(r) > RESIDUAL_WARNING for r in residuals)
        out.append(f"{count} of {len(residuals)} samples off by more than {RESIDUAL_WARNING:.0%} "
                   f"(worst: {labels[worst] if labels else f'sample {worst}'}, {residuals[worst]:+.1%})")
    return out


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
    signed: bool = False,
) -> tuple[float, list[float]]:
    """Per-draft-pass fixed cost under which step time and draft time reproduce measured passes.

    A speculative pass costs verify_step + k draft passes, each the head's
    roofline work plus a fixed cost d (:func:`draft_time`). With the target's
    profile ``hw`` already fitted, each sample gives
    d_i = (seconds_i - verify_i - k * work_i) / k; d is their median, floored
    at 0 (a fit of the target that overprices verification can push one
    below). Returns d in seconds and each sample's relative residual
    predicted / measured - 1 under it.

    ``signed``: d is the head's own correction to its roofline, and may be
    below 0: where the head's measured passes cost less than the roofline
    prices its work (on a CPU, an EAGLE-1 head that reads the target's whole
    LM head each pass measured about 4 ms a pass below its priced work at
    batch 1 and at batch 4 alike: a constant that a floor at 0 threw away,
    pricing every pass that much too high). It stops at the smallest
    sample's priced draft pass, so that no draft pass is priced below
    nothing.
    """
    if not samples:
        raise ValueError("samples must not be empty")
    priced = _priced_draft_samples(samples, method=method, target=target, head=head, hw=hw)
    lowest = -min(work for _, _, _, work in priced) if signed else 0.0
    overhead = max(statistics.median((seconds - verify) / k - work for k, seconds, verify, work in priced), lowest)
    residuals = [(verify + k * (work + overhead)) / seconds - 1.0 for k, seconds, verify, work in priced]
    return overhead, residuals


def fit_draft_costs(
    samples: Sequence[DraftSample],
    *,
    method: str,
    target: ModelProfile,
    head: ModelProfile | None,
    hw: HardwareProfile,
) -> tuple[float, float, list[float]]:
    """A head's draft cost per pass and per speculative step, from passes timed at two K or more.

    A speculative pass at K costs verify_step + s + K * (work + d): s once
    per step whatever K (the proposer's set-up, the hidden states'
    hand-over, the first pass over the accepted positions), d per draft pass
    beside the head's roofline work (:func:`fit_draft_overhead`, signed).
    With the target's profile ``hw`` fitted, each sample leaves
    r_i = seconds_i - verify_i - K_i * work_i = s + K_i * d, a line in K:
    ordinary least squares over the samples gives d (its slope) and s (its
    intercept). At one K they cannot be told apart, and ValueError says so
    (:func:`fit_draft_overhead` fits d alone there). Both are signed; d stops
    at the smallest sample's priced draft pass, as in
    :func:`fit_draft_overhead`, s then refitted at that d. Returns d and s in
    seconds and each sample's relative residual predicted / measured - 1.
    """
    if len(samples) < 2:
        raise ValueError(f"samples must hold at least 2 passes (a cost per pass and one per step), got {len(samples)}")
    priced = _priced_draft_samples(samples, method=method, target=target, head=head, hw=hw)
    ks = sorted({k for k, _, _, _ in priced})
    if len(ks) < 2:
        raise ValueError(f"samples must be timed at two K or more to separate a cost per step from one per pass; "
                         f"all are at K={ks[0]}")
    left = [(k, seconds - verify - k * work) for k, seconds, verify, work in priced]
    mean_k = statistics.fmean(k for k, _ in left)
    mean_r = statistics.fmean(r for _, r in left)
    per_pass = (sum((k - mean_k) * (r - mean_r) for k, r in left) / sum((k - mean_k) ** 2 for k, _ in left))
    lowest = -min(work for _, _, _, work in priced)
    if per_pass < lowest:
        per_pass = lowest
    per_step = statistics.fmean(r - k * per_pass for k, r in left)
    residuals = [(verify + per_step + k * (work + per_pass)) / seconds - 1.0 for k, seconds, verify, work in priced]
    return per_pass, per_step, residuals


def _priced_draft_samples(
    samples: Sequence[DraftSample], *, method: str, target: ModelProfile, head: ModelProfile | None,
    hw: HardwareProfile,
) -> list[tuple[int, float, float, float]]:
    """Per timed speculative pass of an EAGLE head: K, the measured seconds, the target's verification, and
    one draft pass priced without any draft overhead (what :func:`fit_draft_overhead` and
    :func:`fit_draft_costs` fit the overheads to)."""
    cost_model(method)  # an unknown method is refused before the EAGLE-only check below
    if method not in EAGLE_FC_INPUTS:
        raise ValueError(f"method must be an EAGLE head ({', '.join(EAGLE_FC_INPUTS)}); got {method!r}")
    free = replace(hw, draft_overhead_s=0.0, head_overheads=(), head_step_overheads=())
    priced = []
    for i, s in enumerate(samples):
        k = check_int(f"samples[{i}].k", s.k, 1)
        seconds = check_real(f"samples[{i}].seconds", s.seconds, 0.0, low_open=True)
        work = draft_time(method, hw=free, batch_size=s.batch_size, k=k, context_len=s.context_len,
                          draft=head, target=target) / k
        priced.append((k, seconds, verify_step(target, hw, s.batch_size, k, s.context_len), work))
    return priced


def fit_draft_step_overhead(
    samples: Sequence[StepSample],
    *,
    method: str,
    target: ModelProfile,
    head: ModelProfile | None,
    hw: HardwareProfile,
) -> tuple[float, list[float]]:
    """Per-draft-pass fixed cost from draft steps timed on their own (one head pass each).

    Each sample is one head pass over num_seqs sequences (one token each) at
    context_len; with the target's profile ``hw`` fitted, d_i = seconds_i -
    the head's priced work, and d is their median, floored at 0. Returns d
    in seconds and each sample's relative residual under it.
    """
    cost_model(method)
    if method not in EAGLE_FC_INPUTS:
        raise ValueError(f"method must be an EAGLE head ({', '.join(EAGLE_FC_INPUTS)}); got {method!r}")
    if not samples:
        raise ValueError("samples must not be empty")
    free = replace(hw, draft_overhead_s=0.0, head_overheads=(), head_step_overheads=())
    priced = [(check_real(f"samples[{i}].seconds", s.seconds, 0.0, low_open=True),
               draft_time(method, hw=free, batch_size=check_int(f"samples[{i}].num_seqs", s.num_seqs, 1), k=1,
                          context_len=s.context_len, draft=head, target=target))
              for i, s in enumerate(samples)]
    overhead = max(statistics.median(seconds - base for seconds, base in priced), 0.0)
    return overhead, [(base + overhead) / seconds - 1.0 for seconds, base in priced]


@dataclass(frozen=True)
class LookupSample:
    """Decode steps timed on a prompt-lookup (ngram) engine: seconds per decode pass, and the draft
    tokens each pass verified on average (a lookup that finds no match drafts none)."""

    batch_size: int
    k: int
    context_len: float
    seconds: float
    drafted: float


def fit_lookup_overhead(
    samples: Sequence[LookupSample], *, target: ModelProfile, hw: HardwareProfile
) -> tuple[float, list[float]]:
    """The host work of one prompt-lookup step: what timed ngram passes cost beyond their verification.

    With the target's profile ``hw`` fitted, each sample gives
    h_i = seconds_i - verify_step(batch, K, context, drafted_i) (the target
    verifies what the lookup drafted); h is their median, floored at 0.
    Returns h in seconds and each sample's relative residual under it.
    """
    if not samples:
        raise ValueError("samples must not be empty")
    priced = []
    for i, s in enumerate(samples):
        seconds = check_real(f"samples[{i}].seconds", s.seconds, 0.0, low_open=True)
        priced.append((seconds, verify_step(target, hw, s.batch_size, s.k, s.context_len, s.drafted)))
    overhead = max(statistics.median(seconds - verify for seconds, verify in priced), 0.0)
    return overhead, [(verify + overhead) / seconds - 1.0 for seconds, verify in priced]
