"""The row builder and the one speedup (specbench.results.rows): the terminal line and the merge agree."""

from __future__ import annotations

from pathlib import Path

import pytest
from rows import cell_row, write_cell

from specbench.config import cell_from_config
from specbench.results import rows
from specbench.results.merge import merge


def test_speedup_is_the_baselines_wall_time_over_the_cells():
    base, spec = cell_row("b", "baseline", 2.0), cell_row("s", "ngram", 1.25, baseline_id="b")
    assert rows.speedup(base, spec) == pytest.approx(1.6)


def test_decode_speedup_uses_the_mean_tpot_and_falls_back_on_the_median():
    assert rows.decode_speedup({"tpot_s_mean": 0.02}, {"tpot_s_mean": 0.01}) == pytest.approx(2.0)
    # A row written before tpot_s_mean existed: both sides on the median.
    assert rows.decode_speedup({"tpot_s_mean": 0.02, "tpot_s_p50": 0.03}, {"tpot_s_p50": 0.01}) == pytest.approx(3.0)
    assert rows.decode_speedup({"tpot_s_p50": None}, {"tpot_s_p50": 0.01}) is None


def test_the_merge_reports_the_speedup_the_terminal_line_shows(tmp_path: Path):
    base = cell_row("b", "baseline", 2.0)
    spec = cell_row("s", "ngram", 1.25, baseline_id="b")
    write_cell(tmp_path, base, [[1, 2], [3, 4]])
    write_cell(tmp_path, spec, [[1, 2], [3, 4]])
    merged = {r["cell_id"]: r for r in merge(tmp_path, ["b", "s"])}
    assert merged["s"]["speedup_per_engine_run"] == [rows.speedup(base, spec)]
    assert merged["s"]["decode_speedup"] == pytest.approx(rows.decode_speedup(base, spec))


def test_a_failed_row_is_the_cells_identity_provenance_and_error(compose_cell):
    cell = cell_from_config(compose_cell(["method=ngram"]))
    row = rows.failed_row(cell, 2, {"git_commit": "abc", "started_at": "then"}, error="E: x", machine="CPU")
    assert row["cell_id"] == cell.cell_id and row["baseline_cell_id"] == cell.baseline().cell_id
    assert row["engine_runs"] == 2 and row["config_hash"] == cell.config_hash
    assert list(row)[-5:] == ["git_commit", "started_at", "status", "error", "machine"]
    assert (row["status"], row["error"], row["machine"]) == ("failed", "E: x", "CPU")
