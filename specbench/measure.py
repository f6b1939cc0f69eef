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

from specbench.sampling import GREEDY, Sampling, distribution_seed, request_seed


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


def _add(left: Sequence[int], right: Sequence[int]) -> tuple[int, ...]:
    """Element-wise sum, the shorter padded with zeros."""
    width = max(len(left), len(right))
    return tuple((left[i] if i < len(left) else 0) + (right[i] if i < len(right) else 0) for i in range(width))


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
    # The engine's monotonic clock when the request was first scheduled and
    # when its last token came (None: not reported): which requests ran at once.
    scheduled_ts: float | None = None
    finished_ts: float | None = None
    # Drafted tokens the request's last verify pass accepted (None: not reported).
    last_accepted: int | None = None
    # Tokens vLLM's stop check cut from the request's last pass (None: not observed).
    cut_tokens: int | None = None

    @property
    def truncated_accepted(self) -> int:
        """Accepted draft tokens vLLM counted that never reached the output.

        vLLM's scheduler counts a verify pass's accepted drafts before the
        output is cut at ``max_tokens`` or a stop token, and it schedules whole
        drafts up to the end. Only the last pass can be cut, and each token it
        loses is one accepted draft fewer in what the user received (the pass
        keeps its own token). The engine observes the cut (``cut_tokens``).
        Without it: every pass emits at least one token, so passes + accepted
        = decoded tokens + the cut, and with a pass per draft that gives the
        cut as drafts + accepted - decoded, at most what the last pass
        accepted; passes without a draft (prompt lookup that found no match)
        hide part of the cut, so that is a lower bound, never an overcorrection.
        """
        if not self.drafts or not self.accepted_tokens:
            return 0
        if self.cut_tokens is not None:
            return min(self.cut_tokens, self.accepted_tokens)
        decoded = max(len(self.token_ids) - 1, 0)
        last = self.last_accepted if self.last_accepted is not None else self.accepted_tokens
        return max(0, min(self.drafts + self.accepted_tokens - decoded, last))

    @property
    def emitted_accepted(self) -> int | None:
        """Accepted draft tokens that reached the output (None without speculation)."""
        return None if self.accepted_tokens is None else self.accepted_tokens - self.truncated_accepted

    @property
    def acceptance_length(self) -> float | None:
        """1 + accepted / drafts for this request, counting accepted tokens that reached the output;
        None if none of its passes drafted."""
        if not self.drafts or self.emitted_accepted is None:
            return None
        return 1.0 + self.emitted_accepted / self.drafts

    @property
    def decode_passes(self) -> int:
        """Target passes after the prefill that emitted the first token.

        Each emits one token plus the accepted ones that reached the output
        (:attr:`truncated_accepted`), and there is at least one pass per draft.
        """
        decoded = max(len(self.token_ids) - 1, 0)
        return max(decoded - (self.emitted_accepted or 0), self.drafts or 0, 0 if not decoded else 1)

    def truncated_per_position(self) -> tuple[int, ...]:
        """Per draft position, the accepted tokens :attr:`truncated_accepted` removes.

        The cut takes the end of the last verify pass: its bonus token first,
        then its accepted drafts from the highest position down.
        """
        cut = self.truncated_accepted
        if not cut or self.last_accepted is None:
            return ()
        return tuple(1 if self.last_accepted - cut <= i < self.last_accepted else 0 for i in range(self.last_accepted))


@dataclass(frozen=True)
class TopTokens:
    """One request decoded plainly, with the tokens that nearly tied with its choice at every position.

    ``margins[i]`` is the top-1 minus top-2 log-probability where output
    token ``i`` was chosen; ``near_ties[i]`` the tokens whose log-probability
    there came within the plan's tie tolerance of the top one, the top one
    included. Two continuations that part there between two of them met a
    numerical tie, not a choice of the target's. (Even the same batch shape
    can part there: asking vLLM for log-probabilities computes them in
    float32, where greedy decoding takes the argmax of 16-bit logits.)
    """

    token_ids: tuple[int, ...]
    margins: tuple[float, ...]
    near_ties: tuple[tuple[int, ...], ...]


class Generator(Protocol):
    """What the measurement needs from an engine."""

    def generate(
        self, prompts: Sequence[Sequence[int]], max_tokens: int, sampling: Sampling = GREEDY,
        seeds: Sequence[int] | None = None,
    ) -> list[GeneratedRequest]:
        """Generate up to ``max_tokens`` for each prompt, as one batch: greedily, or sampled with
        ``sampling`` and one seed per prompt (``seeds``, required when sampling)."""
        ...

    def spec_counters(self) -> SpecCounters:
        """The engine's cumulative speculative-decoding counters now."""
        ...

    def reference_pass(self, batches: Sequence[Sequence[Sequence[int]]], max_tokens: int) -> None:
        """Decode ``batches`` plainly, untimed, for a proposer that drafts from the outputs.

        Called only for plans with ``reference_pass`` set (method controlled).
        """
        ...

    def top_tokens(self, prompts: Sequence[Sequence[int]], max_tokens: int, tolerance: float) -> list[TopTokens]:
        """Greedy-generate one batch as :meth:`generate` does, with each position's near ties
        (tokens within ``tolerance`` nats of the top one).

        Called only for plans with a ``tie_tolerance``, after the timed region.
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
    # After the timed repetitions, an untimed pass that records each position's
    # top-two margin and near ties within this many nats (baselines in a dtype
    # whose ties can flip: see TopTokens); None: no such pass.
    tie_tolerance: float | None = None
    # Temperature, top_p, top_k; request i of every repetition draws with
    # sampling.request_seed(seed, i). Greedy ignores the seed.
    sampling: Sampling = GREEDY
    seed: int = 0
    # After the timed repetitions (sampled cells), an untimed pass drawing seeded
    # samples of the first tokens for the distribution check; None: no such pass.
    distribution: DistributionPlan | None = None

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

    def batch_seeds(self) -> list[list[int] | None]:
        """Each batch's request seeds (:func:`specbench.sampling.request_seed`); None per batch when greedy."""
        if self.sampling.greedy:
            return [None] * (len(self.prompts) // self.batch_size)
        b = self.batch_size
        return [[request_seed(self.seed, i + j) for j in range(b)] for i in range(0, len(self.prompts), b)]


@dataclass(frozen=True)
class DistributionPlan:
    """The untimed draws of the distribution check: ``samples`` seeded samples of the first
    ``tokens`` tokens for each of the cell's first ``prompts`` prompts, each cut to its last
    ``prompt_tokens`` tokens, seeds from ``stream`` (:func:`specbench.sampling.distribution_seed`:
    each cell and engine run has its own)."""

    prompts: int
    samples: int
    tokens: int
    stream: str
    prompt_tokens: int
    # Most prompt tokens one generate call may carry: the engine's step budget
    # (max_num_batched_tokens). A longer call prefills in chunks, and vLLM 0.32's
    # CPU build fails a seeded request whose prefill is chunked ("CPU Generator
    # does not use offset"), so the draws go in calls that fit one step.
    step_tokens: int = 4096

    def seeds(self, seed: int, prompt: int) -> list[int]:
        """The seeds of one prompt's samples."""
        return [distribution_seed(seed, self.stream, prompt * self.samples + j) for j in range(self.samples)]


@dataclass(frozen=True)
class DistributionSamples:
    """What the distribution pass drew: per prompt, its samples' token ids, and its cost."""

    samples: list[list[list[int]]]
    seconds: float
    drafts: int
    accepted_tokens: int


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
    # Accepted draft tokens vLLM counted past the end of an output, over the
    # timed requests, in all and per draft position (GeneratedRequest.truncated_accepted).
    truncated_accepted: int = 0
    truncated_per_pos: tuple[int, ...] = ()
    # Most requests the engine ran at once (None: no timestamps); below the
    # batch size when the KV cache made it run a batch in waves.
    reached_concurrency: int | None = None
    # Per request of the first timed repetition (plans with a tie_tolerance), up to
    # and including the first position where the untimed pass left the timed tokens.
    top2_margins: list[list[float]] = field(default_factory=list)
    near_tie_tokens: list[list[list[int]]] = field(default_factory=list)
    # Sampled cells: the untimed draws of the distribution check (None: no such pass).
    distribution: DistributionSamples | None = None


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
    With ``plan.reference_pass``, ``engine.reference_pass`` runs first, untimed;
    with ``plan.tie_tolerance``, :func:`top_tokens_pass` runs last, untimed.
    """
    if plan.reference_pass:
        engine.reference_pass(plan.batches(), plan.max_tokens)
    warmup_s = None
    if plan.warmup:
        start = time.perf_counter()
        engine.generate(plan.batches()[0], min(plan.max_tokens, WARMUP_MAX_TOKENS), plan.sampling,
                        plan.batch_seeds()[0])
        warmup_s = time.perf_counter() - start

    before = engine.spec_counters()
    rep_wall_s: list[float] = []
    rep_tokens: list[int] = []
    first_ids: list[tuple[int, ...]] | None = None
    request_acceptance: list[float | None] = []
    request_decode_passes: list[int] = []
    stable = True
    concurrency: int | None = None
    truncated, truncated_per_pos = 0, ()
    ttft, tpot, e2e = [], [], []
    decode_s, decode_tokens = 0.0, 0
    for _ in range(plan.repetitions):
        elapsed = 0.0
        finished: list[GeneratedRequest] = []
        for batch, seeds in zip(plan.batches(), plan.batch_seeds()):
            start = time.perf_counter()
            requests = engine.generate(batch, plan.max_tokens, plan.sampling.timed(plan.max_tokens), seeds)
            elapsed += time.perf_counter() - start
            finished.extend(requests)
            if (ran := most_at_once(requests)) is not None:
                concurrency = max(concurrency or 0, ran)
            if on_batch is not None:
                on_batch()
        rep_wall_s.append(elapsed)
        rep_tokens.append(sum(len(r.token_ids) for r in finished))
        for r in finished:
            truncated += r.truncated_accepted
            truncated_per_pos = _add(truncated_per_pos, r.truncated_per_position())
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
    margins, near_ties = top_tokens_pass(engine, plan, first_ids or []) if plan.tie_tolerance is not None else ([], [])
    drawn = distribution_pass(engine, plan) if plan.distribution is not None else None

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
        reached_concurrency=concurrency,
        truncated_accepted=truncated,
        truncated_per_pos=truncated_per_pos,
        top2_margins=margins,
        near_tie_tokens=near_ties,
        distribution=drawn,
    )


def top_tokens_pass(
    engine: Generator, plan: CellPlan, timed_ids: Sequence[tuple[int, ...]]
) -> tuple[list[list[float]], list[list[list[int]]]]:
    """Each request's top-two margins and near ties, from an untimed pass over the plan's batches.

    The pass submits the batches exactly as the timed region did, so it meets
    the same kernels and, as a rule, decodes the same tokens. Where it leaves
    the timed tokens anyway, what follows describes another continuation:
    each request's lists stop at (and include) its first such position.
    """
    assert plan.tie_tolerance is not None
    margins: list[list[float]] = []
    near_ties: list[list[list[int]]] = []
    results = [r for batch in plan.batches() for r in engine.top_tokens(batch, plan.max_tokens, plan.tie_tolerance)]
    for result, timed in zip(results, timed_ids):
        agree = next((i for i, (a, b) in enumerate(zip(result.token_ids, timed)) if a != b), len(result.token_ids))
        keep = min(agree + 1, len(result.margins))
        margins.append(list(result.margins[:keep]))
        near_ties.append([list(tokens) for tokens in result.near_ties[:keep]])
    return margins, near_ties


def distribution_pass(engine: Generator, plan: CellPlan) -> DistributionSamples:
    """Draw the distribution check's samples, untimed, after the timed region.

    Each of the plan's first ``prompts`` prompts is submitted ``samples``
    times, all in one batch, each copy with its own seed, for ``tokens``
    tokens. Batch composition does not change what a seeded request draws
    from, only how fast; the speculative counters around the pass say
    whether drafts were verified in it at all (a check without drafts tests
    nothing of the proposer).
    """
    check = plan.distribution
    assert check is not None and not plan.sampling.greedy
    # Any fixed prompt tests the sampler; the cut keeps the check's prefill (samples x
    # prompts, no prefix cache) from costing more than the cell it checks.
    chosen = [p[-check.prompt_tokens:] for p in plan.prompts[: check.prompts]]
    prompts = [p for p in chosen for _ in range(check.samples)]
    seeds = [s for i in range(len(chosen)) for s in check.seeds(plan.seed, i)]
    before = engine.spec_counters()
    per_call = max(1, check.step_tokens // max(1, max(len(p) for p in chosen)))
    start = time.perf_counter()
    drawn = []
    # Calls of whole requests: a seeded request draws the same tokens whatever shares its batch.
    for i in range(0, len(prompts), per_call):
        drawn += engine.generate(prompts[i : i + per_call], check.tokens, plan.sampling, seeds[i : i + per_call])
    seconds = time.perf_counter() - start
    counted = engine.spec_counters() - before
    ids = [list(r.token_ids) for r in drawn]
    per_prompt = [ids[i * check.samples : (i + 1) * check.samples] for i in range(len(chosen))]
    return DistributionSamples(per_prompt, seconds, counted.drafts, counted.accepted_tokens)


def most_at_once(requests: Sequence[GeneratedRequest]) -> int | None:
    """The most requests of one batch the engine had running at the same moment (None: no timestamps).

    A request runs from its first scheduling to its last token; a batch whose
    requests do not all fit the KV cache runs in waves, and this falls below its size.
    """
    spans = [(r.scheduled_ts, r.finished_ts) for r in requests]
    if not spans or any(start is None or end is None for start, end in spans):
        return None
    # Sweep over start (+1) and end (-1) events; at equal times an end comes
    # first, so back-to-back waves do not count as overlapping.
    events = sorted([(end, -1) for _, end in spans] + [(start, 1) for start, _ in spans])  # type: ignore[misc]
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def _is_number(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
