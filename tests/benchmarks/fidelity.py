"""Does specbench measure what a plain script measures? And how repeatable is it?

Prints figures; asserts nothing (not a timed test). Run on a quiet machine:

    .venv/bin/python tests/benchmarks/fidelity.py

1. specbench measures baseline and ngram (K=4, batch 1) on the embedded model.
2. An independent script times `llm.generate` for the same prompts the
   simplest possible way: one engine per process, one warm-up call, then the
   prompts one by one, three times; median wall time. No specbench code is
   involved in the timing; only the environment (threads, KV-cache size) is
   set as specbench's engine worker sets it.
3. Both run three times, interleaved. Engine-to-engine variation on a shared
   machine is several percent per run, so the medians are compared (target:
   within 5%), and each side's coefficient of variation over its three runs
   is printed: the repeatability.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from importlib import resources
from pathlib import Path

import pandas as pd

CELL = ["method=ngram", "num_speculative_tokens=4", "batch_size=1", "workload=summarize",
        "workload.num_prompts=4", "workload.max_tokens=64", "repetitions=3", "engine_runs=1"]

RUNS = 3

INDEPENDENT = textwrap.dedent(
    """
    import json, os, statistics, sys, time
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    model, spec, prompts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    llm = LLM(model=model, dtype="float32", max_model_len=2048, enforce_eager=True,
              enable_prefix_caching=False, seed=0, speculative_config=spec)
    params = SamplingParams(temperature=0.0, max_tokens=64)
    chats = [[{"role": "user", "content": p}] for p in prompts]
    llm.chat(chats[0], params, use_tqdm=False)  # warm-up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for chat in chats:
            llm.chat(chat, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    print("WALL", statistics.median(times))
    """
)


def specbench_speedup(directory: Path) -> tuple[float, list[str]]:
    subprocess.run([sys.executable, "-m", "specbench", "-m", *CELL, f"hydra.sweep.dir={directory}"],
                   check=True, capture_output=True)
    rows = pd.read_parquet(directory / "results.parquet").set_index("method")
    return float(rows.loc["ngram", "speedup"]), list(rows.loc["ngram", "prompt_ids"])


def independent_wall(model: str, spec: dict | None, prompts: list[str]) -> float:
    # The same configuration means the same thread count and KV-cache size as
    # specbench's engine worker (vLLM would otherwise drop to one thread).
    env = dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count()), VLLM_CPU_KVCACHE_SPACE="2")
    done = subprocess.run([sys.executable, "-c", INDEPENDENT, model, json.dumps(spec), json.dumps(prompts)],
                          check=True, capture_output=True, text=True, env=env)
    return float(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("WALL")))


def main() -> None:
    from specbench import models

    model = models.resolve("embedded:smollm2-135m-instruct")
    data = resources.files("specbench.workloads") / "data" / "summarize.jsonl"
    texts = {r["id"]: r["prompt"] for r in map(json.loads, data.read_text().splitlines())}
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        # Interleaved, so that drift of the machine hits both methods alike.
        for run in range(RUNS):
            speedup, prompt_ids = specbench_speedup(Path(tmp) / f"run{run}")
            ours.append(speedup)
            prompts = [texts[i] for i in prompt_ids]
            base, spec = independent_wall(model, None, prompts), independent_wall(model, ngram, prompts)
            theirs.append(base / spec)
            print(f"run {run + 1}: specbench {speedup:.3f}, independent {base:.2f} s / {spec:.2f} s = "
                  f"{base / spec:.3f}", flush=True)
    ours_median, theirs_median = statistics.median(ours), statistics.median(theirs)
    print(f"median speedup: specbench {ours_median:.3f}, independent {theirs_median:.3f} "
          f"({100 * (ours_median / theirs_median - 1):+.1f}%; target within 5%)")
    for name, values in (("specbench", ours), ("independent", theirs)):
        print(f"repeatability: CV of {name} speedup over {RUNS} identical runs = "
              f"{statistics.stdev(values) / statistics.mean(values):.1%}")


if __name__ == "__main__":
    main()
