"""One cell's measured columns, from its raw repetitions and vLLM's counters."""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Sequence

from specbench.stats import acceptance, timings

# An output counts as repetitive when at least this share of its 4-grams
# already occurred earlier in it (acceptance.repeated_ngram_share).
REPETITIVE_SHARE = 0.5

def measured_fields(
    *,
    rep_wall_s: Sequence[float],
    rep_output_tokens: Sequence[int],
    num_requests: int,
    drafts: int,
    draft_tokens: int,
    accepted_tokens: int,
    accepted_per_pos: Sequence[int],
    ttft_s: Sequence[float],
    tpot_s: Sequence[float],
    e2e_s: Sequence[float],
    request_acceptance: Sequence[float | None] = (),
    request_decode_passes: Sequence[int] = (),
    token_ids: Sequence[Sequence[int]] = (),
    decode_s: float = 0.0,
    decode_tokens: int = 0,
    drafted_per_pos: Sequence[int] = (),
) -> dict[str, Any]:
    """The measured columns of a cell row, from raw repetitions and counter deltas.

    Acceptance length is ``1 + accepted / drafts`` over the steps that carried
    a draft (vLLM's definition). ``tokens_per_pass`` divides all output tokens
    by all target passes, each request's prefill pass (one token, no draft)
    and passes without a draft included: it is what the wall time pays for,
    and it falls below E(alpha, K), which assumes a full K-token draft on
    every pass, whenever passes carry no draft or a shorter one. Rate i is
    the share of the drafts that reached position i whose position i was
    accepted (accepted there implies accepted before it), so under a
    constant per-token acceptance it is alpha^(i+1) whatever the drafts'
    lengths. ngram drafts can stop short of K: over all drafts
    (``drafted_per_pos`` unknown, as from engines that do not report it) the
    rates and the fitted alpha would be biased low.

    Each target pass emits one token of its own plus those it accepted, so
    passes = output - accepted; but vLLM counts the drafts a request's last
    pass accepted beyond ``max_tokens`` (or its stop token) before the output
    is cut, which makes that difference too small by up to K per request.
    Each request also has one pass without a draft (the prefill that emits
    its first token) plus one per draft, so passes >= requests + drafts: the
    larger of the two bounds is kept. It is exact when every decode pass
    carries a draft (draft_model, EAGLE, controlled).

    The pooled acceptance length weights each request by its drafts, so a
    request that loops (and drafts on every pass) can dominate it; the
    median of the per-request acceptance lengths (``request_acceptance``)
    and the count of repetitive outputs (from ``token_ids``) show when.
    """
    wall = timings.summarize(rep_wall_s)
    rates = position_rates(accepted_per_pos, drafted_per_pos, drafts)
    total_out = sum(rep_output_tokens)
    target_passes = max(total_out - accepted_tokens, num_requests * len(rep_output_tokens) + drafts)
    tps = [t / w for t, w in zip(rep_output_tokens, rep_wall_s)]
    tps_summary = timings.summarize(tps)
    row: dict[str, Any] = {
        "output_tokens": rep_output_tokens[0],
        "wall_time_s": wall.median,
        "wall_time_s_ci_low": wall.ci_low,
        "wall_time_s_ci_high": wall.ci_high,
        "wall_time_s_cv": wall.cv,
        "wall_time_s_reps": list(rep_wall_s),
        "tokens_per_s": tps_summary.median,
        "tokens_per_s_ci_low": tps_summary.ci_low,
        "tokens_per_s_ci_high": tps_summary.ci_high,
        "reps_ci_coverage": wall.coverage,
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted_tokens,
        "acceptance_length": 1.0 + accepted_tokens / drafts if drafts else 1.0,
        "acceptance_rate_per_pos": rates,
        "drafted_per_pos": list(drafted_per_pos),
        "draft_acceptance_rate": accepted_tokens / draft_tokens if draft_tokens else None,
        "alpha": acceptance.fit_alpha(rates) if rates else None,
        "target_passes": target_passes,
        "tokens_per_pass": total_out / target_passes if target_passes > 0 else None,
        "draft_coverage": drafts / target_passes if target_passes > 0 else None,
        "acceptance_length_per_request": list(request_acceptance),
        "output_tokens_per_request": [len(ids) for ids in token_ids],
        "decode_passes_per_request": list(request_decode_passes),
        "acceptance_length_p50": median_known(request_acceptance),
        "repetitive_requests": sum(
            acceptance.repeated_ngram_share(ids) >= REPETITIVE_SHARE for ids in token_ids
        ),
    }
    row |= timings.latency_percentiles(ttft_s, "ttft_s")
    row |= timings.latency_percentiles(tpot_s, "tpot_s")
    row["tpot_s_mean"] = decode_s / decode_tokens if decode_tokens else None
    row |= timings.latency_percentiles(e2e_s, "e2e_s")
    if not ttft_s:
        row["latency_note"] = "the engine reported no per-request metrics"
    return row


def position_rates(accepted: Sequence[int], drafted: Sequence[int], drafts: int) -> list[float]:
    """Acceptance per draft position: accepted there over the drafts that reached it (else over all drafts)."""
    if not drafts:
        return []
    if not drafted:
        return [a / drafts for a in accepted]
    # A position no draft reached has no rate; it ends the list (later ones are unreached too).
    padded = list(drafted) + [0] * (len(accepted) - len(drafted))
    return [a / d for a, d in zip(accepted, padded) if d > 0]


def median_known(values: Iterable[float | None]) -> float | None:
    """The median of the values that are known (not None); None when none is."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
