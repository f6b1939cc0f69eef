"""CUDA graphs: the step sizes an engine captures, so that every step of its cells replays one.

vLLM 0.32 replays a CUDA graph for a step only when a captured size holds it
(``vllm/config/vllm.py``, ``VllmConfig._set_cudagraph_sizes``). Left to
itself it captures up to 512 tokens (1024 on capability-100 parts), capped by
``max_num_seqs * (K+1) * 2`` and by ``max_num_batched_tokens``, and adds the
uniform decode sizes (requests x (K+1)) only below that ceiling. A
speculative step of batch B verifies B x (K+1) tokens: 640 at batch 128 and
K=4, which then runs without graphs while its baseline (128 tokens) replays
one. Given an explicit ``max_cudagraph_capture_size`` vLLM captures only its
token grid (1, 2, 4, multiples of 8 below 256, of 16 from 256) and no decode
sizes, so a step such as 100 x 5 = 500 tokens, off the grid, still has no
graph of its own.

So specbench hands vLLM the list itself (``compilation_config.cudagraph_capture_sizes``,
which vLLM keeps as given, dropping only sizes above ``max_num_batched_tokens``):
the token grid up to the engine's largest step, plus, for each tokens-per-request
``q`` its steps use (one for a fixed K, one per tier of a K schedule), ``n x q``
for vLLM's own request-count grid up to the widest batch run at ``q``, that
batch included. :func:`capture_sizes` builds it; an engine on vLLM's V1 model
runner (a heterogeneous-vocabulary draft, suffix, custom_class on CUDA) rounds
it to multiples of K+1 (:func:`v1_capture_sizes`); the memory model prices it
(:func:`specbench.analytic.footprint.cuda_graph_bytes`). Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specbench.analytic.checks import check_int
from specbench.analytic.prediction import effective_k


def token_grid(largest: int) -> list[int]:
    """vLLM's default capture grid up to ``largest`` tokens: 1, 2, 4, every 8 below 256, every 16 from 256."""
    return ([n for n in (1, 2, 4) if n <= largest] + list(range(8, min(largest + 1, 256), 8))
            + list(range(256, largest + 1, 16)))


def step_tiers(batch: int, k: int, speculative_config: Mapping[str, Any] | None) -> dict[int, int]:
    """Tokens per request of a decode step (K+1; 1 for plain decoding), each with the widest batch that steps at it.

    A batch of ``batch`` requests steps with every size from ``batch`` down
    to 1 as its requests finish; a K schedule
    (``num_speculative_tokens_per_batch_size``) picks K by the number of
    requests in the step (:func:`specbench.analytic.prediction.effective_k`),
    so each of its tiers reachable within ``batch`` is one entry.
    """
    batch = check_int("batch", batch, 1)
    widest: dict[int, int] = {}
    for requests in range(1, batch + 1):
        widest[effective_k(speculative_config, k, requests) + 1] = requests
    return widest


def largest_step(batch: int, k: int, speculative_config: Mapping[str, Any] | None) -> int:
    """The most tokens one decode step of up to ``batch`` requests verifies: max of requests x (K+1)."""
    return max(q * requests for q, requests in step_tiers(batch, k, speculative_config).items())


def capture_sizes(
    batch: int, k: int, speculative_config: Mapping[str, Any] | None, step_limit: int | None = None
) -> tuple[int, ...]:
    """The CUDA-graph capture sizes (tokens) that cover every decode step of up to ``batch`` requests.

    The token grid up to :func:`largest_step` (for mixed prefill and decode
    steps, as vLLM's own), and for each tier of :func:`step_tiers` its
    uniform decode sizes ``n x q``, n from vLLM's request-count grid (1, 2,
    4, every 8 below 256, every 16 from 256) up to the tier's widest batch,
    which is always included. ``step_limit``: the engine's
    ``max_num_batched_tokens``; larger sizes are left out, as vLLM drops
    them (a step cannot exceed it).
    """
    tiers = step_tiers(batch, k, speculative_config)
    sizes = set(token_grid(largest_step(batch, k, speculative_config)))
    for q, widest in tiers.items():
        sizes |= {q * n for n in token_grid(widest) + [widest]}
    if step_limit is not None:
        sizes = {s for s in sizes if s <= check_int("step_limit", step_limit, 1)}
    return tuple(sorted(sizes))


def v1_capture_sizes(sizes: Sequence[int], query_len: int) -> tuple[int, ...]:
    """The capture sizes vLLM 0.32's V1 model runner captures of ``sizes`` for a speculative engine whose
    uniform decode step verifies ``query_len`` (K+1) tokens per request.

    V1 rounds every size up to a multiple of K+1 and keeps those not above the
    list's largest (``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``, applied
    when the decode mode is FULL, as in the default FULL_AND_PIECEWISE, and K+1 > 1); where
    none is left, K+1 itself if the largest allows it. V2 keeps the list as given.
    A mixed step then pads to the next multiple of K+1, and fewer, coarser sizes remain.
    """
    query_len = check_int("query_len", query_len, 1)
    if not sizes or query_len <= 1:
        return tuple(sorted(sizes))
    largest = max(sizes)
    rounded = sorted({up for s in sizes if (up := -(-s // query_len) * query_len) <= largest})
    if not rounded and query_len <= largest:
        rounded = [query_len]
    return tuple(rounded)


def graph_batch(plain: Mapping[str, Any]) -> int:
    """The most requests one step of a cell's engine runs, from its resolved config.

    ``engine.cudagraph_batch_size`` when set (a sweep sets it per engine: the
    largest of the cells that share the engine); else the cell's own: its
    ``batch_size`` offline, and for a serving cell what the load allows at
    once, ``load.max_concurrency`` (else ``engine.max_num_seqs``) capped by
    ``load.num_requests``.
    """
    engine = plain["engine"]
    if engine.get("cudagraph_batch_size") is not None:
        return int(engine["cudagraph_batch_size"])
    load = plain.get("load") or {}
    if load.get("request_rate") is not None:
        concurrency = load.get("max_concurrency") or engine["max_num_seqs"]
        return int(min(concurrency, load.get("num_requests") or concurrency))
    return int(plain["batch_size"])
