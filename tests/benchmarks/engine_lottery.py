"""The engine lottery: how far apart identical engines decode, and how far one engine's repetitions are.

Prints figures; asserts nothing.

    .venv/bin/python tests/benchmarks/engine_lottery.py [--engines 8] [--reps 4] [overrides...]
    .venv/bin/python tests/benchmarks/engine_lottery.py method=ngram num_speculative_tokens=4
    SPECBENCH_WORKER_START=spawn .venv/bin/python tests/benchmarks/engine_lottery.py

Starts ``--engines`` fresh engines of one cell (default: plain decoding,
batch 1, summarize, the cell's own prompts), one after another, each in its
own worker exactly as a sweep starts it, and times ``--reps`` repetitions of
the cell on each after the cell's usual warm-up. Per engine: its start time,
the output tokens per second of each repetition (what a speedup divides) and
the OpenMP runtime and allocator its process loaded. Then:

- **between engines**: the standard deviation of log tok/s across engines
  (each engine's mean over its repetitions), the spread a speedup's interval
  carries;
- **within an engine**: the pooled standard deviation of log tok/s across one
  engine's repetitions;
- the same two figures with the first repetition left out, which is what a
  longer warm-up (one more untimed pass of the cell) would give;
- the machine's drift: log tok/s against the order the engines were measured
  in, and the engines' own share with that trend removed.

Every environment knob the candidates turn (``LD_PRELOAD``,
``SPECBENCH_WORKER_START``, ``VLLM_CPU_OMP_THREADS_BIND``, ``OMP_*``,
``THP_MEM_ALLOC_ENABLE``, ``OMP_WAIT_POLICY``, ``NUMBA_*``) is read from
this process's environment and printed, so one figure is one command line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ATTEMPTS = 6  # measurements of one engine at most, while other processes disturb it
# Stricter than a sweep's 10% (results.merge.DISTURBED_SHARE): one busy thread beside the two OpenMP threads
# of a 2-core engine can halve its speed, and the spread measured here is a few percent.
QUIET_SHARE = 0.03

KNOBS = ("LD_PRELOAD", "SPECBENCH_WORKER_START", "VLLM_CPU_OMP_THREADS_BIND", "OMP_PROC_BIND", "OMP_PLACES",
         "THP_MEM_ALLOC_ENABLE", "OMP_NUM_THREADS", "OMP_WAIT_POLICY",
         "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER")


def loaded_libraries(pid: int | None) -> str:
    """The OpenMP runtimes and allocators mapped into a process (from /proc)."""
    names: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) > 5 else ""
                base = os.path.basename(path)
                if any(k in base for k in ("gomp", "iomp", "tcmalloc", "jemalloc")):
                    names.add(base)
    except OSError:
        return "?"
    return ",".join(sorted(names)) or "-"


def thread_affinities(pid: int | None) -> str:
    """Each thread's allowed CPUs, summarised: how many threads are pinned to one core."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return "?"
    masks = []
    for tid in tids:
        try:
            masks.append(",".join(str(c) for c in sorted(os.sched_getaffinity(int(tid)))))
        except OSError:
            pass
    counts: dict[str, int] = {}
    for m in masks:
        counts[m] = counts.get(m, 0) + 1
    return " ".join(f"[{m}]x{n}" for m, n in sorted(counts.items()))


def machine_probe(seconds: float = 2.0) -> tuple[float, float]:
    """The machine's own speed just before an engine starts, measured without vLLM: (GB/s, GFLOP/s).

    GB/s: summing a 256 MiB bfloat16 tensor over and over, a memory-bound stream like plain decoding's
    weight reads; GFLOP/s: 512 x 512 bfloat16 matrix products, compute-bound like a verification step.
    If engines' speeds follow these, the machine moved, not the engine.
    """
    import torch

    big = torch.ones(128 * 1024 * 1024, dtype=torch.bfloat16)
    a = torch.ones(512, 512, dtype=torch.bfloat16)
    rates = []
    for work, amount in ((lambda: big.sum(), big.numel() * 2 / 1e9), (lambda: a @ a, 2 * 512 ** 3 / 1e9)):
        work()
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 2:
            work()
            done += 1
        rates.append(done * amount / (time.perf_counter() - start))
    return rates[0], rates[1]


def wait_for_quiet(limit_s: float = 300.0) -> float:
    """Wait (at most ``limit_s``) until other processes keep under QUIET_SHARE of the cores busy for 2 s.

    Returns the seconds waited. An engine started beside a busy neighbour would be measured again and
    again (below) and then left out: waiting first keeps the engine count.
    """
    from specbench.results.provenance import CpuTimes

    waited = 0.0
    while waited < limit_s:
        before = CpuTimes.now(None)
        time.sleep(2.0)
        share = before.other_share(CpuTimes.now(None))
        if share is None or share <= QUIET_SHARE:
            break
        time.sleep(8.0)
        waited += 10.0
    return waited


def log_sd(values: list[float]) -> float:
    return statistics.stdev(math.log(v) for v in values) if len(values) > 1 else float("nan")


def pooled_within(per_engine: list[list[float]]) -> float:
    """Pooled standard deviation of log values within each engine."""
    num, den = 0.0, 0
    for reps in per_engine:
        if len(reps) > 1:
            logs = [math.log(v) for v in reps]
            mean = statistics.fmean(logs)
            num += sum((x - mean) ** 2 for x in logs)
            den += len(logs) - 1
    return math.sqrt(num / den) if den else float("nan")


def drift(order: list[int], means: list[float], within: float, reps: int) -> tuple[float, float, float]:
    """The machine's drift over the run, told from the engines' lottery.

    Engines are measured one after another, so a machine that speeds up or slows down over minutes
    (a neighbour VM, its memory's speed) reads as a spread between engines that no engine setting
    removes. Fits log tok/s against the order engines were measured in: the change per engine, the
    correlation with the order, and the engines' own share of what the trend leaves (as ``engine_log_sd``,
    over n - 2 degrees of freedom).
    """
    logs = [math.log(m) for m in means]
    if len(logs) < 3:
        return float("nan"), float("nan"), float("nan")
    slope, intercept = statistics.linear_regression(order, logs)
    residual = math.sqrt(sum((y - intercept - slope * x) ** 2 for x, y in zip(order, logs)) / (len(logs) - 2))
    return slope, statistics.correlation(order, logs), math.sqrt(max(0.0, residual**2 - within**2 / reps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the cell (default: method=baseline)")
    args = parser.parse_intermixed_args()

    from hydra import compose, initialize_config_module

    from specbench.config import cell_from_config
    from specbench.engine import EngineWorker
    from specbench.job import _requests
    from specbench.results.provenance import CpuTimes

    overrides = ["method=baseline", "batch_size=1", "workload=summarize", f"repetitions={args.reps}",
                 *args.overrides]
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        cell = cell_from_config(compose(config_name="config", overrides=overrides))
    _, plan = _requests(cell)
    spec = cell.engine_spec()
    print("cell:", " ".join(overrides))
    print("knobs:", {k: os.environ[k] for k in KNOBS if k in os.environ} or "none set")

    engines: list[dict] = []
    for i in range(args.engines):
        if waited := wait_for_quiet():
            print(f"engine {i}: waited {waited:.0f} s for the machine to go quiet", flush=True)
        gb_s, gflop_s = machine_probe()
        started = time.perf_counter()
        worker = EngineWorker(replace(spec, instance=i))
        try:
            start_s = time.perf_counter() - started
            libs, affinity = loaded_libraries(worker.pid), thread_affinities(worker.pid)
            # As a sweep does (job._least_disturbed): a measurement other processes disturbed is taken again.
            for attempt in range(ATTEMPTS):
                before = CpuTimes.now(worker.pid)
                m = worker.measure(plan)
                others = before.other_share(CpuTimes.now(worker.pid))
                if others is None or others <= QUIET_SHARE:
                    break
                print(f"engine {i}: others kept {100 * others:.0f}% of the cores busy, measuring again", flush=True)
                wait_for_quiet()
        finally:
            worker.close()
        rates = [tokens / wall for tokens, wall in zip(m.rep_output_tokens, m.rep_wall_s)]
        decode = m.decode_tokens / m.decode_s if m.decode_s else float("nan")
        engines.append(dict(start_s=start_s, worker_start_s=worker.info.start_s, warmup_s=m.warmup_s,
                            tok_per_s=rates, decode_tok_per_s=decode, libs=libs, affinity=affinity,
                            allocator=worker.info.allocator, huge_page_bytes=worker.info.huge_page_bytes,
                            other_cpu_share=others, attempts=attempt + 1, probe_gb_s=gb_s, probe_gflop_s=gflop_s))
        print(f"engine {i}: start {start_s:5.1f} s, warm-up {m.warmup_s:4.1f} s, tok/s "
              + " ".join(f"{r:6.2f}" for r in rates) + f"  (decode {decode:6.2f})  machine {gb_s:5.1f} GB/s {gflop_s:5.0f} GFLOP/s  others {100 * (others or 0):.1f}% of the cores  malloc {worker.info.allocator}  huge pages {(worker.info.huge_page_bytes or 0) / 2**20:.0f} MiB  libs {libs}  threads {affinity}",
              flush=True)

    disturbed = [i for i, e in enumerate(engines) if (e["other_cpu_share"] or 0) > QUIET_SHARE]
    if disturbed:
        # An engine that shared its cores measures the neighbours, not the lottery: named, then left out.
        print(f"\nleft out, disturbed on every attempt: engines {', '.join(map(str, disturbed))}")
    measured, engines = engines, [e for i, e in enumerate(engines) if i not in disturbed]
    order = [i for i in range(len(measured)) if i not in disturbed]
    means = [math.exp(statistics.fmean(math.log(r) for r in e["tok_per_s"])) for e in engines]
    later = [math.exp(statistics.fmean(math.log(r) for r in e["tok_per_s"][1:])) for e in engines] \
        if args.reps > 1 else means
    between, within = log_sd(means), pooled_within([e["tok_per_s"] for e in engines])
    summary = dict(
        engines=len(engines),
        disturbed_engines=disturbed,
        mean_tok_per_s=statistics.fmean(means),
        between_log_sd=between,
        max_over_min=max(means) / min(means),
        within_log_sd=within,
        # The engines' own share of the spread: an engine's mean over its repetitions carries within / sqrt(reps)
        # of repetition noise even when every engine is alike (one-way random effects, method of moments).
        engine_log_sd=math.sqrt(max(0.0, between**2 - within**2 / args.reps)),
        between_log_sd_after_first_rep=log_sd(later),
        within_log_sd_after_first_rep=pooled_within([e["tok_per_s"][1:] for e in engines]),
        median_start_s=statistics.median(e["start_s"] for e in engines),
    )
    summary["drift_log_per_engine"], summary["drift_correlation"], summary["engine_log_sd_detrended"] = drift(
        order, means, within, args.reps)
    print(f"\n{len(engines)} engines: {summary['mean_tok_per_s']:.2f} tok/s mean; "
          f"between engines log SD {summary['between_log_sd']:.3f} (max/min {summary['max_over_min']:.3f}); "
          f"within one engine {summary['within_log_sd']:.3f}; the engines' own share {summary['engine_log_sd']:.3f}")
    print(f"first repetition left out (a longer warm-up): between {summary['between_log_sd_after_first_rep']:.3f}, "
          f"within {summary['within_log_sd_after_first_rep']:.3f}")
    print(f"machine drift over the run: {100 * summary['drift_log_per_engine']:+.1f}% per engine (correlation with "
          f"the order measured {summary['drift_correlation']:+.2f}); the engines' own share without that trend "
          f"{summary['engine_log_sd_detrended']:.3f}")
    print(f"engine start: {summary['median_start_s']:.1f} s median")
    probes = [e["probe_gb_s"] for e in engines]
    print(f"machine probe between engines: log SD {log_sd(probes):.3f} (GB/s), "
          f"{log_sd([e['probe_gflop_s'] for e in engines]):.3f} (GFLOP/s); correlation of engine speed with GB/s "
          f"{statistics.correlation([math.log(v) for v in later], [math.log(v) for v in probes]):.2f}")
    if args.json:
        args.json.write_text(json.dumps(dict(cell=overrides, knobs={k: os.environ.get(k) for k in KNOBS},
                                             engines=measured, summary=summary), indent=1))


if __name__ == "__main__":
    sys.exit(main())
