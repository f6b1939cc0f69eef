"""Does specbench measure what a plain script measures? And how repeatable is it?

Prints figures; asserts nothing (not a timed test). Run on a quiet machine:

    .venv/bin/python tests/benchmarks/fidelity.py

1. specbench measures baseline and ngram (K=4, batch 1) on the embedded model.
2. An independent script times `llm.generate` for the same prompts the
   simplest possible way: one engine per process, one warm-up call, then the
   prompts one by one, three times; median wall time. No specbench code is
   involved in the timing.
3. The two speedups are compared (target: within 5%), and specbench is run
   twice more to give the coefficient of variation of its speedup over three
   identical runs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from importlib import resources
from pathlib import Path

import pandas as pd

CELL = ["method=ngram", "num_speculative_tokens=4", "batch_size=1", "workload=summarize",
        "workload.num_prompts=4", "workload.max_tokens=64", "repetitions=3"]

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
    done = subprocess.run([sys.executable, "-c", INDEPENDENT, model, json.dumps(spec), json.dumps(prompts)],
                          check=True, capture_output=True, text=True)
    return float(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("WALL")))


def main() -> None:
    from specbench import models

    model = models.resolve("embedded:smollm2-135m-instruct")
    with tempfile.TemporaryDirectory() as tmp:
        speedups = []
        for run in range(3):
            speedup, prompt_ids = specbench_speedup(Path(tmp) / f"run{run}")
            speedups.append(speedup)
            print(f"specbench run {run + 1}: speedup {speedup:.3f}", flush=True)
    data = resources.files("specbench.workloads") / "data" / "summarize.jsonl"
    texts = {r["id"]: r["prompt"] for r in map(json.loads, data.read_text().splitlines())}
    prompts = [texts[i] for i in prompt_ids]
    base = independent_wall(model, None, prompts)
    ngram = independent_wall(
        model, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
        prompts,
    )
    independent = base / ngram
    mean = statistics.mean(speedups)
    cv = statistics.stdev(speedups) / mean
    first = speedups[0]
    print(f"independent script: baseline {base:.2f} s, ngram {ngram:.2f} s, speedup {independent:.3f}")
    print(f"specbench (run 1) vs independent: {first:.3f} vs {independent:.3f} "
          f"({100 * (first / independent - 1):+.1f}%; target within 5%)")
    print(f"specbench median of 3 runs vs independent: {statistics.median(speedups) / independent - 1:+.1%}")
    print(f"repeatability: CV of speedup over 3 identical runs = {cv:.1%}")


if __name__ == "__main__":
    main()
