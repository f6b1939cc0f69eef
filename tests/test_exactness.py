"""Exactness that knows numerics: divergences classified as ties or mismatches, from the rule up to the merge."""

from __future__ import annotations

import pytest

from specbench.results import exactness
from specbench.results.exactness import MISMATCH, TIE, Divergence, classify, first_divergence, tie_tolerance
from specbench.results.files import CellFiles
from specbench.results.merge import merge
from specbench.results.schema import read_rows
from tests.rows import cell_row, write_cell


def test_tolerance_comes_from_the_dtype_and_float32_keeps_token_exactness():
    assert tie_tolerance("bfloat16") == pytest.approx(1.0)  # 4 spacings of 32 x 2^-7
    assert tie_tolerance("float16") == pytest.approx(4 * 32 * 2**-10)
    assert tie_tolerance("float32") is None and tie_tolerance(None) is None


def test_first_divergence_counts_an_early_end_as_one():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2


def test_a_near_tie_taken_is_a_tie_and_a_clear_winner_or_a_far_token_is_a_mismatch():
    reference = [[5, 6, 7], [5, 6, 7], [5, 6, 7]]
    other = [[5, 8, 1], [5, 9, 1], [5, 6, 7]]
    margins = [[3.0, 0.1, 2.0], [3.0, 0.1, 2.0], [3.0, 3.0, 3.0]]
    # Near ties per position, the top token included: at position 1 token 8 came within
    # the tolerance of token 6.
    near = [[[5], [6, 8], [7]], [[5], [6, 8], [7]], [[5], [6], [7]]]
    found = classify(reference, other, tolerance=1.0, margins=margins, near_ties=near)
    # Request 0 took the near tie; request 1 took a token that was not near the top (a wrong
    # continuation is never excused as a tie, however small the top-two margin).
    assert found == [Divergence(0, 1, TIE, 0.1), Divergence(1, 1, MISMATCH, 0.1)]
    assert exactness.verdict(found) == "mismatch" and exactness.verdict(found[:1]) == "ties"
    assert exactness.verdict([]) == "exact"


def test_a_three_way_tie_excuses_any_of_its_tokens():
    # The untimed pass that read the log-probabilities may itself have taken another of the
    # tied tokens (8) than the timed one (6): both outputs' tokens are in the tied set.
    found = classify([[5, 6]], [[5, 9]], tolerance=1.0, margins=[[1.0, 0.0]], near_ties=[[[5], [8, 6, 9]]])
    assert found == [Divergence(0, 1, TIE, 0.0)]
    assert classify([[5, 6]], [[5, 9]], tolerance=1.0, near_ties=[[[5], [8, 9]]])[0].kind == MISMATCH


def test_without_near_ties_recorded_a_divergence_is_a_mismatch():
    assert classify([[5, 6]], [[5, 8]], tolerance=1.0, margins=[[1.0, 0.3]])[0].kind == MISMATCH


def test_a_divergence_is_a_tie_only_if_the_emitted_token_is_in_the_references_tied_set():
    # Plain decoding at another batch size parts at position 2 as well, but the token emitted there (9) is not
    # among the reference's near ties (7, 4): the position is fragile, the token is still wrong.
    found = classify([[5, 6, 7]], [[5, 6, 9]], tolerance=1.0, margins=[[2.0, 2.0, 0.1]],
                     near_ties=[[[5], [6], [7, 4]]])
    assert found == [Divergence(0, 2, MISMATCH, 0.1)]
    assert classify([[5, 6, 7]], [[5, 6, 4]], tolerance=1.0, near_ties=[[[5], [6], [7, 4]]])[0].kind == TIE


def test_a_tie_share_far_above_the_controls_is_significant_and_a_like_one_is_not():
    # McNemar's exact test on the discordant requests: P(Bin(n, 1/2) >= cell-only ties).
    assert exactness.tie_excess_p_value(10, 0) == pytest.approx(2.0**-10)
    assert exactness.tie_excess_p_value(3, 2) == pytest.approx(0.5)
    assert exactness.tie_excess_p_value(0, 0) == 1.0
    with pytest.raises(ValueError, match="discordant requests"):
        exactness.tie_excess_p_value(-1, 4)


def test_ties_are_paired_by_request_not_counted_as_two_samples():
    # 40 requests: the control ties on 4, the cell on 10 that include those 4 (ties gather on fragile
    # requests). Paired, 6 requests tie in the cell alone and none in the control alone: p = 2^-6. Fisher's
    # test on 10 of 40 against 4 of 40, as if the two were independent samples, gave 0.07 (before issue 56).
    assert exactness.tie_excess_p_value(6, 0) == pytest.approx(1 / 64)
    assert exactness.tie_excess_p_value(6, 0) < 0.02


def bf16_pair(tmp_path, name, base_tokens, spec_tokens, margins, near_ties, batch=1, engine_run=0):
    base_id, spec_id = f"b{name}{batch}-p{engine_run}", f"s{name}{batch}-p{engine_run}"
    base = cell_row(base_id, "baseline", 2.0, engine_run=engine_run, config_hash=f"B{name}{batch}") | {
        "dtype": "bfloat16", "batch_size": batch, "top2_margins": margins, "near_tie_tokens": near_ties}
    spec = cell_row(spec_id, "ngram", 1.0, baseline_id=base_id, engine_run=engine_run,
                    config_hash=f"S{name}{batch}") | {"dtype": "bfloat16", "batch_size": batch}
    write_cell(tmp_path, base, base_tokens)
    if spec_tokens is not None:
        write_cell(tmp_path, spec, spec_tokens)
    return [base_id] + ([spec_id] if spec_tokens is not None else [])


def test_merge_counts_ties_as_a_caveat_and_flags_only_a_real_mismatch(tmp_path):
    margins, near = [[2.0, 0.05, 2.0], [2.0, 2.0, 2.0]], [[[1], [2, 9], [3]], [[1], [2], [3]]]
    ids = bf16_pair(tmp_path, "t", [[1, 2, 3], [1, 2, 3]], [[1, 9, 4], [1, 2, 3]], margins, near)
    # The same cell with its outputs edited after the fact at a clear winner: a mismatch.
    ids += bf16_pair(tmp_path, "m", [[1, 2, 3], [1, 2, 3]], [[1, 2, 3], [1, 2, 7]], margins, near)
    rows = {r["cell_id"]: r for r in merge(tmp_path, ids)}
    tie, bad = rows["st1-p0"], rows["sm1-p0"]
    assert (tie["exact_match"], tie["exactness"], tie["tie_requests"], tie["mismatched_requests"]) == (
        False, "ties", 1, 0)
    assert tie["divergences"] == [{"request": 0, "position": 1, "kind": "tie", "margin": 0.05}]
    assert not tie["flagged"] and "numerical ties (token positions 1)" in tie["caveats"][0]
    # One batch size: no control, and the caveat says the excess of ties went untested.
    assert "no control" in tie["caveats"][0]
    assert tie["tie_tolerance"] == pytest.approx(1.0)
    assert (bad["exactness"], bad["mismatched_requests"]) == ("mismatch", 1)
    assert bad["flagged"] and "clear winner" in bad["flag_reasons"][0]


def _one_curve(tmp_path, ids):
    config = '{"workload": {"name": "summarize"}}'
    for cell_id in ids:  # one curve: the same config but for the batch size
        files = CellFiles(tmp_path, cell_id)
        row = read_rows(files.row)[0] | {"config_json": config}
        write_cell(tmp_path, row, files.read_tokens())


def test_baselines_at_a_larger_batch_are_compared_with_the_smallest_one(tmp_path):
    # Plain decoding at batch 2 parts from batch 1 at position 1 of request 0, at a near tie of batch 1's
    # (tokens 2 and 8): the control's own divergence is a tie. The speculative cell at batch 2 parts from its
    # own baseline there too, emitting 2, which its baseline's tied set ([8]: a wide margin) does not hold:
    # a control position does not excuse a token the reference had no tie for (hand-edited mismatch caught).
    ids = []
    for batch, tokens in ((1, [[1, 2, 3], [4, 5, 6]]), (2, [[1, 8, 3], [4, 5, 6]])):
        margins = [[2.0, 0.1 if batch == 1 else 2.0, 2.0], [2.0] * 3]
        ids += bf16_pair(tmp_path, "c", tokens, [[1, 2, 3], [4, 5, 6]] if batch == 2 else None, margins,
                         [[[1], [2, 8] if batch == 1 else [8], [3]], [[4], [5], [6]]], batch=batch)
    _one_curve(tmp_path, ids)
    rows = {r["cell_id"]: r for r in merge(tmp_path, ids)}
    control = rows["bc2-p0"]
    assert control["exactness_reference"] == "bc1-p0"
    assert (control["exactness"], control["tie_requests"], control["differing_requests"]) == ("ties", 1, 1)
    assert rows["bc1-p0"]["exactness"] is None  # the smallest batch is the reference itself
    spec = rows["sc2-p0"]
    assert spec["divergences"] == [{"request": 0, "position": 1, "kind": "mismatch", "margin": 2.0}]
    assert spec["exactness"] == "mismatch" and spec["flagged"]


def test_a_control_whose_own_divergence_is_a_mismatch_excuses_nothing(tmp_path):
    # Plain decoding at batch 2 leaves batch 1 at position 1 with token 8, outside batch 1's tied set [2, 5]:
    # the control itself mismatches there. A speculative cell at batch 1 that emits the same 8 at that
    # position is a mismatch, not a tie.
    ids = bf16_pair(tmp_path, "x", [[1, 2, 3]], [[1, 8, 3]], [[2.0, 0.1, 2.0]], [[[1], [2, 5], [3]]], batch=1)
    ids += bf16_pair(tmp_path, "x", [[1, 8, 3]], None, [[2.0] * 3], [[[1], [8], [3]]], batch=2)
    _one_curve(tmp_path, ids)
    rows = {r["cell_id"]: r for r in merge(tmp_path, ids)}
    assert rows["bx2-p0"]["exactness"] == "mismatch"
    spec = rows["sx1-p0"]
    assert (spec["exactness"], spec["mismatched_requests"], spec["tie_requests"]) == ("mismatch", 1, 0)


def test_a_cell_tying_far_more_often_than_plain_decoding_is_flagged(tmp_path):
    # 12 requests. Plain decoding at batch 2 parts from batch 1 at a tie on 1 of them; the speculative cell
    # parts at a tie (its token within the tolerance each time) on 10 of them: every divergence is a tie by
    # the per-request rule, but far more of them than numerics give.
    requests = 12
    reference = [[1, 2, 3] for _ in range(requests)]
    near = [[[1], [2, 9], [3]] for _ in range(requests)]
    margins = [[2.0, 0.2, 2.0] for _ in range(requests)]
    speculative = [[1, 9, 3] if i < 10 else [1, 2, 3] for i in range(requests)]
    ids = bf16_pair(tmp_path, "e", reference, speculative, margins, near, batch=1)
    plain = [[1, 9, 3] if i == 0 else [1, 2, 3] for i in range(requests)]
    ids += bf16_pair(tmp_path, "e", plain, None, margins, near, batch=2)
    _one_curve(tmp_path, ids)
    spec = {r["cell_id"]: r for r in merge(tmp_path, ids)}["se1-p0"]
    assert (spec["exactness"], spec["tie_requests"]) == ("ties", 10)
    assert spec["flagged"]
    assert any("ties on 10 of 12 requests where plain decoding at another batch size ties on 1 of them "
               "(9 only in the cell, 0 only in plain decoding)" in reason and "McNemar" in reason
               for reason in spec["flag_reasons"])
    # The same ties on 1 request only: as often as plain decoding, a caveat and no flag.
    for cell_id in ids:
        CellFiles(tmp_path, cell_id).row.unlink()
    speculative = [[1, 9, 3] if i == 5 else [1, 2, 3] for i in range(requests)]
    ids = bf16_pair(tmp_path, "e", reference, speculative, margins, near, batch=1)
    ids += bf16_pair(tmp_path, "e", plain, None, margins, near, batch=2)
    _one_curve(tmp_path, ids)
    spec = {r["cell_id"]: r for r in merge(tmp_path, ids)}["se1-p0"]
    assert spec["exactness"] == "ties" and not spec["flagged"] and spec["caveats"]


def test_the_control_is_plain_decoding_at_the_batch_shape_nearest_the_cells(tmp_path):
    # A cell at batch 1 with K = 2 verifies 3 tokens a step: its control is plain decoding at batch 2 (the
    # sibling nearest 3), which ties on none of 12 requests; the cell ties on 8. Plain decoding at batch 8
    # ties on the same 8: pooled over every sibling (before issue 56), the control tied as often as the
    # cell, and the excess went unseen.
    requests = 12
    reference = [[1, 2, 3] for _ in range(requests)]
    near = [[[1], [2, 9], [3]] for _ in range(requests)]
    margins = [[2.0, 0.2, 2.0] for _ in range(requests)]
    tied = [[1, 9, 3] if i < 8 else [1, 2, 3] for i in range(requests)]
    ids = bf16_pair(tmp_path, "n", reference, tied, margins, near, batch=1)
    ids += bf16_pair(tmp_path, "n", reference, None, margins, near, batch=2)
    ids += bf16_pair(tmp_path, "n", tied, None, margins, near, batch=8)
    _one_curve(tmp_path, ids)
    spec = {r["cell_id"]: r for r in merge(tmp_path, ids)}["sn1-p0"]
    assert (spec["exactness"], spec["tie_requests"]) == ("ties", 8)
    assert spec["flagged"]
    assert any("plain decoding at another batch size ties on 0 of them" in reason for reason in spec["flag_reasons"])
