"""One serving cell measured in process and through ``vllm serve`` (``load.via``), in alternated pairs.

Each pair serves the same schedule (its engine run's arrival seed) on a fresh engine each way, the
order alternating from pair to pair so that a drift of the machine falls on both sides. Prints each
run's TTFT, TPOT and E2E p50 and p90, the engine's start time, acceptance and the share of the cores
other processes took, then the medians over the undisturbed pairs and the gap in percent (server over
in-process).

    .venv/bin/python tests/benchmarks/serving_via_server.py [--pairs 3] [overrides ...]

The default cell is the serving_cpu preset's ngram K=4 on summarize at 1 req/s, with 16 requests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from hydra import compose, initialize_config_module

from specbench import job
from specbench.config import cell_from_config
from specbench.engine import EngineWorker
from specbench.results import serving
from specbench.results.merge import DISTURBED_SHARE
from specbench.results.provenance import CpuTimes
from specbench.stats import timings

CELL = [
    "method=ngram", "num_speculative_tokens=4", "workload=summarize", "workload.num_prompts=2",
    "workload.selection=first", "workload.max_tokens=32", "workload.max_prompt_tokens=512",
    "load.request_rate=1", "load.num_requests=16", "load.warmup_requests=2", "load.cycle_prompts=true",
    "load.slo.ttft_ms=2000", "load.slo.tpot_ms=100", "engine.max_num_seqs=128", "engine.enable_prefix_caching=true",
]
FIGURES = ("ttft_s_p50", "ttft_s_p90", "tpot_s_p50", "tpot_s_p90", "e2e_s_p50", "e2e_s_p90")


def run(overrides: list[str], via: str, engine_run: int) -> dict[str, Any]:
    """Serve the cell once on a fresh engine; its figures."""
    with initialize_config_module("specbench.conf", version_base="1.3"):
        cfg = compose("config", overrides=[*overrides, f"load.via={via}", f"engine_run={engine_run}"])
    cell = cell_from_config(cfg)
    _, plan = job._requests(cell)
    worker = EngineWorker(cell.engine_spec())
    try:
        before = CpuTimes.now(worker.pid)
        served = worker.measure(plan, timeout_s=900)
        other = before.other_share(CpuTimes.now(worker.pid))
    finally:
        worker.close()
    measured = serving.as_measurement(served, plan)
    columns = serving.cell_columns(served, cell.identity["load"], plan)
    counters = measured.counters
    return {
        "via": via, "engine_run": engine_run, "arrival_seed": plan.arrival_seed, "start_s": worker.info.start_s,
        **timings.latency_percentiles(measured.ttft_s, "ttft_s"),
        **timings.latency_percentiles(measured.tpot_s, "tpot_s"),
        **timings.latency_percentiles(measured.e2e_s, "e2e_s"),
        "acceptance_length": 1 + counters.accepted_tokens / counters.drafts if counters.drafts else None,
        "running_batch_mean": columns["running_batch_mean"], "other_cpu_share": other,
        "token_ids": [list(t) for t in measured.token_ids],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides on top of the default cell")
    args = parser.parse_args(argv)
    runs = []
    for pair in range(args.pairs):
        order = ("inprocess", "server") if pair % 2 == 0 else ("server", "inprocess")
        for via in order:
            runs.append(run([*CELL, *args.overrides], via, pair))
            shown = {k: v for k, v in runs[-1].items() if k != "token_ids"}
            print(json.dumps(shown), flush=True)
        mine = {r["via"]: r["token_ids"] for r in runs[-2:]}
        print(f"pair {pair}: outputs {'identical' if mine['inprocess'] == mine['server'] else 'DIFFER'}", flush=True)
    # A pair either of whose runs other processes disturbed (the sweep's own threshold) is left out.
    pairs = [runs[i:i + 2] for i in range(0, len(runs), 2)]
    kept = [r for pair in pairs if all((r["other_cpu_share"] or 0) <= DISTURBED_SHARE for r in pair) for r in pair]
    print(f"\n{len(kept) // 2} of {len(pairs)} pairs undisturbed (others <= {DISTURBED_SHARE:.0%} of the cores)")
    if not kept:
        return 1
    print("\n| figure | in process | server | gap |\n|---|---:|---:|---:|")
    for name in (*FIGURES, "start_s", "acceptance_length"):
        inside = statistics.median(r[name] for r in kept if r["via"] == "inprocess")
        server = statistics.median(r[name] for r in kept if r["via"] == "server")
        scale = 1000 if name.endswith(("_p50", "_p90")) else 1
        print(f"| {name} | {inside * scale:.1f} | {server * scale:.1f} | {100 * (server / inside - 1):+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
