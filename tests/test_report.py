"""The HTML report: figures, tables, escaping, partial sweeps, the CLI and the sweep hook.

Results files are built with the real schema (``rows_to_table`` +
``write_table``) from plausible rows whose speedups are chosen so that the
best configuration, break-even batch sizes and K schedule can be worked out
by hand.
"""

from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from rows import XSS, grid_rows, make_row, write_results

from specbench.report import write_report
from specbench.results.files import CellFiles

REPO = Path(__file__).resolve().parents[1]
# The columns schema 7 added (ties told from mismatches, caveats, attempts, ...): absent from older files.
SCHEMA_7 = ("exactness", "differing_requests", "tie_requests", "divergences", "exactness_reference", "tie_tolerance",
            "caveats", "attempts", "other_cpu_share_per_attempt", "speedup_log_sd", "speedup_df",
            "reached_concurrency", "raw_accepted_tokens", "raw_acceptance_length", "raw_acceptance_rate_per_pos",
            "top2_margins")
class Page(HTMLParser):
    """The rendered page as text: section texts and table rows, keyed by section id."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.sections: dict[str, str] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self.images: list[dict[str, str | None]] = []
        self._section: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self._space()
        if tag == "section":
            self._section = attributes.get("id")
            self.sections[self._section or ""] = ""
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(attributes)

    def handle_endtag(self, tag: str) -> None:
        self._space()
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._section:
            self.tables.setdefault(self._section, []).append(self._row)
            self._row = None
        elif tag == "section":
            self._section = None

    def handle_data(self, data: str) -> None:
        if self._section:
            self.sections[self._section] += data
        if self._cell is not None:
            self._cell.append(data)

    def _space(self) -> None:
        # Tags separate words ("<dt>Cells</dt><dd>2</dd>" reads "Cells 2").
        if self._section:
            self.sections[self._section] += " "

    def text(self, section: str) -> str:
        """The section's text with whitespace collapsed."""
        return " ".join(self.sections[section].split())


def render(
    tmp_path: Path,
    rows: Iterable[dict[str, Any]],
    extra: Mapping[str, list] | None = None,
    drop: Iterable[str] = (),
) -> tuple[str, Page]:
    path = write_report(write_results(tmp_path, rows, extra, drop))
    text = path.read_text()
    return text, Page(text)


@pytest.fixture(scope="module")
def grid_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Page]:
    return render(tmp_path_factory.mktemp("grid"), grid_rows())


# --- the full grid ------------------------------------------------------------------------------

PLOT_SECTIONS = ("speedup", "acceptance", "per-position", "heatmap", "tpot")


def test_every_figure_is_an_embedded_png_with_a_caption(grid_page: tuple[str, Page]) -> None:
    text, page = grid_page
    assert [i["id"] for i in page.images] == [f"img-{s}" for s in PLOT_SECTIONS]
    for image in page.images:
        assert (image["src"] or "").startswith("data:image/png;base64,")
        assert len(image["src"] or "") > 5000
    assert text.count("<figcaption>") == 5


def test_page_requests_nothing_from_the_network(grid_page: tuple[str, Page]) -> None:
    text, _ = grid_page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert "@import" not in text and "url(" not in text
    assert "<link" not in text


def test_page_prints_figures_and_tables_whole(grid_page: tuple[str, Page]) -> None:
    text, _ = grid_page
    print_css = text[text.index("@media print") :]
    assert "page-break-inside: avoid" in print_css and "figure, table" in print_css


def test_summary_counts_best_and_verdicts(grid_page: tuple[str, Page]) -> None:
    _, page = grid_page
    summary = page.text("summary")
    assert "Cells 30" in summary and "Failed 0" in summary
    assert "1.80× (CI [1.62, 1.98]) with ngram K=4 at batch 1 on summarize" in summary
    # ngram K=4's 1.10x at batch 4 has CI [0.99, 1.21]: it does not pay there, but K=2 does (the schedule's K).
    assert (
        "summarize: ngram K=4 pays at batch 1 (1.80×, CI [1.62, 1.98]), not at batch 4 (1.10×, CI [0.99, 1.21]); "
        "choosing the configuration per batch size, speculation pays up to batch 4"
    ) in summary
    assert "creative: draft_model K=4 pays at batch 1 (1.20×, CI [1.08, 1.32]), not at batch 4" in summary
    assert "No model columns (predicted_speedup)" in summary
    assert summary.count("A cell pays when the lower end of its 95% speedup interval lies above 1×") == 1


def test_best_configuration_per_workload_and_batch(grid_page: tuple[str, Page]) -> None:
    _, page = grid_page
    rows = page.tables["best"]
    assert rows[0] == ["workload", "batch size", "configuration", "speedup", "CI",
                       "simultaneous CI (all cells of the workload)", "decode speedup", "caveats"]
    # No pooled spread in these rows: no simultaneous interval, and no confirmation column.
    assert ["summarize", "1", "ngram K=4", "1.80×", "[1.62, 1.98]", "–", "1.80×", ""] in rows
    assert ["summarize", "4", "ngram K=2", "1.20×", "[1.08, 1.32]", "–", "1.20×", ""] in rows
    assert ["creative", "16", "ngram K=2", "0.70×", "[0.63, 0.77]", "–", "0.70×", ""] in rows
    assert len(rows) == 1 + 6


def test_break_even_is_interpolated_in_log_batch(grid_page: tuple[str, Page]) -> None:
    _, page = grid_page
    rows = {(r[0], r[1]): r[2:] for r in page.tables["break-even"][1:]}
    # ngram K=2: 1.2 at batch 4, 0.8 at 16 -> halfway in log2 -> batch 8.
    # Its intervals bracket the crossing: 1.2x [1.08, 1.32] at 4 pays, 0.8x [0.72, 0.88] at 16 lies below 1x.
    assert rows[("summarize", "ngram K=2")] == [
        "1, 4, 16", "8.0 (by the intervals: between batch 4, shown to pay, and 16, shown below 1×)",
        "n/a: no model columns"]
    # ngram K=4: 1.1 at 4, 0.6 at 16 -> log2 b = 2 + 0.2 * 2 = 2.4; but 1.1x [0.99, 1.21] at 4 is not shown to pay,
    # so the intervals put the crossing anywhere between 1 and 16 (before: "5.3", as if measured).
    assert rows[("summarize", "ngram K=4")][1] == (
        f"{2 ** 2.4:.1f} (by the intervals: between batch 1, shown to pay, and 16, shown below 1×)")
    assert rows[("summarize", "draft_model K=2")][1] == "below 1× from batch 1, the smallest measured"


def test_schedule_is_paste_ready_json(grid_page: tuple[str, Page]) -> None:
    text, page = grid_page
    blocks = re.findall(r'<h3>([^<]*)</h3>\s*<p[^>]*>[^<]*</p>\s*<pre class="schedule">([^<]*)</pre>', text)
    schedules = {html.unescape(title): json.loads(html.unescape(body)) for title, body in blocks}
    # Best K by batch: 1 -> 4 (1.8x), 4 -> 2 (1.2x), 16 -> none above 1x -> 0.
    assert schedules["ngram on summarize"] == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 3, 4], [4, 15, 2], [16, 16, 0]],
    }
    creative = schedules["draft_model on creative"]
    assert creative["num_speculative_tokens_per_batch_size"] == [[1, 3, 4], [4, 16, 0]]
    assert "draft_model on summarize" not in schedules
    assert "No K beats plain decoding at any batch size measured" in page.text("schedule")
    assert "ngram on summarize Best K by batch size: 1 → 4, 4 → 2, 16 → 0" in page.text("schedule")


def test_exactness_failed_and_provenance(grid_page: tuple[str, Page]) -> None:
    _, page = grid_page
    matched = "All speculative outputs matched the baseline token for token (24 cell(s) compared)"
    assert matched in page.text("exactness")
    assert "No cell failed." in page.text("failed")
    assert "No cell was flagged" in page.text("flagged")
    provenance = dict((r[0], r[1]) for r in page.tables["provenance"])
    assert provenance["vLLM"] == "0.32.0"
    assert provenance["git commit"] == "abc123def456"
    assert provenance["cells started"] == "2026-11-29T11:11:00+00:00 to 2026-11-29T11:26:00+00:00"
    assert provenance["schema version"] == "1"


def test_command_reconstructed_from_config_json_without_multirun_yaml(grid_page: tuple[str, Page]) -> None:
    _, page = grid_page
    assert (
        "python -m specbench -m model=smollm2-135m method=draft_model,ngram num_speculative_tokens=2,4 "
        "batch_size=1,4,16 workload=creative,summarize workload.num_prompts=4 workload.max_tokens=64 "
        "repetitions=2 engine_runs=1 seed=0 sweep_name=demo"
    ) in page.text("provenance")
    assert "Reconstructed from the cells' config_json" in page.text("provenance")


def test_command_from_multirun_yaml(tmp_path: Path) -> None:
    saved = {
        "hydra": {
            "overrides": {"task": ["sweep=cpu_demo", "workload.max_tokens=16", "model.path=a b"]},
            "sweeper": {"params": {"method": "ngram,draft_model", "batch_size": "1,4"}},
        }
    }
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump(saved))
    _, page = render(tmp_path, grid_rows()[:8])
    provenance = page.text("provenance")
    assert "python -m specbench -m sweep=cpu_demo workload.max_tokens=16 'model.path=a b'" in provenance
    assert "Read from multirun.yaml (hydra.overrides.task)." in provenance
    assert "method: ngram,draft_model" in provenance and "batch_size: 1,4" in provenance


def test_command_of_a_single_run(tmp_path: Path) -> None:
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["method=ngram", "batch_size=4"]))
    _, page = render(tmp_path, [make_row("baseline"), make_row("ngram", 2)])
    assert "python -m specbench method=ngram batch_size=4" in page.text("provenance")
    assert "a single run, one cell and its baseline" in page.text("provenance")


def test_verdict_warns_when_the_interval_includes_one(tmp_path: Path) -> None:
    rows = [make_row("baseline"), make_row("ngram", 2, speedup=1.05, speedup_ci_low=0.9, speedup_ci_high=1.2)]
    _, page = render(tmp_path, rows)
    assert (
        "summarize: nothing is shown to pay at batch 1: the fastest, ngram K=2 (1.05×), has CI [0.90, 1.20], "
        "which includes 1×"
    ) in page.text("summary")


# --- escaping -------------------------------------------------------------------------------------


def test_data_and_errors_are_escaped(tmp_path: Path) -> None:
    rows = [
        make_row("baseline", workload=XSS),
        make_row("ngram", 2, workload=XSS, speedup=1.4, prompt_ids=[XSS]),
        make_row("ngram", 4, workload=XSS, speedup=None, status="failed", error=f"engine died: {XSS}"),
    ]
    text, page = render(tmp_path, rows)
    assert "<script>alert" not in text
    assert html.escape(XSS) in text
    assert f"engine died: {XSS}" in page.text("failed")
    assert f"{XSS}: ngram K=2 pays" in page.text("summary")


# --- partial sweeps -----------------------------------------------------------------------------------


def without_baselines() -> list[dict[str, Any]]:
    return [
        make_row(
            "ngram", k, b, speedup=None,
            error=f"no successful baseline measurement: baseline-k0-b{b}-summarize-r0",
        )
        for k in (2, 4)
        for b in (1, 4)
    ]


PARTIAL_CASES: dict[str, tuple[list[dict[str, Any]], list[str]]] = {
    "missing baselines": (
        without_baselines(),
        [
            "No baseline measured: speedups unavailable.",
            "No speedups to plot: no speculative cell was compared with a baseline.",
            "No speedups to map",
            "Exactness unknown: no speculative cell was compared",
            "no successful baseline measurement: baseline-k0-b1-summarize-r0",
        ],
    ),
    "one method, one batch size": (
        [make_row("baseline"), make_row("ngram", 2, speedup=1.3), make_row("ngram", 4, speedup=1.6)],
        ["Only batch size 1 was compared: break-even batch sizes cannot be interpolated.",
         "summarize: ngram K=4 pays at batch 1, the only batch size measured (1.60×, CI [1.44, 1.76])"],
    ),
    "failed cells": (
        [make_row("baseline"), make_row("ngram", 2, speedup=1.3),
         make_row("ngram", 4, speedup=None, status="failed", error="CUDA out of memory")],
        ["Failed 1", "CUDA out of memory"],
    ),
    "all cells failed": (
        # As the merge writes unreadable cell files: no method, K, batch size or workload.
        [
            {"cell_id": f"cell-{i}", "status": "failed", "error": "not a readable Parquet file"}
            for i in range(3)
        ],
        ["Every cell failed: nothing was measured", "No acceptance lengths to plot",
         "No time-per-output-token figures", "Failed 3", "not a readable Parquet file"],
    ),
    "missing model columns": (
        [make_row("baseline"), make_row("ngram", 2)],
        ["No model columns (predicted_speedup)", "n/a: no model columns",
         "The model's predicted curve is not drawn"],
    ),
    "empty acceptance lists": (
        [
            make_row("baseline"),
            make_row("ngram", 2) | {"acceptance_rate_per_pos": [], "alpha": None, "drafts": 0},
        ],
        ["No per-position acceptance rates to plot", "summarize, ngram: no fitted α, so no E(α, K) line."],
    ),
    "null latencies": (
        [make_row(m, 2, tpot_s_p50=None, tpot_s_p90=None,
                  latency_note="the engine reported no per-request metrics") for m in ("baseline", "ngram")],
        ["No time-per-output-token figures: no cell recorded per-request latencies "
         "(the engine reported no per-request metrics)."],
    ),
    "no cells": ([], ["The results file holds no cells: nothing was measured.", "Cells 0"]),
}


@pytest.mark.parametrize("case", PARTIAL_CASES)
def test_partial_sweeps_render_and_say_what_is_missing(tmp_path: Path, case: str) -> None:
    rows, sentences = PARTIAL_CASES[case]
    text, page = render(tmp_path, rows)
    flat = " ".join(" ".join(page.sections.values()).split())
    for sentence in sentences:
        assert sentence in flat, sentence
    assert "could not be drawn" not in flat
    # Every figure section shows an image or a sentence saying why not.
    for section in PLOT_SECTIONS:
        assert section in page.sections
        assert f'id="img-{section}"' in text or "No " in page.text(section)


def test_an_older_file_reads_exact_match_as_before(tmp_path: Path) -> None:
    # Schema 6 and older: no exactness column, so exact_match False is a mismatch, counted in mismatched_requests;
    # no attempts, caveats or raw counters either, and the page still renders whole.
    rows = [
        make_row("baseline"), make_row("baseline", batch=4),
        make_row("ngram", 2, speedup=1.3, exact_match=False, mismatched_requests=2),
        make_row("ngram", 4, speedup=1.5),
        make_row("ngram", 2, batch=4, speedup=1.1, exact_match=None, mismatched_requests=None),
    ]
    _, page = render(tmp_path, rows, drop=SCHEMA_7)
    exactness = page.tables["exactness"]
    assert ["summarize", "ngram K=2", "1", "mismatch", "2 / 0 / 2", "positions not recorded",
            "ngram-k2-b1-summarize-r0"] in exactness
    assert [
        "summarize", "ngram K=2", "4", "output tokens of the cell or its baseline were not found",
        "ngram-k2-b4-summarize-r0",
    ] in exactness
    text = page.text("exactness")
    assert "All speculative outputs matched" not in text
    assert "1 speculative cell(s) produced output that differs from the baseline" in text
    assert "2 cell(s) compared: 1 token for token, 0 differing only at numerical ties, 1 with mismatches" in text
    assert "not batch-invariant" not in text  # no ties, no control: nothing to explain
    summary = page.text("summary")
    assert "1.50× (CI [1.35, 1.65]) with ngram K=4" in summary
    assert "1 cell(s) left out: 1 with mismatched outputs" in summary


def test_model_columns_and_flags_are_used_when_present(tmp_path: Path) -> None:
    rows = [make_row("baseline", batch=b) for b in (1, 4)]
    rows += [
        make_row("ngram", 2, 1, speedup=1.5),
        make_row("ngram", 2, 4, speedup=0.9, flagged=True, flag_reasons=["engine runs disagree: 0.70x, 1.10x"]),
    ]
    for row, predicted in zip(rows, [1.0, 1.0, 1.6, 1.2]):  # never below 1: the model says it always pays
        row["predicted_speedup"] = predicted
    text, page = render(tmp_path, rows)
    row = next(r for r in page.tables["break-even"] if r[1] == "ngram K=2")
    # Measured: 1.5 at 1, then batch 4 is flagged: not judged, so no crossing is sought past batch 1 (it was
    # interpolated through the flagged 0.9x before). Predicted: never below 1 through batch 4.
    assert row[3:] == ["not reached: ≥1× through batch 1; batch 4 not judged (flagged: engine runs disagree: "
                       "0.70x, 1.10x)", "not reached: ≥1× through batch 4"]
    assert "No model columns" not in text
    assert "The model's predicted curve is not drawn" not in text
    assert [
        "summarize", "ngram K=2", "4", "engine runs disagree: 0.70x, 1.10x (speedup 0.90×, CI [0.81, 0.99])",
        "ngram-k2-b4-summarize-r0",
    ] in page.tables["flagged"]


def test_a_file_without_flags_has_no_flagged_section(tmp_path: Path) -> None:
    _, page = render(tmp_path, [make_row("baseline"), make_row("ngram", 2)], drop=["flagged", "flag_reasons"])
    assert "flagged" not in page.sections
    assert "Columns missing from this results file" in page.text("summary")


def test_heatmap_names_the_smallest_batch_when_batch_one_is_absent(tmp_path: Path) -> None:
    rows = [make_row("baseline", batch=4), make_row("ngram", 2, batch=4, speedup=1.2)]
    _, page = render(tmp_path, rows)
    assert "Batch 1 was not measured; batch 4, the smallest compared, is shown." in page.text("heatmap")
    assert "summarize, ngram K=2: batch 1 not measured; batch 4 shown." in page.text("per-position")


# --- entry points -----------------------------------------------------------------------------------------


def test_write_report_accepts_a_file_and_an_output_path(tmp_path: Path) -> None:
    results = write_results(tmp_path, [make_row("baseline"), make_row("ngram", 2)])
    assert write_report(results) == tmp_path / "report.html"
    out = write_report(tmp_path, tmp_path / "elsewhere" / "page.html")
    assert out.read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(FileNotFoundError, match="no results file"):
        write_report(tmp_path / "nowhere")


def test_cli_writes_report_beside_results_and_prints_its_path(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    write_results(tmp_path, [make_row("baseline"), make_row("ngram", 2)])
    done = subprocess.run(
        [sys.executable, "-m", "specbench.report", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )
    assert done.stdout.strip() == str(tmp_path / "report.html")
    assert (tmp_path / "report.html").is_file()
    assert "vllm" not in done.stderr.lower()
    # The refusal's exit status as a shell sees it is tested in a process of its own (test_cli_errors.py);
    # its words need no second interpreter.
    from specbench.report.__main__ import main

    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no results file" in capsys.readouterr().err


def test_report_never_imports_vllm() -> None:
    code = (
        "import sys, specbench.report\n"
        "assert not any(m.split('.')[0] in ('vllm', 'torch') for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


# --- the sweep hook ---------------------------------------------------------------------------------------


def sweep_dir_with_cells(root: Path, spec_error: str | None = None) -> Path:
    """A sweep directory holding a plan and cell files for one baseline and one ngram cell."""
    cells = root / "cells"
    # Cell files carry no comparison columns: the merge computes them.
    uncompared = dict.fromkeys(
        ("speedup", "speedup_ci_low", "speedup_ci_high", "decode_speedup", "exact_match",
         "mismatched_requests")
    )
    base = make_row("baseline", engine_run=0, config_hash="b") | uncompared
    spec = make_row("ngram", 2, speedup=1.5, engine_run=0, config_hash="s") | uncompared
    if spec_error:
        spec |= {"status": "failed", "error": spec_error}
    for row in (base, spec):
        CellFiles(cells, row["cell_id"]).write(row, [[1, 2, 3]], ["p0"])
    plan = [{"cell_id": r["cell_id"], "overrides": []} for r in (base, spec)]
    (root / "plan.json").write_text(json.dumps(plan))
    return root


def test_finish_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specbench.sweep import finish

    rows = finish(sweep_dir_with_cells(tmp_path))
    assert len(rows) == 2
    out = capsys.readouterr().out
    assert f"report: {tmp_path / 'report.html'}" in out
    page = Page((tmp_path / "report.html").read_text())
    assert "Cells 2" in page.text("summary")
    # The sweep ends with the page's verdict, in the terminal.
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert verdict.startswith("verdict: summarize: ngram K=2") and verdict.removeprefix("verdict: ") in page.text(
        "summary")
    speedup = float(page.tables["best"][1][3].rstrip("×"))
    assert math.isclose(speedup, 1.5, rel_tol=0.01)


def test_a_broken_report_loses_neither_results_nor_the_failed_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import specbench.report
    from specbench.sweep import finish

    def broken(results: Path | str, out: Path | None = None) -> Path:
        raise RuntimeError("template exploded")

    monkeypatch.setattr(specbench.report, "write_report", broken)
    with pytest.raises(SystemExit, match="1 of 2 cells failed"):
        finish(sweep_dir_with_cells(tmp_path, spec_error="engine died"))
    assert (tmp_path / "results.parquet").is_file()
    assert not (tmp_path / "report.html").exists()
    assert "could not write the report" in caplog.text and "template exploded" in caplog.text


# --- one rule per decision: what the page names is what the CLIs name ----------------------------------


def test_best_configuration_and_verdict_skip_inexact_and_flagged_cells(tmp_path: Path) -> None:
    rows = [
        make_row("baseline"),
        make_row("ngram", 4, speedup=3.0, exact_match=False, exactness="mismatch", differing_requests=2,
                 mismatched_requests=2),
        make_row("ngram", 8, speedup=2.5, flagged=True,
                 flag_reasons=["other processes kept 39% of the cores busy after 3 attempts"]),
        make_row("ngram", 2, speedup=1.5),
    ]
    _, page = render(tmp_path, rows)
    summary = page.text("summary")
    assert "1.50× (CI [1.35, 1.65]) with ngram K=2 at batch 1 on summarize" in summary
    assert "3.00×" not in summary and "2.50×" not in summary
    assert "summarize: ngram K=2 pays at batch 1" in summary
    assert "(2 cell(s) left out: 1 with mismatched outputs, 1 flagged)" in summary
    # The best configuration was chosen without the two cells left out, and says so.
    assert ["summarize", "1", "ngram K=2", "1.50×", "[1.35, 1.65]", "–", "1.50×",
            "chosen without ngram K=4 (not judged: outputs mismatch the baseline's); ngram K=8 (not judged: flagged: "
            "other processes kept 39% of the cores busy after 3 attempts)"] in page.tables["best"]
    # The terminal's closing lines say the same, and how to measure the flagged cells again.
    from specbench.report import verdict_lines

    lines = verdict_lines(tmp_path)
    assert lines[0] == ("verdict: summarize: ngram K=2 pays at batch 1, the only batch size measured (1.50×, "
                        "CI [1.35, 1.65]) (2 cell(s) left out: 1 with mismatched outputs, 1 flagged)")
    assert lines[0].removeprefix("verdict: ") in summary
    assert lines[1].startswith("1 cell(s) flagged and left out of the verdicts (the report says why); "
                               "to measure them again: python -m specbench")
    assert lines[1].endswith("remeasure=flagged") and len(lines) == 2


def test_page_and_cli_choose_k_by_the_same_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # K=4 is faster on its point estimate but its interval reaches below 1x;
    # K=2 clearly beats plain decoding. The schedule, the best-configuration
    # table and `python -m specbench.analytic.recommend` all pick K=2.
    from specbench.analytic import recommend

    rows = [
        make_row("baseline"),
        make_row("ngram", 4, speedup=1.3, speedup_ci_low=0.95, speedup_ci_high=1.7),
        make_row("ngram", 2, speedup=1.2, speedup_ci_low=1.1, speedup_ci_high=1.3),
    ]
    text, page = render(tmp_path, rows)
    assert ["summarize", "1", "ngram K=2", "1.20×", "[1.10, 1.30]", "–", "1.20×", ""] in page.tables["best"]
    assert "Best K by batch size: 1 → 2" in page.text("schedule")
    assert recommend.main([str(tmp_path)]) == 0
    assert "batch    1: K=2 (1.20x)" in capsys.readouterr().out


def test_page_and_prediction_cli_share_the_break_even_curves(tmp_path: Path) -> None:
    # Two engine settings of one method and K are two curves (one crossing each), as the CLI has them.
    from specbench.analytic import prediction
    from specbench.results.schema import read_rows

    rows = [make_row("baseline", batch=b) for b in (1, 4)]
    for budget, speedups in ((None, (1.5, 0.9)), (1000, (1.2, 0.8))):
        for batch, speedup in zip((1, 4), speedups):
            row = make_row("ngram", 2, batch, speedup=speedup)
            cfg = json.loads(row["config_json"]) | {"engine": {"max_num_batched_tokens": budget}}
            rows.append(row | {"config_json": json.dumps(cfg), "cell_id": f"{row['cell_id']}-{budget}"})
    _, page = render(tmp_path, rows)
    shown = sorted(r[3] for r in page.tables["break-even"][1:])
    from_cli = sorted(f"{c['measured']:.1f}" for c in prediction.break_even(read_rows(tmp_path / "results.parquet")))
    assert len(shown) == 2 and [s.split(" ")[0] for s in shown] == from_cli


def test_a_cell_without_an_interval_says_so(tmp_path: Path) -> None:
    # One engine run of one repetition: no interval, never a zero-width one shown as if it were precise.
    rows = [make_row("baseline", speedup_ci_low=None, speedup_ci_high=None),
            make_row("ngram", 2, speedup=1.4, speedup_ci_low=None, speedup_ci_high=None)]
    _, page = render(tmp_path, rows)
    summary = page.text("summary")
    assert "1.40× (no interval) with ngram K=2 at batch 1" in summary
    assert "no interval (one engine run of one repetition)" in summary


# --- verdicts with ties, caveats, re-measured and flagged cells (schema 7) -------------------------------


def _tied(k: int, speedup: float, low: float, high: float, **overrides: Any) -> dict[str, Any]:
    """A bf16 ngram cell of 8 requests whose outputs leave the baseline's at two numerical ties."""
    return make_row(
        "ngram", k, speedup=speedup, speedup_ci_low=low, speedup_ci_high=high, num_requests=8, dtype="bfloat16",
        exact_match=False, exactness="ties", differing_requests=2, tie_requests=2, mismatched_requests=0,
        divergences=[{"request": 1, "position": 51, "kind": "tie", "margin": 0.004},
                     {"request": 3, "position": 26, "kind": "tie", "margin": 0.011}],
        tie_tolerance=0.0625, caveats=["2 of 8 requests diverge from the baseline at numerical ties"],
        **overrides,
    )


def test_a_ties_only_cell_is_judged_and_named_best_with_its_caveat(tmp_path: Path) -> None:
    rows = [
        make_row("baseline", num_requests=8, dtype="bfloat16"),
        # The control: plain decoding at batch 8 against plain decoding at batch 1.
        make_row("baseline", batch=8, num_requests=8, dtype="bfloat16", exact_match=False, exactness="ties",
                 differing_requests=2, tie_requests=2, mismatched_requests=0, tie_tolerance=0.0625,
                 exactness_reference="baseline-k0-b1-summarize-r0",
                 divergences=[{"request": 1, "position": 51, "kind": "tie", "margin": 0.004},
                              {"request": 3, "position": 26, "kind": "tie", "margin": None}]),
        _tied(4, 1.66, 1.60, 1.72),
        make_row("ngram", 2, speedup=1.4, num_requests=8, dtype="bfloat16"),
    ]
    _, page = render(tmp_path, rows)
    summary = page.text("summary")
    # The baseline at batch 8 puts batch 8 on the grid the rows imply, where no speculative cell was measured:
    # the verdict stops there rather than call batch 1 the only batch size.
    assert ("summarize: ngram K=4 pays at batch 1 (1.66×, CI [1.60, 1.72]); batch 8 not judged (not measured for "
            "this configuration); caveat: 2 of 8 requests diverge from the baseline at numerical ties") in summary
    assert "1.66× (CI [1.60, 1.72]) with ngram K=4 at batch 1 on summarize; caveat: 2 of 8" in summary
    assert "left out" not in summary
    best = page.tables["best"][1]
    assert best[2] == "ngram K=4" and best[-1] == "2 of 8 requests diverge from the baseline at numerical ties"
    assert "Best K by batch size: 1 → 4" in page.text("schedule")
    exactness = page.text("exactness")
    assert ["summarize", "ngram K=4", "1", "ties", "6 / 2 / 0",
            "request 1 at token 51 (tie, margin 0.004 nats); request 3 at token 26 (tie, margin 0.011 nats)",
            "ngram-k4-b1-summarize-r0"] in page.tables["exactness"]
    assert "2 cell(s) compared: 1 token for token, 1 differing only at numerical ties, 0 with mismatches" in exactness
    assert ("In bfloat16 plain decoding is not batch-invariant: at near-ties of the target's top two tokens, "
            "kernels of another shape break the tie differently; vLLM promises exactness only up to "
            "floating-point precision.") in exactness
    assert "0.0625 nats (bfloat16)" in exactness
    assert "this is a bug" not in exactness  # only mismatches raise the warning
    assert ("summarize: plain decoding at batch 8 disagreed with batch 1 on 2 of 8 requests (ties: 2, mismatches: 0); "
            "first divergences: request 1 at token 51 (tie, margin 0.004 nats); "
            "request 3 at token 26 (tie, margin unknown)") in exactness


def test_a_real_mismatch_is_left_out_and_warned_about(tmp_path: Path) -> None:
    mismatch = make_row(
        "ngram", 8, speedup=2.0, num_requests=8, exact_match=False, exactness="mismatch", differing_requests=2,
        tie_requests=1, mismatched_requests=1, flagged=True,
        flag_reasons=["outputs mismatch the baseline's in 1 of 8 requests beyond the tie tolerance"],
        divergences=[{"request": 0, "position": 5, "kind": "tie", "margin": 0.01},
                     {"request": 2, "position": 17, "kind": "mismatch", "margin": 2.3}],
    )
    rows = [make_row("baseline", num_requests=8), _tied(4, 1.66, 1.60, 1.72), mismatch]
    _, page = render(tmp_path, rows)
    summary = page.text("summary")
    assert "2.00×" not in summary and "with ngram K=4" in summary
    assert "(1 cell(s) left out: 1 with mismatched outputs)" in summary
    exactness = page.text("exactness")
    assert "1 speculative cell(s) produced output that differs from the baseline" in exactness
    assert "this is a bug, not a trade-off" in exactness
    assert ["summarize", "ngram K=8", "1", "mismatch", "6 / 1 / 1",
            "request 0 at token 5 (tie, margin 0.01 nats); request 2 at token 17 (mismatch, margin 2.3 nats)",
            "ngram-k8-b1-summarize-r0"] in page.tables["exactness"]


def test_a_loop_caveat_qualifies_the_verdict_without_excluding_the_cell(tmp_path: Path) -> None:
    loop = "1 of 8 outputs loops; the looping request carries 30% of the output tokens"
    rows = [make_row("baseline"), make_row("ngram", 4, speedup=1.66, speedup_ci_low=1.6, speedup_ci_high=1.72,
                                           repetitive_requests=1, caveats=[loop]),
            make_row("ngram", 2, speedup=1.3)]
    _, page = render(tmp_path, rows)
    summary = page.text("summary")
    assert ("summarize: ngram K=4 pays at batch 1, the only batch size measured (1.66×, CI [1.60, 1.72]); "
            f"caveat: {loop}") in summary
    assert "left out" not in summary and "No cell was flagged" in page.text("flagged")


def test_flagged_cells_are_named_with_the_command_that_measures_them_again(tmp_path: Path) -> None:
    saved = {"hydra": {"overrides": {"task": ["method=ngram", "num_speculative_tokens=2,4"]}}}
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump(saved))
    rows = [
        make_row("baseline", attempts=2, other_cpu_share_per_attempt=[0.31, 0.04]),
        make_row("ngram", 2, speedup=1.5),
        make_row("ngram", 4, speedup=2.2, flagged=True, attempts=3, other_cpu_share_per_attempt=[0.39, 0.41, 0.35],
                 flag_reasons=["other processes kept 35% of the cores busy after 3 attempts"]),
    ]
    _, page = render(tmp_path, rows)
    flagged = page.text("flagged")
    assert [
        "summarize", "ngram K=4", "1",
        "other processes kept 35% of the cores busy after 3 attempts (speedup 2.20×, CI [1.98, 2.42]); "
        "3 attempts (other processes kept 39%, 41%, 35% of the cores busy; the least disturbed kept)",
        "ngram-k4-b1-summarize-r0",
    ] in page.tables["flagged"]
    assert ("python -m specbench -m method=ngram num_speculative_tokens=2,4 "
            f"hydra.sweep.dir={tmp_path} remeasure=flagged") in flagged
    assert flagged.count("remeasure=flagged") == 1
    # Every cell measured more than once is listed, flagged or not.
    assert ["summarize", "baseline", "1", "2 attempts (other processes kept 31%, 4% of the cores busy; the least "
            "disturbed kept)", "baseline-k0-b1-summarize-r0"] in page.tables["flagged"]
    assert any(r[2:4] == ["1", "3 attempts (other processes kept 39%, 41%, 35% of the cores busy; the least "
                          "disturbed kept); still flagged"] for r in page.tables["flagged"])
    assert "2.20×" not in page.text("summary")


def test_the_remeasure_command_of_a_reconstructed_sweep_pins_its_directory(tmp_path: Path) -> None:
    rows = [make_row("baseline"), make_row("ngram", 2, speedup=1.5, flagged=True, flag_reasons=["load"])]
    _, page = render(tmp_path, rows)
    assert f"sweep_name=demo hydra.sweep.dir={tmp_path} remeasure=flagged" in page.text("flagged")


def test_the_best_configuration_carries_a_simultaneous_interval(tmp_path: Path) -> None:
    from specbench.stats.distributions import student_t_quantile

    sd, dof, runs = 0.05, 4, 2

    def cell(k: int, speedup: float, **more: Any) -> dict[str, Any]:
        half = student_t_quantile(0.975, dof) * sd / math.sqrt(runs)
        return make_row("ngram", k, speedup=speedup, engine_runs=runs, speedup_log_sd=sd, speedup_df=dof,
                        speedup_ci_low=speedup * math.exp(-half), speedup_ci_high=speedup * math.exp(half), **more)

    rows = [make_row("baseline"), cell(2, 1.5), cell(4, 1.8, confirmation_speedup=1.71), cell(8, 1.6)]
    _, page = render(tmp_path, rows)
    header, best = page.tables["best"][:2]
    assert header[5] == "simultaneous CI (all cells of the workload)" and header[6] == "confirmation speedup"
    # Bonferroni over the 3 cells compared on the workload: t at 1 - 0.05 / 6.
    half = student_t_quantile(1 - 0.05 / 6, dof) * sd / math.sqrt(runs)
    low, high = 1.8 * math.exp(-half), 1.8 * math.exp(half)
    assert best[2:7] == ["ngram K=4", "1.80×", f"[{rows[2]['speedup_ci_low']:.2f}, {rows[2]['speedup_ci_high']:.2f}]",
                         f"[{low:.2f}, {high:.2f}] over 3 cells", "1.71×"]
    assert low < rows[2]["speedup_ci_low"] and high > rows[2]["speedup_ci_high"]
    assert "the winner's curse" in page.text("best")
    assert (f"1.80× (CI [{rows[2]['speedup_ci_low']:.2f}, {rows[2]['speedup_ci_high']:.2f}]; the largest of 3 "
            f"judged cells: over all 3 at once [{low:.2f}, {high:.2f}], above 1× even as the best of them) with "
            "ngram K=4") in page.text("summary")


def test_pays_up_to_follows_the_schedules_rule(tmp_path: Path) -> None:
    # Batch 4's 1.15x is above 1 on its point estimate, but its interval includes 1: neither the verdict
    # nor the schedule counts it; batch 16's interval clears 1, yet the verdict's run of batch sizes ended at 4.
    rows = [make_row("baseline", batch=b) for b in (1, 4, 16)]
    for batch, (speedup, low, high) in zip((1, 4, 16), ((1.5, 1.3, 1.7), (1.15, 0.95, 1.35), (1.1, 1.02, 1.2))):
        rows.append(make_row("ngram", 2, batch, speedup=speedup, speedup_ci_low=low, speedup_ci_high=high))
    _, page = render(tmp_path, rows)
    assert ("summarize: ngram K=2 pays at batch 1 (1.50×, CI [1.30, 1.70]), not at batch 4 (1.15×, CI [0.95, 1.35])"
            in page.text("summary"))
    assert "Best K by batch size: 1 → 2, 4 → 0, 16 → 2" in page.text("schedule")


def test_acceptance_counted_by_vllm_is_noted_where_it_differs(tmp_path: Path) -> None:
    rows = [make_row("baseline"), make_row("ngram", 4, speedup=1.5, acceptance_length=4.43, raw_acceptance_length=5.0),
            make_row("ngram", 2, speedup=1.4, raw_acceptance_length=None)]
    _, page = render(tmp_path, rows)
    notes = page.text("acceptance")
    assert ("summarize, ngram K=4, batch 1: acceptance length 4.43 on emitted tokens, "
            "5.00 by vLLM's counters (+13%)") in notes
    assert "ngram K=2, batch 1: acceptance length" not in notes


def test_a_float32_control_that_agrees_explains_no_ties(tmp_path: Path) -> None:
    rows = [
        make_row("baseline", num_requests=8), make_row("ngram", 2, speedup=1.4, num_requests=8),
        make_row("baseline", batch=8, num_requests=8, exactness="exact", differing_requests=0, tie_requests=0,
                 mismatched_requests=0, exactness_reference="baseline-k0-b1-summarize-r0"),
    ]
    _, page = render(tmp_path, rows)
    exactness = page.text("exactness")
    assert "All speculative outputs matched the baseline token for token (1 cell(s) compared)" in exactness
    assert ("summarize: plain decoding at batch 8 disagreed with batch 1 on 0 of 8 requests "
            "(ties: 0, mismatches: 0)") in exactness
    assert "not batch-invariant" not in exactness


def test_temperature_gets_its_own_panels_figure_and_verdicts(tmp_path):
    from specbench.report import plots, tables
    from rows import make_row, write_results

    def at(temperature, speedup, **extra):
        return make_row("ngram", 4, 1, "creative", speedup, temperature=temperature, speedup_ci_low=speedup - 0.05,
                        speedup_ci_high=speedup + 0.05, **extra)

    rows = [make_row("baseline", batch=1, workload="creative", temperature=t) for t in (0.0, 0.7, 1.0)]
    rows += [at(0.0, 1.4), at(0.7, 1.2), at(1.0, 0.9)]
    df, _ = tables.load_frame(write_results(tmp_path, rows))
    # Sampled rows are never pooled with greedy ones: their temperature is in the panel.
    assert sorted(df["panel"].unique()) == ["creative", "creative · T=0.7", "creative · T=1"]
    plot = plots.versus_temperature(df, plots.Encoding.for_frame(df))
    assert plot.image is not None
    assert plot.notes == ["ngram K=4 on creative at batch 1: pays up to temperature 0.7, stops paying at 1"]
    # An inexact cell is not judged.
    rows[-2] = at(0.7, 1.2, exactness="mismatch")
    df, _ = tables.load_frame(write_results(tmp_path, rows))
    assert plots.temperature_verdicts(df) == [
        "ngram K=4 on creative at batch 1: pays up to temperature 0; temperature 0.7 not judged (outputs mismatch "
        "the baseline's), 1 not claimed"]


def test_a_temperature_walk_names_a_failed_temperature_and_claims_nothing_past_a_flagged_one(tmp_path):
    from specbench.report import plots, tables
    from rows import make_row, write_results

    def at(temperature, **extra):
        row = make_row("ngram", 4, 1, "creative", 1.4, temperature=temperature, speedup_ci_low=1.3,
                       speedup_ci_high=1.5)
        return row | extra

    temperatures = (0.0, 0.5, 1.0, 1.5)
    rows = [make_row("baseline", batch=1, workload="creative", temperature=t) for t in temperatures]
    rows += [at(0.0), at(0.5, flagged=True, flag_reasons=["engine runs disagree: 1.90x, 0.80x"]), at(1.0),
             at(1.5, status="failed", error="engine died at T=1.5\ntraceback", speedup=None, speedup_ci_low=None,
                speedup_ci_high=None)]
    df, _ = tables.load_frame(write_results(tmp_path, rows))
    # Before: "pays at every temperature judged (0, 1) (not judged at 0.5: flagged or inexact)": 1 claimed past
    # the flagged 0.5, and the failed 1.5 never named.
    assert plots.temperature_verdicts(df) == [
        "ngram K=4 on creative at batch 1: pays up to temperature 0; temperature 0.5 not judged (flagged: engine "
        "runs disagree: 1.90x, 0.80x), 1, 1.5 not claimed"]
    rows[5] = at(0.5)
    df, _ = tables.load_frame(write_results(tmp_path, rows))
    assert plots.temperature_verdicts(df) == [
        "ngram K=4 on creative at batch 1: pays up to temperature 1; temperature 1.5 not judged (failed: engine "
        "died at T=1.5)"]


def test_the_spread_note_says_how_degrees_of_freedom_were_counted_and_what_each_engine_spread():
    from specbench.report import tables

    rows = [make_row(speedup_ci_method="pooled-t-log-95", speedup_df=2, speedup_log_sd=0.1,
                     baseline_engine_log_sd=0.12, speculative_engine_log_sd=0.02)]
    note = tables.spread_note(pd.DataFrame(rows))
    assert note is not None and "2.0 degrees of freedom, counted in independent engines" in note
    assert "0.120 for the baseline engine, 0.020 for a speculative one" in note
    alone = tables.spread_note(pd.DataFrame([rows[0] | {"baseline_engine_log_sd": None}]))
    assert alone is not None and "cannot be told apart" in alone
    # Results of schema 11 and older carry no split: no note rather than a guess.
    assert tables.spread_note(pd.DataFrame(rows).drop(columns=["baseline_engine_log_sd"])) is None


def test_the_statistical_checks_are_on_the_page(tmp_path: Path) -> None:
    # Issue 56: the distribution check's power beside each p-value (item 6), where the shifted-baseline test
    # could not judge a baseline (item 3), the one error budget (item 4), and output-token ratios other than 1
    # (item 5). None of them was on the page before.
    rows = [make_row("baseline", batch=b) for b in (1, 4)]
    rows += [make_row("baseline", batch=1, temperature=0.7, cell_id="baseline-k0-b1-summarize-t0.7-r0")]
    rows += [
        make_row("ngram", 2, 1, speedup=1.5, engine_runs=2, baseline_shift_checked=False),
        make_row("ngram", 2, 4, speedup=1.2, engine_runs=2, baseline_shift_checked=True),
        make_row("ngram", 2, 1, speedup=1.1, temperature=0.7, cell_id="ngram-k2-b1-summarize-t0.7-r0",
                 exactness="untested", distribution_p_value=0.42, distribution_p_adjusted=0.84,
                 distribution_power_tv=None, output_token_ratio=0.9),
    ]
    text, page = render(tmp_path, rows)
    assert ["summarize · T=0.7", "ngram K=2", "1", "0.70", "0.42", "0.84", "none up to 0.5", "untested",
            "ngram-k2-b1-summarize-t0.7-r0"] in page.tables["exactness"]
    flagged = page.text("flagged")
    assert "at most 0.05" in flagged and "0.0125" in flagged
    assert "could not judge the baselines of these cells" in flagged and "summarize: batch 1 (ngram K=2)" in flagged
    assert ["summarize · T=0.7", "ngram K=2", "1", "0.70", "0.900", "1.10×", "1.22×",
            "ngram-k2-b1-summarize-t0.7-r0"] in page.tables["cells"]


def test_cells_stored_before_schema_14_carry_a_caveat_that_their_engines_were_inferred(tmp_path, grid_page):
    # The whole grid as measured is the module's page (grid_page): one render of it serves every test.
    assert "Engine identity inferred" not in grid_page[1].text("summary")
    rows = grid_rows()
    rows[0]["engine_id"] = rows[1]["engine_id"] = None
    _, page = render(tmp_path, rows)
    assert "Engine identity inferred for 2 cell(s) stored before schema 14" in page.text("summary")
    # A results file written before the column existed: every measured cell.
    _, page = render(tmp_path, grid_rows(), drop=["engine_id"])
    assert f"Engine identity inferred for {len(rows)} cell(s)" in page.text("summary")


def test_an_interval_of_one_engine_run_says_it_leaves_out_the_engine_to_engine_spread(tmp_path):
    # One engine run of three repetitions: the merge's interval is the repetitions' alone (within-only).
    within = {"engine_runs": 1, "repetitions": 3, "speedup_ci_method": "within-only-t-95"}
    rows = [make_row("baseline"), make_row("ngram", 4, speedup=1.5, speedup_ci_low=1.45, speedup_ci_high=1.55,
                                           **within)]
    _, page = render(tmp_path, rows)
    summary = page.text("summary")
    # Before: "pays at batch 1, the only batch size measured (1.50×, CI [1.45, 1.55])", read as the speedup's whole
    # uncertainty.
    assert ("ngram K=4 pays at batch 1, the only batch size measured (1.50×, within-engine CI [1.45, 1.55], one "
            "engine run: it leaves out the engine-to-engine spread)") in summary
    assert page.tables["best"][1][-1] == "within-engine CI, one engine run: it leaves out the engine-to-engine spread"
    # A pooled interval over engine runs reads as before.
    rows[1] |= {"engine_runs": 3, "speedup_ci_method": "pooled-t-log-95"}
    _, page = render(tmp_path, rows)
    assert "(1.50×, CI [1.45, 1.55])" in page.text("summary") and "within-engine" not in page.text("summary")


def test_the_schedules_panel_names_a_sampled_familys_temperature(tmp_path):
    from specbench.report import tables

    rows = [make_row("baseline", batch=b, temperature=t, cell_id=f"baseline-b{b}-t{t}") for b in (1, 4)
            for t in (0.0, 0.7)]
    for t, speedups in ((0.0, (1.5, 1.3)), (0.7, (1.2, 0.9))):
        for batch, speedup in zip((1, 4), speedups):
            row = make_row("ngram", 2, batch, speedup=speedup, temperature=t, cell_id=f"ngram-b{batch}-t{t}")
            cfg = json.loads(row["config_json"]) | {"temperature": t}
            rows.append(row | {"config_json": json.dumps(cfg)})
    df, _ = tables.load_frame(write_results(tmp_path, rows))
    # Before: two schedules both "ngram on summarize", the greedy one and the sampled one told apart by nothing.
    assert {s.panel: s.best_k for s in tables.schedules(df)} == {
        "summarize": {1: 2, 4: 2}, "summarize · T=0.7": {1: 2, 4: 0}}
    _, page = render(tmp_path, rows)
    assert "ngram on summarize · T=0.7" in page.text("schedule")


def test_a_predicted_break_even_comes_without_the_measured_bracket(tmp_path):
    from specbench.report import tables

    rows = [make_row("baseline", batch=b) for b in (1, 4, 16)]
    for batch, speedup, predicted in ((1, 1.5, 1.6), (4, 1.2, 1.2), (16, 0.8, 0.8)):
        rows.append(make_row("ngram", 2, batch, speedup=speedup, predicted_speedup=predicted))
    df, _ = tables.load_frame(write_results(tmp_path, rows))
    (curve,) = tables.break_even(df)
    # The model's crossing is a point of the model: the intervals' bracket belongs to the measured one alone.
    assert curve.predicted == "8.0"
    assert curve.measured == "8.0 (by the intervals: between batch 4, shown to pay, and 16, shown below 1×)"
