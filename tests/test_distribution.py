"""Exactness in distribution (specbench.results.distribution), the sampling keys, and their plumbing."""

from __future__ import annotations

import numpy as np
import pytest

from specbench import sampling
from specbench.measure import CellPlan, DistributionPlan, measure
from specbench.results import distribution
from specbench.results.judging import FAMILY_ALPHA


def draws(rng: np.random.Generator, probs: np.ndarray, prompts: int = 4, n: int = 64, tokens: int = 8):
    """Sequences whose later tokens depend on the first (as a language model's do)."""
    out = []
    for _ in range(prompts):
        first = rng.choice(len(probs), size=n, p=probs)
        rest = rng.choice(len(probs), size=(n, tokens - 1), p=probs) + 10 * (first[:, None] == 0)
        out.append(np.concatenate([first[:, None], rest], axis=1).tolist())
    return out


P = np.array([0.5, 0.2, 0.15, 0.1, 0.05])


def test_same_distribution_is_rejected_about_five_percent_of_the_time():
    rng = np.random.default_rng(7)
    p_values = [distribution.permutation_p_value(draws(rng, P, n=32), draws(rng, P, n=32), permutations=199, seed=i)
                for i in range(200)]
    rate = float(np.mean(np.array(p_values) < 0.05))
    assert 0.01 <= rate <= 0.10  # binomial(200, 0.05): 0.05 +- 3 sd


def test_tampered_samples_get_a_small_p_value():
    rng = np.random.default_rng(3)
    baseline, speculative = draws(rng, P), draws(rng, P)
    # After the fact, every third sample's drafted positions (all but the first) set to their most
    # likely tokens: what a sampler that accepts argmax drafts without the rejection rule drifts to.
    tampered = [[[s[0]] + [10 if s[0] == 0 else 0] * (len(s) - 1) if i % 3 == 0 else s
                 for i, s in enumerate(prompt)] for prompt in speculative]
    assert distribution.permutation_p_value(baseline, tampered) < 0.05
    assert distribution.permutation_p_value(baseline, speculative) > 0.05


def test_a_wrong_distribution_is_detected_and_equal_tables_give_p_one():
    rng = np.random.default_rng(4)
    flatter = np.array([0.3, 0.25, 0.2, 0.15, 0.1])
    assert distribution.permutation_p_value(draws(rng, P), draws(rng, flatter)) < 0.01
    same = draws(rng, P)
    assert distribution.permutation_p_value(same, same) == 1.0


def test_sequences_that_end_early_count_as_their_own_token():
    ended = [[[1, 2]] * 40]
    full = [[[1, 2, 3, 4]] * 40]
    # Positions 2 and 3: all "ended" against all a token, each a 2 x 2 table with X^2 = n.
    assert distribution.statistic(ended, full, tokens=4) == pytest.approx(2 * 80)


def test_the_first_token_is_not_compared_no_draft_ever_touches_it():
    # Position 0 is drawn by the target's prefill in both engines: its counts are noise here.
    apart_at_first = [[[1, 5, 6]] * 40], [[[2, 5, 6]] * 40]
    assert distribution.statistic(*apart_at_first, tokens=3) == 0.0
    assert distribution.permutation_p_value(*apart_at_first, tokens=3) == 1.0
    assert sampling.validate({"distribution_check": {"tokens": 1}}) == [
        "distribution_check.tokens=1 must be an integer >= 2"]


def test_power_is_the_smallest_deviation_detected_and_shrinks_with_more_samples():
    rng = np.random.default_rng(5)
    small = distribution.detectable_deviation(draws(rng, P, n=32))
    large = distribution.detectable_deviation(draws(rng, P, n=256))
    assert small is not None and large is not None and large < small
    # A first token that is certain leaves nothing to move.
    assert distribution.detectable_deviation([[[1, 2]] * 30]) is None


def test_holm_keeps_order_and_steps_down():
    assert distribution.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert distribution.holm([]) == []


@pytest.mark.parametrize(("key", "value"), [("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2),
                                            ("top_k", 2.5)])
def test_bad_sampling_values_are_refused_naming_the_key(key, value):
    [error] = sampling.validate({key: value})
    assert error.startswith(f"{key}={value!r}")


def test_only_sampling_away_from_greedy_joins_the_identity():
    assert sampling.identity_keys({"temperature": 0.0, "top_p": 0.9, "top_k": 5}) == {}
    assert sampling.identity_keys({"temperature": 0.7, "top_p": 1.0, "top_k": -1}) == {"temperature": 0.7}
    assert sampling.identity_keys({"temperature": 1, "top_p": 0.9, "top_k": 5}) == {
        "temperature": 1.0, "top_p": 0.9, "top_k": 5}


def test_timed_sampled_requests_run_to_max_tokens_and_greedy_ones_stop_at_eos():
    # One generate() call per batch, timed to its longest request: a sampled request that stopped early made a
    # cell and its baseline batches of unequal work (before issue 56, min_tokens was never set).
    hot = sampling.Sampling(temperature=0.7)
    assert hot.timed(128).params() == {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "min_tokens": 128}
    assert hot.params() == {"temperature": 0.7, "top_p": 1.0, "top_k": 0}
    assert sampling.GREEDY.timed(128) is sampling.GREEDY and sampling.GREEDY.timed(128).params() == {
        "temperature": 0.0}


class _Recorder:
    """A Generator that records what it was asked for and echoes each request's seed as its token."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, sampling.Sampling, list[int] | None]] = []

    def generate(self, prompts, max_tokens, sampling_=sampling.GREEDY, seeds=None):
        self.asked.append((max_tokens, sampling_, None if seeds is None else list(seeds)))
        from specbench.measure import GeneratedRequest

        return [GeneratedRequest((s if seeds else 0,) * max_tokens, None, None, None) for s in (seeds or prompts)]

    def spec_counters(self):
        from specbench.measure import SpecCounters

        return SpecCounters()


def test_a_sampled_plan_seeds_every_request_and_draws_the_check_untimed():
    hot = sampling.Sampling(temperature=0.7)
    check = DistributionPlan(prompts=2, samples=3, tokens=4, stream="abc/r0", prompt_tokens=64)
    plan = CellPlan(prompts=((1,), (2,), (3,), (4,)), batch_size=2, max_tokens=6, repetitions=2, seed=5,
                    sampling=hot, distribution=check)
    engine = _Recorder()
    m = measure(engine, plan)
    timed = [a for a in engine.asked[1:] if a[0] == 6]
    # Every repetition gives request i the same seed: seed * stride + i.
    assert [a[2] for a in timed] == [[5_000_000, 5_000_001], [5_000_002, 5_000_003]] * 2
    # Timed requests run to max_tokens (min_tokens = max_tokens); the warm-up and the check's draws do not.
    assert all(a[1] == sampling.Sampling(temperature=0.7, min_tokens=6) for a in timed)
    assert all(a[1] == hot for a in engine.asked if a[0] != 6)
    drawn = m.distribution
    assert drawn is not None and engine.asked[-1][0] == 4
    assert [len(p) for p in drawn.samples] == [3, 3]
    seeds = {s[0] for prompt in drawn.samples for s in prompt}
    assert len(seeds) == 6 and not seeds & {5_000_000, 5_000_001, 5_000_002, 5_000_003}


def test_the_merge_checks_sampled_cells_in_distribution_not_token_for_token(tmp_path):
    from rows import cell_row, write_cell

    from specbench.results.merge import merge

    rng = np.random.default_rng(11)

    def sampled(row, samples):
        return row | {"temperature": 0.7, "distribution_samples": samples, "distribution_check_s": 0.5}

    base = sampled(cell_row("base", "baseline", 10.0), draws(rng, P))
    good = sampled(cell_row("good", "ngram", 5.0, baseline_id="base"), draws(rng, P))
    flat = np.array([0.2, 0.2, 0.2, 0.2, 0.2])
    bad = sampled(cell_row("bad", "ngram", 5.0, baseline_id="base", k=4), draws(rng, flat))
    write_cell(tmp_path, base, [[1, 2], [3, 4]])
    # Sampled outputs differ from the baseline's by design: that is no mismatch.
    write_cell(tmp_path, good, [[1, 9], [3, 9]])
    write_cell(tmp_path, bad, [[1, 2], [3, 4]])
    rows = {r["cell_id"]: r for r in merge(tmp_path, ["base", "good", "bad"])}
    assert rows["good"]["exactness"] == "distribution" and not rows["good"]["flagged"]
    assert rows["good"]["distribution_p_value"] > 0.05 and rows["good"]["distribution_power_tv"] is not None
    assert rows["bad"]["exactness"] == "mismatch" and rows["bad"]["flagged"]
    assert rows["bad"]["distribution_p_adjusted"] == pytest.approx(min(1.0, 2 * rows["bad"]["distribution_p_value"]))
    assert any("in distribution" in reason for reason in rows["bad"]["flag_reasons"])
    assert rows["good"]["distribution_check_share"] == pytest.approx(0.5 / 15.0)


def test_temperature_makes_another_curve_and_greedy_keys_are_unchanged():
    import json

    from specbench.results.schema import curve_key

    def row(**config):
        return {"model": "m", "method": "ngram", "num_speculative_tokens": 4,
                "config_json": json.dumps({"method": {"name": "ngram"}, "workload": {"name": "w"}, **config})}

    old = row()
    assert curve_key(row(temperature=0.0, top_p=1.0, top_k=0)) == curve_key(old)
    assert curve_key(row(temperature=0.7)) != curve_key(old) != curve_key(row(temperature=1.0))


def test_the_reference_pools_the_baselines_draws_at_every_batch_size(tmp_path):
    # The check's draws do not depend on the cell's batch size: a sampled cell is tested against its
    # baseline's draws and those of the baselines of the same curve at every other batch size.
    from rows import cell_row, write_cell

    from specbench.results.merge import merge

    rng = np.random.default_rng(12)

    def sampled(row, samples):
        return row | {"temperature": 0.7, "distribution_samples": samples, "distribution_check_s": 0.5}

    at_1, at_8, spec = draws(rng, P), draws(rng, P), draws(rng, P)
    write_cell(tmp_path, sampled(cell_row("base1", "baseline", 10.0), at_1), [[1, 2], [3, 4]])
    write_cell(tmp_path, sampled(cell_row("base8", "baseline", 10.0) | {"batch_size": 8}, at_8), [[1, 2], [3, 4]])
    write_cell(tmp_path, sampled(cell_row("spec", "ngram", 5.0, baseline_id="base1"), spec), [[1, 9], [3, 9]])
    pooled = [a + b for a, b in zip(at_1, at_8)]
    row = {r["cell_id"]: r for r in merge(tmp_path, ["base1", "base8", "spec"])}["spec"]
    assert row["distribution_p_value"] == distribution.permutation_p_value(pooled, spec)
    assert row["distribution_power_tv"] == distribution.detectable_deviation(pooled, [len(s) for s in spec],
                                                                           alpha=FAMILY_ALPHA)
    alone = {r["cell_id"]: r for r in merge(tmp_path, ["base1", "spec"])}["spec"]
    assert alone["distribution_p_value"] == distribution.permutation_p_value(at_1, spec)


def _sampled_cell(row, samples, **extra):
    return row | {"temperature": 0.7, "distribution_samples": samples, "distribution_check_s": 0.5} | extra


def test_the_merge_compares_every_token_the_check_drew(tmp_path):
    # distribution_check.tokens=32: the cell agrees with its baseline on tokens 0-7 and is flat from token 8
    # on. Compared on 8 tokens (as before), it would pass; on the 32 it drew, it fails.
    from rows import cell_row, write_cell

    from specbench.results.merge import merge

    rng = np.random.default_rng(21)
    flat = np.array([0.2, 0.2, 0.2, 0.2, 0.2])
    base = draws(rng, P, tokens=32)
    head, tail = draws(rng, P, tokens=8), draws(rng, flat, tokens=24)
    spec = [[a + b for a, b in zip(p, q)] for p, q in zip(head, tail)]
    write_cell(tmp_path, _sampled_cell(cell_row("base", "baseline", 10.0), base), [[1, 2], [3, 4]])
    write_cell(tmp_path, _sampled_cell(cell_row("spec", "ngram", 5.0, baseline_id="base"), spec), [[1, 9], [3, 9]])
    assert distribution.permutation_p_value(base, spec) > 0.05  # the first 8 tokens alone see nothing
    row = {r["cell_id"]: r for r in merge(tmp_path, ["base", "spec"])}["spec"]
    assert row["distribution_p_value"] == distribution.permutation_p_value(base, spec, tokens=32)
    assert row["distribution_p_value"] < 0.01 and row["exactness"] == "mismatch"


def test_power_is_stated_at_the_level_holm_applies_over_the_checked_cells(tmp_path):
    from rows import cell_row, write_cell

    from specbench.results.merge import merge

    rng = np.random.default_rng(22)
    base = draws(rng, P)
    write_cell(tmp_path, _sampled_cell(cell_row("base", "baseline", 10.0), base), [[1, 2], [3, 4]])
    ids = ["base"]
    for k in (2, 3, 4, 5):
        cell_id = f"spec{k}"
        write_cell(tmp_path, _sampled_cell(cell_row(cell_id, "ngram", 5.0, baseline_id="base", k=k),
                                           draws(rng, P)), [[1, 9], [3, 9]])
        ids.append(cell_id)
    rows = {r["cell_id"]: r for r in merge(tmp_path, ids)}
    at_holm = distribution.detectable_deviation(base, [64] * 4, alpha=FAMILY_ALPHA / 4)
    unadjusted = distribution.detectable_deviation(base, [64] * 4)
    assert at_holm is not None and unadjusted is not None and at_holm > unadjusted
    assert all(rows[f"spec{k}"]["distribution_power_tv"] == at_holm for k in (2, 3, 4, 5))


def test_a_cell_whose_drafts_never_reached_verification_is_untested_not_passed(tmp_path):
    from rows import cell_row, write_cell

    from specbench.results.merge import merge

    rng = np.random.default_rng(23)
    base = _sampled_cell(cell_row("base", "baseline", 10.0), draws(rng, P), distribution_drafts=0)
    idle = _sampled_cell(cell_row("idle", "ngram", 5.0, baseline_id="base"), draws(rng, P), distribution_drafts=0)
    busy = _sampled_cell(cell_row("busy", "ngram", 5.0, baseline_id="base", k=4), draws(rng, P),
                         distribution_drafts=40)
    write_cell(tmp_path, base, [[1, 2], [3, 4]])
    write_cell(tmp_path, idle, [[1, 9], [3, 9]])
    write_cell(tmp_path, busy, [[1, 9], [3, 9]])
    rows = {r["cell_id"]: r for r in merge(tmp_path, ["base", "idle", "busy"])}
    assert rows["idle"]["exactness"] == "untested" and rows["idle"]["distribution_p_value"] is None
    assert any("not checked in distribution" in c for c in rows["idle"]["caveats"])
    assert rows["busy"]["exactness"] == "distribution"
    # The untested cell is no test: Holm adjusts over the one cell checked.
    assert rows["busy"]["distribution_p_adjusted"] == rows["busy"]["distribution_p_value"]


@pytest.mark.parametrize("cells", [1, 16, 100, 101, 500])
def test_the_smallest_p_value_can_clear_holm_however_many_cells_are_checked(cells):
    permutations = distribution.permutations_for(cells)
    assert permutations >= distribution.PERMUTATIONS
    assert 1 / (1 + permutations) <= distribution.ALPHA / cells / distribution.FLOOR_MARGIN


def test_the_power_simulation_moves_only_the_positions_a_draft_decided():
    rng = np.random.default_rng(11)
    base = draws(rng, P)
    everywhere = distribution.detectable_deviation(base, [64] * 4)
    half = distribution.detectable_deviation(base, [64] * 4, verified=0.5)
    assert everywhere == 0.15 and half == 0.3
    # 4 prompts x 2 samples of 8 tokens: 7 compared positions each; 10 drafts and 18 accepted decided 28 of 56.
    samples = [[[0] * 8, [0] * 8] for _ in range(4)]
    assert distribution.verified_share(samples, 8, 10, 18) == 0.5
    assert distribution.verified_share(samples, 8, None, 18) == 1.0  # unknown: the old assumption


def test_a_cell_whose_check_is_too_weak_is_untested_not_in_distribution(tmp_path):
    # The check's draws met 12 drafts (accepted 6) over 4 x 64 x 7 compared positions: a proposer's defect
    # could act on 1% of them, and nothing up to a total variation of 0.5 there is detected. It passes (p
    # well above alpha), which says nothing: exactness "untested" with a caveat stating the power (before
    # issue 56: "distribution", checked).
    from rows import cell_row, write_cell

    from specbench.results.merge import merge

    rng = np.random.default_rng(11)
    base = _sampled_cell(cell_row("base", "baseline", 10.0), draws(rng, P))
    weak = _sampled_cell(cell_row("weak", "ngram", 5.0, baseline_id="base"), draws(rng, P),
                         distribution_drafts=12, distribution_accepted_tokens=6)
    write_cell(tmp_path, base, [[1, 2], [3, 4]])
    write_cell(tmp_path, weak, [[1, 9], [3, 9]])
    row = {r["cell_id"]: r for r in merge(tmp_path, ["base", "weak"])}["weak"]
    assert row["distribution_power_tv"] is None and row["distribution_p_adjusted"] > 0.05
    assert row["exactness"] == "untested" and not row["flagged"]
    assert any("detects no deviation up to a total-variation distance of 0.5" in c for c in row["caveats"])
