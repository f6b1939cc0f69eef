"""Measure one cell: warm-up, timed repetitions, metric deltas, per-request latency.

A cell is one point of the grid (model, method, K, batch size, workload). This
module holds the measurement protocol and nothing engine-specific: it drives
any object with the :class:`Generator` shape, which the engine layer provides
around vLLM, inside the engine's own process so that no inter-process hop sits
inside the timed region.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's cumulative speculative-decoding counters at one instant."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    # Drafts that reached each position: below ``drafts`` where drafts can be
    # shorter than K (ngram). Empty when the engine does not report it.
    drafted_per_pos: tuple[int, ...] = ()

    def __sub__(self, earlier: SpecCounters) -> SpecCounters:
        """The counts between two readings (per-position lists padded with zeros to equal width)."""
        return SpecCounters(
            drafts=self.drafts - earlier.drafts,
            draft_tokens=self.draft_tokens - earlier.draft_tokens,
            accepted_tokens=self.accepted_tokens - earlier.accepted_tokens,
            accepted_per_pos=_difference(self.accepted_per_pos, earlier.accepted_per_pos),
            drafted_per_pos=_difference(self.drafted_per_pos, earlier.drafted_per_pos),
        )


def _difference(now: Sequence[int], then: Sequence[int]) -> tuple[int, ...]:
    width = max(len(now), len(then))
    padded_now = list(now) + [0] * (width - len(now))
    padded_then = list(then) + [0] * (width - len(then))
    return tuple(a - b for a, b in zip(padded_now, padded_then))


@dataclass(frozen=True)
class GeneratedRequest:
    """One finished request: its output token ids, the engine's timestamps and
    its own speculative counts (passes that carried a draft, tokens accepted).

    Latencies are None when the engine reported no request metrics; the
    counts are None without speculation.
    """

    token_ids: tuple[int, ...]
    ttft_s: float | None
    e2e_s: float | None
    tpot_s: float | None
    drafts: int | None = None
    accepted_tokens: int | None = None

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted / drafts for this request; None if none of its passes drafted."""
        if not self.drafts or self.accepted_tokens is None:
            return None
        return 1.0 + self.accepted_tokens / self.drafts

    @property
    def decode_passes(self) -> int:
        """Target passes after the prefill that emitted the first token.

        Each emits one token plus those it accepted. vLLM may count drafts
        accepted past ``max_tokens`` before the output is cut, so the count
        is kept at least one pass per draft.
        """
        decoded = max(len(self.token_ids) - 1, 0)
        return max(decoded - (self.accepted_tokens or 0), self.drafts or 0, 0 if not decoded else 1)


class Generator(Protocol):
    """What the measurement needs from an engine."""

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[GeneratedRequest]:
        """Greedy-generate up to ``max_tokens`` for each prompt, as one batch."""
        ...

    def spec_counters(self) -> SpecCounters:
        """The engine's cumulative speculative-decoding counters now."""
        ...

    def reference_pass(self, batches: Sequence[Sequence[Sequence[int]]], max_tokens: int) -> None:
        """Decode ``batches`` plainly, untimed, for a proposer that drafts from the outputs.

        Called only for plans with ``reference_pass`` set (method controlled).
        """
        ...


@dataclass(frozen=True)
class CellPlan:
    """What to run: the requests of one cell and how to time them.

    ``prompts`` holds one token-id sequence per request; they are submitted in
    consecutive groups of ``batch_size`` (one ``generate`` call per group), so
    ``len(prompts)`` must be a multiple of ``batch_size``.
    """

    prompts: tuple[tuple[int, ...], ...]
    batch_size: int
    max_tokens: int
    repetitions: int
    warmup: bool = True
    # Before the warm-up, an untimed plain pass whose outputs the proposer
    # drafts from (controlled acceptance, specbench.controlled).
    reference_pass: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1 or len(self.prompts) % self.batch_size:
            raise ValueError(
                f"{len(self.prompts)} prompts do not split into full batches of {self.batch_size}"
            )
        if self.repetitions < 1:
            raise ValueError(f"repetitions must be >= 1, got {self.repetitions}")

    @property
    def timed_batches(self) -> int:
        """How many generate() calls the timed region makes."""
        return self.repetitions * len(self.prompts) // self.batch_size

    @property
    def fingerprint(self) -> str:
        """sha256 of the exact requests: every prompt's token ids in submission order, and max_tokens.

        Two cells with equal fingerprints submitted the same work, whatever
        their prompt files, tokenizer or chat template looked like; the
        batching and timing settings are not part of it (they are in the
        cell's config hash).
        """
        canonical = json.dumps({"max_tokens": self.max_tokens, "prompts": self.prompts}, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def batches(self) -> list[tuple[tuple[int, ...], ...]]:
        """The request groups, in submission order."""
        b = self.batch_size
        return [self.prompts[i : i + b] for i in range(0, len(self.prompts), b)]


# A warm-up decodes this many tokens: past the first decode and draft steps,
# every step repeats work already done once; the demo's 32-token warm-ups
# cost 3 of its 18 minutes.
WARMUP_MAX_TOKENS = 8


@dataclass
class Measurement:
    """What one cell measured over its timed repetitions."""

    rep_wall_s: list[float]
    rep_output_tokens: list[int]
    prompt_tokens: int
    token_ids: list[tuple[int, ...]]
    outputs_stable: bool
    counters: SpecCounters
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    # Per request of the first timed repetition, in submission order (None:
    # no draft or no per-request counts).
    request_acceptance: list[float | None] = field(default_factory=list)
    request_decode_passes: list[int] = field(default_factory=list)
    # Summed over the timed requests that reported a TPOT: decode seconds
    # (first to last token) and the tokens decoded in them (all but the first).
    decode_s: float = 0.0
    decode_tokens: int = 0
    warmup_s: float | None = None


def measure(
    engine: Generator, plan: CellPlan, on_batch: Callable[[], None] | None = None
) -> Measurement:
    """Run ``plan`` on ``engine``: an untimed warm-up, then timed repetitions.

    The warm-up submits the first batch (same prompts and batch size as the
    timed ones) for at most :data:`WARMUP_MAX_TOKENS` tokens, so lazy
    initialisation and first-call compilation (the prefill of that shape, the
    first decode and draft steps) stay out of the timings without paying for
    a whole untimed batch.
    Each repetition submits every batch in order; its wall time is the sum of
    the ``generate`` calls. Speculative counters are differenced around the
    timed region only. Token ids come from the first timed repetition;
    ``outputs_stable`` says whether every repetition produced the same ones.
    ``on_batch`` is called after every timed batch (progress display).
    With ``plan.reference_pass``, ``engine.reference_pass`` runs first, untimed.
    """
    if plan.reference_pass:
        engine.reference_pass(plan.batches(), plan.max_tokens)
    warmup_s = None
    if plan.warmup:
        start = time.perf_counter()
        engine.generate(plan.batches()[0], min(plan.max_tokens, WARMUP_MAX_TOKENS))
        warmup_s = time.perf_counter() - start

    before = engine.spec_counters()
    rep_wall_s: list[float] = []
    rep_tokens: list[int] = []
    first_ids: list[tuple[int, ...]] | None = None
    request_acceptance: list[float | None] = []
    request_decode_passes: list[int] = []
    stable = True
    ttft, tpot, e2e = [], [], []
    decode_s, decode_tokens = 0.0, 0
    for _ in range(plan.repetitions):
        elapsed = 0.0
        finished: list[GeneratedRequest] = []
        for batch in plan.batches():
            start = time.perf_counter()
            finished.extend(engine.generate(batch, plan.max_tokens))
            elapsed += time.perf_counter() - start
            if on_batch is not None:
                on_batch()
        rep_wall_s.append(elapsed)
        rep_tokens.append(sum(len(r.token_ids) for r in finished))
        ids = [r.token_ids for r in finished]
        if first_ids is None:
            first_ids = ids
            request_acceptance = [r.acceptance_length for r in finished]
            request_decode_passes = [r.decode_passes for r in finished]
        elif ids != first_ids:
            stable = False
        ttft += [r.ttft_s for r in finished if _is_number(r.ttft_s)]
        tpot += [r.tpot_s for r in finished if _is_number(r.tpot_s)]
        e2e += [r.e2e_s for r in finished if _is_number(r.e2e_s)]
        for r in finished:
            if _is_number(r.tpot_s):
                decode_s += r.tpot_s * (len(r.token_ids) - 1)
                decode_tokens += len(r.token_ids) - 1
    counters = engine.spec_counters() - before

    return Measurement(
        rep_wall_s=rep_wall_s,
        rep_output_tokens=rep_tokens,
        prompt_tokens=sum(len(p) for p in plan.prompts),
        token_ids=first_ids or [],
        outputs_stable=stable,
        counters=counters,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        request_acceptance=request_acceptance,
        request_decode_passes=request_decode_passes,
        decode_s=decode_s,
        decode_tokens=decode_tokens,
        warmup_s=warmup_s,
    )


def _is_number(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
