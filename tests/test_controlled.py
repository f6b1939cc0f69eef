"""Controlled acceptance: the proposer's corruption logic without an engine, then once with one."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from specbench import controlled
from specbench.analytic import acceptance
from specbench.controlled import ControlledProposer, ReferenceBook, corrupt_draft, prompt_stream

VOCAB = 1000


def _config(k: int, seed: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(seed=seed, get_vocab_size=lambda: VOCAB),
    )


@pytest.fixture
def proposer_env(monkeypatch):
    def make(alpha: float, k: int, references: ReferenceBook, seed: int = 0) -> ControlledProposer:
        monkeypatch.setenv(controlled.ALPHA_ENV, repr(alpha))
        return ControlledProposer(_config(k, seed), references)

    return make


def test_corrupted_positions_get_a_different_valid_token():
    reference = list(range(200, 400))
    draft = corrupt_draft(reference, alpha=0.0, seed=1, stream=7, start=0, vocab_size=VOCAB)
    assert all(d != r and 0 <= d < VOCAB for d, r in zip(draft, reference))
    assert corrupt_draft(reference, alpha=1.0, seed=1, stream=7, start=0, vocab_size=VOCAB) == reference


def test_corruption_is_fixed_by_seed_stream_and_position():
    reference = list(range(50))
    args = dict(alpha=0.5, stream=3, vocab_size=VOCAB)
    whole = corrupt_draft(reference, seed=0, start=10, **args)
    # The same absolute positions drafted in another step see the same draws.
    assert corrupt_draft(reference[5:9], seed=0, start=15, **args) == whole[5:9]
    assert whole != corrupt_draft(reference, seed=1, start=10, **args)
    assert whole != corrupt_draft(reference, seed=0, start=10, alpha=0.5, stream=4, vocab_size=VOCAB)


@pytest.mark.parametrize("alpha", [0.3, 0.7])
def test_each_position_is_kept_with_probability_alpha(alpha):
    reference = [5] * 20000
    draft = corrupt_draft(reference, alpha=alpha, seed=0, stream=1, start=0, vocab_size=VOCAB)
    kept = sum(d == 5 for d in draft) / len(draft)
    assert kept == pytest.approx(alpha, abs=0.015)


def test_vocabulary_of_one_token_is_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        corrupt_draft([0], alpha=0.5, seed=0, stream=0, start=0, vocab_size=1)


def test_alpha_must_be_in_the_unit_interval(monkeypatch):
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError):
            controlled.check_alpha(bad)
    monkeypatch.delenv(controlled.ALPHA_ENV, raising=False)
    with pytest.raises(RuntimeError, match=controlled.ALPHA_ENV):
        ControlledProposer(_config(4), ReferenceBook())


def test_reference_book_finds_requests_by_their_tokens():
    book = ReferenceBook()
    book.replace([((1, 2, 3), (10, 11, 12)), ((1, 2, 3), (10, 11, 12)), ((1, 2), (9, 9))])
    assert len(book) == 2  # duplicates are held once
    assert book.find(np.array([1, 2, 3, 10])).tokens.tolist() == [1, 2, 3, 10, 11, 12]
    assert book.find(np.array([1, 2, 9])).prompt_len == 2
    assert book.find(np.array([1, 2, 3, 99])) is None  # left its reference
    assert book.find(np.array([7, 7, 7])) is None  # unknown prompt
    assert book.find(np.array([1, 2, 3, 10, 11, 12, 13])) is None  # past its end


def _simulate(proposer: ControlledProposer, full: np.ndarray, prompt_len: int, max_tokens: int):
    """Greedy verification as vLLM does it, with the reference as the target's own output.

    Returns (drafts, accepted tokens, accepted per position).
    """
    rows = np.zeros((1, len(full)), dtype=np.int32)
    n = prompt_len + 1  # prefill emitted one token
    rows[0, :n] = full[:n]
    drafts = accepted = 0
    per_pos = [0] * proposer.k
    while n < prompt_len + max_tokens:
        (draft,) = proposer.propose([[int(full[n - 1])]], np.array([n]), rows)
        assert draft, "every step of a known request carries a draft"
        drafts += 1
        a = 0
        while a < len(draft) and draft[a] == full[n + a]:
            per_pos[a] += 1
            a += 1
        accepted += a
        rows[0, n : n + a + 1] = full[n : n + a + 1]
        n += a + 1
    return drafts, accepted, per_pos


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
def test_acceptance_length_and_per_position_rates_follow_alpha(proposer_env, alpha):
    k, rng = 4, np.random.default_rng(0)
    book = ReferenceBook()
    requests = [(tuple(rng.integers(0, VOCAB, 20)), tuple(rng.integers(0, VOCAB, 600))) for _ in range(8)]
    book.replace(requests)
    proposer = proposer_env(alpha, k, book)
    drafts = accepted = 0
    per_pos = np.zeros(k)
    for prompt, continuation in requests:
        d, a, p = _simulate(proposer, np.array(prompt + continuation), len(prompt), 500)
        drafts, accepted, per_pos = drafts + d, accepted + a, per_pos + p
    assert 1 + accepted / drafts == pytest.approx(acceptance.expected_tokens_per_pass(alpha, k), rel=0.04)
    rates = per_pos / drafts
    for i, rate in enumerate(rates, start=1):
        assert rate == pytest.approx(alpha**i, abs=0.03)


def test_no_draft_while_paused_for_unknown_requests_or_rows_without_a_sample(proposer_env):
    book = ReferenceBook()
    book.replace([((1, 2, 3), (4, 5, 6, 7, 8))])
    proposer = proposer_env(1.0, 2, book)
    rows = np.array([[1, 2, 3, 4, 0, 0, 0, 0], [9, 9, 9, 9, 0, 0, 0, 0]], dtype=np.int32)
    counts = np.array([4, 4])
    assert proposer.propose([[4], [9]], counts, rows) == [[5, 6], []]
    assert proposer.propose([[], [9]], counts, rows) == [[], []]
    with controlled.drafting_paused():
        assert proposer.propose([[4], [9]], counts, rows) == [[], []]
    assert proposer.propose([[4], [9]], counts, rows) == [[5, 6], []]


def test_reference_pass_asks_for_k_extra_tokens_and_fills_the_registry(proposer_env):
    proposer = proposer_env(0.5, 3, controlled.REFERENCES)
    asked = []

    def generate(prompts, max_tokens):
        asked.append(max_tokens)
        assert controlled._paused
        return [tuple(range(100, 100 + max_tokens)) for _ in prompts]

    controlled.reference_pass(generate, [((1, 2),), ((3, 4),)], 5)
    assert asked == [8, 8] and len(proposer.references) == 2
    assert not controlled._paused


def test_prompt_stream_depends_on_every_token():
    assert prompt_stream([1, 2, 3]) == prompt_stream((1, 2, 3))
    assert prompt_stream([1, 2, 3]) != prompt_stream([1, 2, 4])


# --------------------------------------------------------------------------- real engine


@pytest.mark.engine
def test_real_engine_accepts_at_the_controlled_rate():
    """vLLM loads the proposer, output stays the same, and AL orders 0.5 < 0.9 near E(alpha, 4).

    Two rates, an engine each: a proposer that ignored the rate fails the order, and one that accepted whole
    drafts at the rate rather than each position (AL 1 + 4 alpha) misses E(0.5, 4) = 1.94 by half. A third rate
    between them cost an engine start more."""
    from transformers import AutoTokenizer

    from specbench.measure import CellPlan
    from specbench.engine import EngineSpec, EngineWorker
    from specbench.models import resolve

    model = resolve("embedded:smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = ["The history of the bicycle begins in", "Write a short note about rivers and",
             "In a small village by the sea, there", "The three most important rules of cooking are"]
    plan = CellPlan(
        prompts=tuple(tuple(tokenizer(t)["input_ids"]) for t in texts),
        batch_size=4, max_tokens=48, repetitions=1, warmup=False, reference_pass=True,
    )
    speculative = json.dumps({"method": "custom_class", "model": controlled.PROPOSER_CLASS,
                              "num_speculative_tokens": 4})
    lengths, outputs = {}, {}
    for alpha in (0.5, 0.9):
        spec = EngineSpec(
            model=model, dtype="float32", seed=0, max_model_len=512, max_num_seqs=8,
            enforce_eager=True, enable_prefix_caching=False, gpu_memory_utilization=0.9,
            cpu_kvcache_space_gib=1, speculative_config_json=speculative,
            worker_env=((controlled.ALPHA_ENV, repr(alpha)),),
        )
        worker = EngineWorker(spec)
        try:
            m = worker.measure(plan)
        finally:
            worker.close()
        assert m.counters.drafts > 0
        lengths[alpha] = 1 + m.counters.accepted_tokens / m.counters.drafts
        outputs[alpha] = m.token_ids
    assert lengths[0.5] < lengths[0.9]
    for alpha, length in lengths.items():
        assert length == pytest.approx(acceptance.expected_tokens_per_pass(alpha, 4), rel=0.2), lengths
    # Different corruption, same tokens: the target decides every one.
    assert outputs[0.5] == outputs[0.9]
