"""Would a warm-up on short prompts leave a demo cell's timed batches as they are? Paired, on fresh engines.

Starts engines: run it alone, on a quiet machine. Prints figures; asserts nothing.

    .venv/bin/python tests/benchmarks/warmup_shape.py [METHOD] [ROUNDS] [TOKENS]

A cell's warm-up (:func:`specbench.measure.measure`) re-runs its first batch for 8 tokens: at ``sweep=cpu_demo``'s
summarize cells that re-prefills 425 tokens (batch 1) and 1855 (batch 4), 87% of an engine's warm-up prefill,
and prefill is most of a summarize cell on 2 cores. The cheaper warm-up would run the same batch shape on the
first batch's prompts cut to their last TOKENS tokens (default 16): the same decode and draft steps, ngram's
first-call numba compile, and none of the long prefill. Each arm (``full``, ``short``) gets a fresh engine of
METHOD (default ngram, K=4 as the demo's), which measures the demo's four cells in the sweep's order: the
cell's warm-up, its timed batches (TTFT, TPOT, wall), then its timed batches again, fully warm. A warm-up
that leaves nothing behind gives a first/again ratio of 1 up to noise; the short arm's ratios against the
full arm's, engine by engine (arms alternate over ROUNDS, default 2: full, short, short, full, ...), say
what the short warm-up leaves in the timed cell.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_module

from specbench.config import cell_from_config
from specbench.engine import EngineWorker
from specbench.job import _requests
from specbench.measure import WARMUP_MAX_TOKENS, CellPlan, Measurement

CELLS = (("summarize", 1), ("summarize", 4), ("creative", 1), ("creative", 4))


def _ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1e3 if values else math.nan


def warmup(plan: CellPlan, tokens: int | None) -> CellPlan:
    """The untimed pass before a cell: its first batch, whole or cut to its last ``tokens`` tokens."""
    first = plan.batches()[0]
    prompts = first if tokens is None else tuple(p[-tokens:] for p in first)
    return CellPlan(prompts=prompts, batch_size=plan.batch_size, max_tokens=min(plan.max_tokens, WARMUP_MAX_TOKENS),
                    repetitions=1, warmup=False, sampling=plan.sampling, seed=plan.seed)


def arm(method: str, tokens: int | None, log: Path) -> list[tuple[str, float, Measurement, Measurement]]:
    """One fresh engine: per demo cell, its warm-up's seconds, its timed batches after it and again."""
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        cells = [cell_from_config(compose(config_name="config", overrides=[
            "sweep=cpu_demo", f"method={method}", f"workload={w}", f"batch_size={b}"])) for w, b in CELLS]
    worker = EngineWorker(cells[0].engine_spec(), log_path=log)
    out = []
    try:
        for (workload, batch), cell in zip(CELLS, cells):
            plan = dataclasses.replace(_requests(cell)[1], warmup=False)
            start = time.perf_counter()
            worker.measure(warmup(plan, tokens))
            warm_s = time.perf_counter() - start
            out.append((f"{workload} b{batch}", warm_s, worker.measure(plan), worker.measure(plan)))
    finally:
        worker.close()
    return out


def main(argv: Sequence[str]) -> None:
    method = argv[0] if argv else "ngram"
    rounds = int(argv[1]) if len(argv) > 1 else 2
    tokens = int(argv[2]) if len(argv) > 2 else 16
    log = Path("outputs/warmup_shape.log").resolve()
    print(f"{method} K=4, warm-ups whole or cut to {tokens} tokens; engine log {log}")
    pair: list[tuple[str, int | None]] = [("full", None), ("short", tokens)]
    for name, cut in (a for i in range(rounds) for a in (pair if i % 2 == 0 else pair[::-1])):
        for label, warm_s, first, again in arm(method, cut, log):
            ratio = sum(first.rep_wall_s) / sum(again.rep_wall_s)
            print(f"  {name:<5} {label:<12} warm-up {warm_s:5.2f} s   after it: wall {sum(first.rep_wall_s):5.2f} s, "
                  f"TTFT {_ms(first.ttft_s):6.1f} ms, TPOT {_ms(first.tpot_s):5.1f} ms   again: wall "
                  f"{sum(again.rep_wall_s):5.2f} s, TTFT {_ms(again.ttft_s):6.1f} ms, TPOT {_ms(again.tpot_s):5.1f} ms"
                  f"   first/again {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
