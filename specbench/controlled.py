"""Controlled acceptance: a real proposer whose drafts the target accepts at a chosen rate.

Part of the engine layer: vLLM loads :class:`ControlledProposer` itself,
through the ``custom_class`` speculative method
(``speculative_config: {method: custom_class, model:
specbench.controlled.ControlledProposer}``), inside the engine worker's
process, and calls its ``propose`` after every step. Importing this module
does not import vLLM (the proposer only reads attributes of the
``VllmConfig`` it is given), so its logic is unit-tested without an engine.

Why: vLLM's own ``rejection_sample_method: synthetic`` is refused on CPU
("Synthetic acceptance not supported with CPU sampling"), and real drafts
(ngram, a draft model) accept at whatever rate the text gives. This proposer
drafts the target's own greedy continuation, known from an untimed reference
pass, and corrupts each drafted position independently with probability
1 - alpha (the token is replaced by a different id). Greedy verification
accepts exactly the drafted tokens before the first corrupted one, so the
unconditional acceptance rate of draft position i (1-based) is alpha^i and
the acceptance length is E(alpha, K). The target still decides every token:
output stays identical to plain decoding.

The protocol inside one cell (see ``specbench.measure.measure``):

1. ``reference_pass``: every batch is decoded plainly with drafting paused,
   K tokens beyond ``max_tokens`` so that drafts near the end still have
   reference tokens; the continuations go to :data:`REFERENCES`, the
   process-level registry the proposer reads (engine and proposer share the
   worker process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
2. Warm-up and timed repetitions: the proposer finds each running request's
   reference by its tokens and drafts from it.

Corruption is seeded and keyed by (engine seed, prompt, absolute position),
not drawn from a running generator: it does not depend on batch composition
or step boundaries, every repetition sees the same draws, and a position
that was drafted but never reached (acceptance stopped earlier) keeps an
unobserved draw, so the per-position rates stay exactly geometric.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

ALPHA_ENV = "SPECBENCH_CONTROLLED_ALPHA"
"""Environment variable the proposer reads alpha from; set in the engine worker from the cell."""

PROPOSER_CLASS = f"{__name__}.ControlledProposer"
"""The ``speculative_config.model`` that makes vLLM load :class:`ControlledProposer`."""


def check_alpha(alpha: Any) -> float:
    """alpha as a float in [0, 1]; ValueError otherwise."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


# --------------------------------------------------------------------------- corruption


def _draw(seed: int, stream: int, position: int) -> tuple[float, int]:
    """A uniform in [0, 1) and a 64-bit integer, fixed by (seed, stream, position)."""
    digest = hashlib.blake2b(
        struct.pack("<qQq", seed, stream, position), digest_size=16
    ).digest()
    u, offset = struct.unpack("<QQ", digest)
    return u / 2.0**64, offset


def corrupt_draft(
    reference: Sequence[int],
    *,
    alpha: float,
    seed: int,
    stream: int,
    start: int,
    vocab_size: int,
) -> list[int]:
    """The draft for reference tokens at absolute positions start, start+1, ...

    Each position keeps its reference token when its draw u < alpha, and is
    otherwise replaced by a different token id in [0, vocab_size). Draws
    depend only on (seed, stream, position); stream identifies the request
    (see :func:`prompt_stream`).
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2 to have a different token, got {vocab_size}")
    draft = []
    for j, token in enumerate(reference):
        u, offset = _draw(seed, stream, start + j)
        if u < alpha:
            draft.append(int(token))
        else:
            draft.append((int(token) + 1 + offset % (vocab_size - 1)) % vocab_size)
    return draft


def prompt_stream(prompt: Sequence[int] | np.ndarray) -> int:
    """A 64-bit identifier of a prompt's token ids (the request's random stream)."""
    data = np.asarray(prompt, dtype=np.int64).tobytes()
    return struct.unpack("<Q", hashlib.blake2b(data, digest_size=8).digest())[0]


# --------------------------------------------------------------------------- references


@dataclass(frozen=True)
class Reference:
    """One prompt and its greedy continuation: ``tokens`` = prompt + continuation."""

    prompt_len: int
    tokens: np.ndarray
    stream: int


class ReferenceBook:
    """The greedy continuations the proposer drafts from, found by a request's tokens."""

    def __init__(self) -> None:
        self._references: list[Reference] = []

    def __len__(self) -> int:
        return len(self._references)

    def replace(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
        """Hold exactly these (prompt, continuation) pairs; duplicates are kept once."""
        seen: set[bytes] = set()
        references = []
        for prompt, continuation in pairs:
            tokens = np.asarray(list(prompt) + list(continuation), dtype=np.int64)
            if tokens.tobytes() in seen:
                continue
            seen.add(tokens.tobytes())
            references.append(Reference(len(prompt), tokens, prompt_stream(prompt)))
        self._references = references

    def find(self, context: np.ndarray, hint: Reference | None = None) -> Reference | None:
        """The reference whose tokens start with ``context`` (prompt + output so far).

        ``hint`` (the reference this row matched last step) is tried first.
        None when no reference matches: an unknown prompt, or an output that
        has left its reference.
        """
        n = len(context)
        for ref in ([hint] if hint is not None else []) + self._references:
            if ref.prompt_len <= n <= len(ref.tokens) and np.array_equal(ref.tokens[:n], context):
                return ref
        return None


REFERENCES = ReferenceBook()
"""The worker process's registry, filled by :func:`reference_pass`, read by the proposer."""

_paused = False
_active: ControlledProposer | None = None


@contextmanager
def drafting_paused() -> Iterator[None]:
    """While active, the proposer drafts nothing: the engine decodes plainly."""
    global _paused
    _paused = True
    try:
        yield
    finally:
        _paused = False


def reference_pass(
    generate: Callable[[Sequence[Sequence[int]], int], Sequence[Sequence[int]]],
    batches: Sequence[Sequence[Sequence[int]]],
    max_tokens: int,
) -> None:
    """Decode every batch plainly and give the continuations to the loaded proposer.

    ``generate(prompts, max_tokens)`` returns each prompt's output token ids.
    Generates K tokens beyond ``max_tokens`` (K from the loaded proposer), so
    that a draft made near the end of a request still has reference tokens.
    Raises RuntimeError when no ControlledProposer was loaded in this process.
    """
    if _active is None:
        raise RuntimeError(
            "a reference pass needs the controlled proposer: speculative_config must be "
            f"{{method: custom_class, model: {PROPOSER_CLASS}}}"
        )
    pairs: list[tuple[Sequence[int], Sequence[int]]] = []
    with drafting_paused():
        for batch in batches:
            pairs += zip(batch, generate(batch, max_tokens + _active.k))
    _active.references.replace(pairs)


# --------------------------------------------------------------------------- the proposer


class ControlledProposer:
    """vLLM ``custom_class`` proposer: the target's greedy continuation, corrupted at rate 1 - alpha.

    Constructed by vLLM with the engine's ``VllmConfig``; alpha comes from
    the environment variable :data:`ALPHA_ENV`, the seed from the model
    config. Rows whose request has no reference (or whose output has left
    it) get no draft, like ngram finding no match.
    """

    def __init__(self, vllm_config: Any, references: ReferenceBook | None = None) -> None:
        global _active
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.seed = int(getattr(vllm_config.model_config, "seed", None) or 0)
        raw = os.environ.get(ALPHA_ENV)
        if raw is None:
            raise RuntimeError(f"{ALPHA_ENV} is not set: the controlled method needs method.alpha")
        self.alpha = check_alpha(float(raw))
        self.references = REFERENCES if references is None else references
        self._rows: dict[int, Reference] = {}
        _active = self

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One draft per running request (row), as vLLM's model runner asks for them.

        Row i's context is ``token_ids_cpu[i, :num_tokens_no_spec[i]]``
        (prompt + output so far); rows that sampled nothing this step (a
        prefill chunk) get no draft.
        """
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            drafts.append([] if _paused or not sampled else self._draft(i, num_tokens_no_spec, token_ids_cpu))
        return drafts

    def _draft(self, row: int, num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray) -> list[int]:
        n = int(num_tokens_no_spec[row])
        ref = self.references.find(token_ids_cpu[row, :n], self._rows.get(row))
        if ref is None:
            self._rows.pop(row, None)
            return []
        self._rows[row] = ref
        return corrupt_draft(
            ref.tokens[n : n + self.k], alpha=self.alpha, seed=self.seed,
            stream=ref.stream, start=n, vocab_size=self.vocab_size,
        )

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the drafts come from the reference registry."""


__all__ = [
    "ALPHA_ENV",
    "PROPOSER_CLASS",
    "REFERENCES",
    "ControlledProposer",
    "Reference",
    "ReferenceBook",
    "check_alpha",
    "corrupt_draft",
    "drafting_paused",
    "prompt_stream",
    "reference_pass",
]
