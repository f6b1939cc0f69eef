"""Serving through the real async engine: arrivals, figures, the running batch and exactness; request shapes.

A serving sweep: two summarize prompts (prompt lookup finds drafts there), six requests of 16 tokens at 4 req/s,
the first left out as warm-up; baseline and ngram K=2 at the same offered load; the prefix cache prefills each
prompt once. Measured, merged and reported in the test's process as a multirun would (conftest.run_here); the
cells' lines are what the terminal would show.

Request shapes: one baseline serving cell, six requests at 4 req/s (one warm-up), outputs drawn around 8 tokens and
prompts cut to lengths drawn around 64, EOS ignored so that every request decodes exactly its drawn length.

The server against the in-process engine: the serving sweep's ngram cell served both ways, greedy, its token ids
and each request's acceptance held alike.

All three measure on one pool of engines (``engines``), request shapes first: its baseline's engine is the
serving sweep's baseline's (the same engine settings), so the serving sweep starts one engine, not two; and the
sweep's ngram engine serves the in-process side of the server test, which starts only the server's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest
from conftest import run_here

from specbench import job, load
from specbench.config import cell_from_config
from specbench.engine import EnginePool
from specbench.results import serving

pytestmark = pytest.mark.engine

# The engine settings both grids share: a serving engine of the embedded target with the prefix cache, serving up to
# six requests at once.
SERVING_ENGINE = ["workload=summarize", "workload.num_prompts=2", "workload.selection=first",
                  "workload.max_prompt_tokens=480", "workload.max_tokens=16", "load.request_rate=4",
                  "load.num_requests=6", "load.warmup_requests=1", "engine_runs=1", "attempts=1",
                  "engine.enable_prefix_caching=true"]
# The serving sweep's ngram cell, as the server test composes it both ways: with conftest.HERE's start environment
# (no huge pages), so that its in-process engine is the one the sweep left up, and its server's worker forks from
# this session's fork server (another start environment would spawn it, importing vLLM again).
GREEDY_SERVED = ["method=ngram", "num_speculative_tokens=2", *SERVING_ENGINE, "engine.cpu_huge_pages=false"]


@pytest.fixture(scope="module")
def engines() -> Iterator[EnginePool]:
    """The engines of this module's grids: the last one stays up for the next grid that shares it."""
    pool = EnginePool()
    try:
        yield pool
    finally:
        pool.discard()


def test_each_request_decodes_its_drawn_output_length_from_a_prompt_of_its_drawn_length(
        tmp_path: Path, engines: EnginePool) -> None:
    # The one cell, measured in this process (conftest.run_here): nothing here reads a merge or a report.
    ran = run_here(
        ["method=baseline", *SERVING_ENGINE, "load.output_len=8", "load.input_len=64", "load.range_ratio=0.5",
         "load.ignore_eos=true"], tmp_path, finish=False, pool=engines,
    )
    [row] = [r for _, r in ran.results.iterrows()]
    assert "-rate4-in64-out8-rr0.5-" in row["cell_id"]
    seed = int(row["seed"])
    outputs = load.drawn_lengths(8, 0.5, 6, load.shape_seed("outputs", seed, 0))
    inputs = load.drawn_lengths(64, 0.5, 6, load.shape_seed("inputs", seed, 0))
    assert len(set(outputs)) > 1  # the draw spreads them, so the check below tells requests apart
    # Every request sent, warm-up included, decoded exactly the max_tokens drawn for it (EOS ignored).
    assert list(row["output_tokens_per_request"]) == list(outputs)
    # The measured prompts were cut to their drawn lengths (each summarize prompt is longer than 96 tokens).
    assert row["prompt_tokens"] == sum(inputs[1:])


def test_a_serving_sweep_records_latencies_the_running_batch_and_exact_outputs(
        tmp_path: Path, engines: EnginePool) -> None:
    starts = engines.engine_starts
    done = run_here(["method=ngram", "num_speculative_tokens=2", *SERVING_ENGINE, "load.slo.ttft_ms=60000"], tmp_path,
                    pool=engines).done
    # The baseline was served by the engine the request-shapes cell left up (alone, this test starts two).
    assert engines.engine_starts - starts == (1 if starts else 2)
    rows = pd.read_parquet(tmp_path / "results.parquet").set_index("method")
    assert set(rows.index) == {"baseline", "ngram"}
    for method in ("baseline", "ngram"):
        row = rows.loc[method]
        assert "-rate4-" in row["cell_id"]
        assert row["load_request_rate"] == 4.0
        assert row["served_requests"] == 5  # six sent, the warm-up left out
        assert 0 < row["ttft_s_p50"] <= row["e2e_s_p50"]
        assert 0 < row["tpot_s_p50"] < row["e2e_s_p50"]
        assert row["itl_s_p50"] > 0 and row["queue_s_p50"] >= 0
        # Over the send span, a run whose engine fell behind (a busy machine) may complete nothing in it.
        assert row["achieved_request_rate"] > 0 or row["saturated"]
        assert row["achieved_output_tokens_per_s"] >= 0
        assert row["offered_rate_realised"] > 0 and row["engine_usage_context"] == "OPENAI_API_SERVER"
        assert row["saturated"] in (True, False) and len(row["arrival_seeds"]) == 1
        # Every measured request met the generous TTFT target: goodput is the achieved rate.
        assert row["slo_attainment"] == 1.0
        assert row["goodput"] == pytest.approx(row["achieved_request_rate"])
        assert row["running_batch_max"] >= 1 and row["running_batch_mean"] > 0
        # The client's queue: no cap, so each request goes out on time (the event loop's lateness aside),
        # and E2E from the arrival is E2E from the send plus that wait.
        assert 0 <= row["wait_to_send_s_p50"] <= row["wait_to_send_s_p90"] < 0.5
        assert row["e2e_from_arrival_s_p50"] >= row["e2e_s_p50"] - 1e-9
        assert len(row["running_batch"]) == len(row["running_batch_t_s"]) > 0
    ngram = rows.loc["ngram"]
    assert ngram["baseline_cell_id"] == rows.loc["baseline", "cell_id"]
    assert ngram["drafts"] > 0 and ngram["acceptance_length"] > 1.0
    for name in ("tpot_p50", "e2e_p50", "e2e_p90"):
        assert ngram[f"serving_speedup_{name}"] > 0
    # Greedy outputs under load are the baseline's, request for request (warm-up included).
    assert ngram["exactness"] in ("exact", "ties"), ngram["divergences"]
    report = (tmp_path / "report.html").read_text()
    assert 'id="serving"' in report and "img-serving-batch" in report
    # The terminal names a serving cell by its offered rate and gives the speedup the verdict reads.
    ngram_line = next(line for line in done.stdout.splitlines() if line.startswith("ngram K=2 at 4 req/s summarize"))
    assert "E2E p50 " in ngram_line and ngram_line.endswith(("exact", "tie(s)")), ngram_line


def test_a_greedy_cell_gives_the_same_tokens_and_per_request_acceptance_in_process_and_through_the_server(
        compose_cell, engines: EnginePool) -> None:
    # Six requests of 16 tokens, one of them warm-up, each with a prompt of its own: the warm-up's prompt
    # is not among the measured ones (at 913428f the warm-ups repeated the measured prompts, so an
    # agreement of the two paths proved nothing). In process first, on the engine the serving sweep left up.
    tokens, acceptance, counts, columns = {}, {}, {}, {}
    for via in ("inprocess", "server"):
        cell = cell_from_config(compose_cell([*GREEDY_SERVED, f"load.via={via}"]))
        _, plan = job._requests(cell)
        assert len(set(plan.prompts)) == 6 and not set(plan.prompts[:1]) & set(plan.prompts[1:])
        try:
            served = engines.get(cell.engine_spec()).measure(plan, timeout_s=900)
        except BaseException:
            engines.discard()  # a failed engine's state is suspect
            raise
        assert all(r.chunk_s and len(r.token_ids) == 16 for r in served.requests)
        tokens[via] = [r.token_ids for r in served.requests]
        acceptance[via] = serving.as_measurement(served, plan).request_acceptance
        counts[via] = [(r.drafts, r.accepted_tokens, r.draft_tokens) for r in served.requests[1:]]
        columns[via] = serving.cell_columns(served, cell.identity["load"], plan)
        print(f"{via}: acceptance per measured request {acceptance[via]}, (drafts, accepted, drafted) {counts[via]}, "
              f"/metrics {columns[via]['server_metrics_acceptance']}, queue p50 {columns[via]['queue_s_p50']}")
    assert tokens["server"] == tokens["inprocess"]
    # Greedy: each measured request drafts and accepts the same both ways, read from its own counts.
    assert counts["server"] == counts["inprocess"] and all(d for d, _, _ in counts["server"])
    assert acceptance["server"] == acceptance["inprocess"]
    # The server's /metrics over the measured requests alone agree with their usage chunks.
    assert columns["server"]["server_metrics_acceptance"] is not None
    assert columns["server"]["server_metrics_note"] is None
    assert columns["inprocess"]["server_metrics_acceptance"] is None
    # Each request's queueing delay reaches the client through the server too.
    assert columns["server"]["queue_s_p50"] is not None and columns["inprocess"]["queue_s_p50"] is not None
