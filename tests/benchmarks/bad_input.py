"""Bad input as a new user types it: each command run in a subprocess, its exit, time and first line.

Prints a markdown table (docs/results/*-bad-input.md holds one). No engine is meant to start: every
input here is wrong, and each must be refused in one line, non-zero, within seconds. A command that
would start an engine if it accepted its input runs under a short limit; one still running then is
killed with every process it started, and counted as a defect (not refused before the first engine),
as is an exit of 0 (a silent run), a traceback, a sweep folder with measured cells, or a refusal
slower than 3 s::

    .venv/bin/python tests/benchmarks/bad_input.py [--only WORD] > table.md

Seconds are wall time from process start, imports included: on a machine shared with other jobs
they are upper bounds. Beside them, the CPU seconds the command (and what it waited for) used,
which other jobs inflate far less: the 3 s bound is judged on them, and a wall time above it is
named in the verdict.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
ENGINE_LIMIT_S = 30.0  # past this a command that could start an engine counts as not refused
OTHER_LIMIT_S = 60.0
FAST_S = 3.0


@dataclass(frozen=True)
class Case:
    """One bad input: the command (module and arguments) and whether accepting it would start an engine."""

    module: str
    args: tuple[str, ...]
    engine: bool

    @property
    def shown(self) -> str:
        """The command as a user types it (the sweep's output folders left out)."""
        return " ".join(["python -m", self.module, *self.args])


@dataclass(frozen=True)
class Outcome:
    """What one case did."""

    returncode: int | None  # None: killed at its limit
    seconds: float
    cpu_seconds: float
    first_line: str
    defects: tuple[str, ...]


def cases(data: Path) -> list[Case]:
    """Every bad input, by command. ``data`` holds the files some of them name."""
    sweep = [
        "+num_speculative_token=8", "-m +num_speculative_token=8 batch_size=1,2", "num_speculative_token=4",
        "method=medusa", "num_speculative_tokens=0", "num_speculative_tokens=65", "batch_size=0",
        "batch_size=four", "batch_size=100000 engine.max_num_seqs=100000",
        "-m batch_size=1,100000 engine.max_num_seqs=100000", "batch_size=512",
        "engine.gpu_memory_utilization=1.5", "engine.gpu_memory_utilization=0", "engine.max_model_len=0",
        "engine.max_model_len=long", "engine.max_num_batched_tokens=0", "engine.cpu_allocator=jemalloc",
        "engine.async_scheduling=true", "engine.cell_timeout_s=-1", "+engine.gpu_mem=0.5", "repetitions=0",
        "engine_runs=0", "attempts=0", "passes=3", "remeasure=all", "temperature=-1", "top_p=1.5", "top_k=-5",
        "seed=abc", "load.request_rate=0", "load.request_rate=2 batch_size=4", "load.max_concurrency=0",
        "load.slo.tpot_ms=-5", "load.via=grpc", "load.via=server", "load.request_rate=2 method=controlled",
        "load.request_rate=2 load.burstiness=0", "load.request_rate=2 load.num_requests=1", "workload=nope",
        "workload.num_prompts=0", "workload.max_tokens=0", "workload.source=jsonl workload.path=/no/such.jsonl",
        f"workload.source=jsonl workload.path={data / 'bad.jsonl'}",
        f"workload.source=jsonl workload.path={data / 'cut.jsonl'}",
        "workload.source=hf workload.dataset=cnn_dailymail workload.text_field=article",
        "workload.selection=sorted", "workload.max_prompt_tokens=4000", "model=nope", "model.path=/no/such/model",
        "method=draft_model model.drafts.small=/no/such/draft", "method=eagle model.eagle=null",
        "method=draft_model method.draft=huge", "method.k_schedule=[[1,4,4],[3,64,2]]",
        "method=controlled method.alpha=1.5", "method.alpha=0.5",
        "+method.speculative_config.num_speculative_tokens_per_batch_size=[[1,4,4],[5,64,2]]", "hardware=nope",
        "sweep=nope", "verbose=maybe", "temperature=0.7 distribution_check.samples=0", "method=ngram_gpu",
    ]
    found = [Case("specbench", tuple(a.split()), True) for a in sweep]
    found += [Case("specbench.plan", tuple(a.split()), False) for a in [
        "hardware=rtx4090 engine.gpu_memory_utilization=1.5", "+num_speculative_token=8", "load.max_concurrency=0",
        "load.slo.tpot_ms=-5", "batch_size=100000 engine.max_num_seqs=100000", "method=medusa", "hardware=nope",
        "sweep=nope", "--alpha two",
    ]]
    found += [Case("specbench.calibrate", tuple(a.split()), True) for a in [
        "model=nope", "engine.max_model_len=0", "--batch-sizes 0", "--device-rates x", "--refit /no/such.yaml",
        "engine.gpu_memory_utilization=2", "+num_speculative_token=8",
    ]]
    foreign, damaged = str(data / "foreign.parquet"), str(data / "damaged.parquet")
    found += [Case(module, tuple(args), False) for module, args in [
        ("specbench.report", [foreign]), ("specbench.report", [damaged]), ("specbench.report", ["/no/such"]),
        ("specbench.report", [str(data / "empty")]), ("specbench.analytic.prediction", [foreign]),
        ("specbench.analytic.recommend", [foreign]), ("specbench.analytic.recommend", [damaged]),
        ("specbench.results.serving", [foreign, foreign]),
    ]]
    found += [Case("specbench.capacity", tuple(a.split()), True) for a in [
        "", "load.slo.tpot_ms=-5", "+load.slo.foo_ms=5", "load.slo.tpot_ms=100 capacity.min_rate=0",
        "load.slo.tpot_ms=100 capacity.min_rate=4 capacity.max_rate=1", "load.slo.tpot_ms=100 capacity.percentile=150",
        "load.slo.tpot_ms=100 engine.gpu_memory_utilization=2", "load.slo.tpot_ms=100 method=medusa",
        "load.slo.tpot_ms=100 +num_speculative_token=8",
    ]]
    found += [Case("specbench.heads", tuple(a.split()), True) for a in [
        "", "train --method medusa", "shingles /no/such.jsonl", "verify /no/such --method eagle",
        "train --target /no/such", "train --epochs 0",
    ]]
    return found


def write_data(data: Path) -> None:
    """The files the cases name: a malformed and a cut-short prompt file, another program's Parquet, a damaged one."""
    import pandas as pd

    (data / "bad.jsonl").write_text('{"prompt": "fine"}\n{"prompt": oops}\n')
    (data / "cut.jsonl").write_text('{"prompt": "cut short\n')
    pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}).to_parquet(data / "foreign.parquet")
    (data / "damaged.parquet").write_bytes(b"PAR1 this is not a parquet file")
    (data / "empty").mkdir()


def stop(pid: int) -> None:
    """End a command and everything it started (engine workers, fork servers): none may outlive its case."""
    try:
        family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(pid, signal.SIGKILL)  # its own session: the whole group, children that left it after
    except ProcessLookupError:
        pass
    for process in family:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)


def run(case: Case, work: Path) -> Outcome:
    """Run one case in a fresh folder; judge what it did."""
    work.mkdir(parents=True)
    args = list(case.args)
    if case.module == "specbench":
        args += [f"hydra.run.dir={work / 'run'}", f"hydra.sweep.dir={work / 'sweep'}"]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    env.pop("HYDRA_FULL_ERROR", None)
    limit = ENGINE_LIMIT_S if case.engine else OTHER_LIMIT_S
    started, cpu_before = time.perf_counter(), _children_cpu()
    process = subprocess.Popen([sys.executable, "-m", case.module, *args], cwd=work, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=limit)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        stop(process.pid)
        output, _ = process.communicate()
        code = None
    seconds = time.perf_counter() - started
    stop(process.pid)  # a refusal leaves nothing running; if it did, it goes now
    cpu = _children_cpu() - cpu_before
    lines = [line for line in output.splitlines() if line.strip()]
    defects = []
    if code is None:
        defects.append(f"not refused within {limit:.0f} s" + (" (an engine may have started)" if case.engine else ""))
    elif code == 0:
        defects.append("accepted (exit 0)")
    if "Traceback" in output:
        defects.append("traceback")
    if any(work.glob("*/cells/*.parquet")):
        defects.append("cells measured")
    if code not in (None, 0) and cpu > FAST_S:
        defects.append(f"refused after {FAST_S:g} s of CPU")
    return Outcome(code, seconds, cpu, lines[0] if lines else "(nothing printed)", tuple(defects))


def _children_cpu() -> float:
    """CPU seconds (user and system) of this process's finished children so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def cell(text: str, width: int = 150) -> str:
    """Text fit for one markdown table cell."""
    text = text.replace("|", "\\|").replace("`", "'")
    return text if len(text) <= width else text[: width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    """Run every case (or those whose command contains ``--only``) and print the table; exit 1 on a defect."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="run only the cases whose command contains this text")
    args = parser.parse_args(argv)
    print("| # | command | exit | wall s | CPU s | first line of output | verdict |")
    print("|---|---|---|---|---|---|---|")
    defects = 0
    with tempfile.TemporaryDirectory(prefix="specbench-bad-input-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        write_data(data)
        chosen = [c for c in cases(data) if args.only is None or args.only in c.shown]
        for number, case in enumerate(chosen, start=1):
            outcome = run(case, Path(tmp) / f"case-{number}")
            defects += bool(outcome.defects)
            verdict = "DEFECT: " + "; ".join(outcome.defects) if outcome.defects else "refused" + (
                f" (wall > {FAST_S:g} s: a shared machine)" if outcome.seconds > FAST_S else "")
            shown = case.shown.replace(str(data), "DATA")
            exit_code = "killed" if outcome.returncode is None else str(outcome.returncode)
            print(f"| {number} | `{cell(shown, 120)}` | {exit_code} | {outcome.seconds:.1f} | {outcome.cpu_seconds:.1f} | "
                  f"{cell(outcome.first_line.replace(str(data), 'DATA'))} | {verdict} |", flush=True)
    print(f"\n{len(chosen)} bad inputs, {len(chosen) - defects} refused as they should be, {defects} with a defect")
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
