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


def test_the_control_excuses_a_position_where_plain_decoding_itself_parts():
    found = classify([[5, 6, 7]], [[5, 6, 9]], tolerance=0.25, control_positions=[{2}])
    assert found[0].kind == TIE and found[0].margin is None
    # float32: no tolerance, so nothing is a tie, control or not.
    assert classify([[5, 6, 7]], [[5, 6, 9]], tolerance=None, control_positions=[{2}])[0].kind == MISMATCH


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
    assert tie["tie_tolerance"] == pytest.approx(1.0)
    assert (bad["exactness"], bad["mismatched_requests"]) == ("mismatch", 1)
    assert bad["flagged"] and "clear winner" in bad["flag_reasons"][0]


def test_baselines_at_a_larger_batch_are_compared_with_the_smallest_one(tmp_path):
    # Plain decoding at batch 2 parts from batch 1 at position 1 of request 0 (a near tie
    # there); the speculative cell at batch 2 parts from its baseline at that same
    # position: the control excuses it although its own baseline's margin is wide.
    config = '{"workload": {"name": "summarize"}}'
    ids = []
    for batch, tokens in ((1, [[1, 2, 3], [4, 5, 6]]), (2, [[1, 8, 3], [4, 5, 6]])):
        margins = [[2.0, 0.1 if batch == 1 else 2.0, 2.0], [2.0] * 3]
        ids += bf16_pair(tmp_path, "c", tokens, [[1, 2, 3], [4, 5, 6]] if batch == 2 else None, margins,
                         [[[1], [2, 8] if batch == 1 else [8], [3]], [[4], [5], [6]]], batch=batch)
    for cell_id in ids:  # one curve: the same config but for the batch size
        files = CellFiles(tmp_path, cell_id)
        row = read_rows(files.row)[0] | {"config_json": config}
        write_cell(tmp_path, row, files.read_tokens())
    rows = {r["cell_id"]: r for r in merge(tmp_path, ids)}
    control = rows["bc2-p0"]
    assert control["exactness_reference"] == "bc1-p0"
    assert (control["exactness"], control["tie_requests"], control["differing_requests"]) == ("ties", 1, 1)
    assert rows["bc1-p0"]["exactness"] is None  # the smallest batch is the reference itself
    spec = rows["sc2-p0"]
    assert spec["divergences"] == [{"request": 0, "position": 1, "kind": "tie", "margin": 2.0}]
