"""Shared fixtures: Hydra composition of the packaged configs, and the session's reference sweep.

Result rows for tests are built in one place, ``tests/rows.py`` (merged rows,
cell rows, a whole sweep of them and their files).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import pandas as pd
import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

if TYPE_CHECKING:
    from specbench.config import Cell
    from specbench.engine import EnginePool

# A disturbed cell is measured once, not up to three times (the default `attempts`): the engine tests assert
# what a cell measured, never how fast, and each attempt more costs a measurement and a 5 s wait on a busy
# machine (and always under hydra/launcher=submitit_local, whose jobs measure at once and disturb each
# other). The re-measuring itself is tested in tests/test_job.py against a real busy process.
TEST_ATTEMPTS = "attempts=1"

# One small multirun on the real engine serves every test that needs measured cells of the shipped
# methods: ngram, a draft model (the target itself, the oracle: every draft accepted), EAGLE and EAGLE-3,
# at two batch sizes, with their baselines. Creative prompts are short: a long prompt's prefill costs
# seconds a request on 2 cores. 2 prompts x 16 tokens; 10 cells on 5 engines. One attempt a cell
# (TEST_ATTEMPTS). A test that needs a complete grid to add to (confirm=true, tests/test_confirm.py; the killed
# sweep's resume, tests/test_robustness.py) runs on a copy of its directory rather than measuring a grid of its
# own. Without huge pages: each row's memory is then what the memory model predicts (tests/test_memory_engine.py
# reads it), not rounded up by what the kernel gathered; the default's huge pages are asserted on the single run
# of tests/test_e2e.py.
REFERENCE_GRID = [
    "method=ngram,draft_model,eagle,eagle3", "model.drafts.small=embedded:smollm2-135m-instruct",  # self-draft
    "num_speculative_tokens=2", "batch_size=1,2",
    "workload=creative", "workload.num_prompts=2", "workload.max_tokens=16", "repetitions=1", "engine_runs=1",
    "engine.cpu_huge_pages=false", TEST_ATTEMPTS,
]


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker's OpenMP pool (torch's, OpenBLAS's) gets its share of the cores, not all
    of them: a worker per core each spinning a thread per core made the head-training tests of tests/test_heads.py
    spend four times the CPU, waiting on each other. A pass without workers (the engine pass, whose engines own
    the machine) and an OMP_NUM_THREADS given by the user are left as they are."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return
    share = max(1, len(os.sched_getaffinity(0)) // int(workers))
    os.environ["OMP_NUM_THREADS"] = str(share)  # read when torch or numpy starts, here and in subprocesses
    if "torch" in sys.modules:  # imported already by a plugin: its pool is sized, resize it
        sys.modules["torch"].set_num_threads(share)


@pytest.fixture
def compose_cell() -> Callable[[Sequence[str]], DictConfig]:
    """Compose the packaged config with overrides, as the app would."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        yield lambda overrides=(): compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()


@pytest.fixture
def narrowed_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine's calibrated profile as ``make demo``'s narrowed calibration leaves it: the packaged CPU
    profile, measured at batch 1 and 4 and prompts of 16 and 512 tokens, the EAGLE-3 head at K=4 alone
    (``settings.narrowed_to``)."""
    from specbench.analytic import prediction

    doc = yaml.safe_load((Path(prediction.__file__).parents[1] / "conf" / "hardware" / "cpu-amd-epyc-2-cores.yaml")
                         .read_text())
    doc["settings"][prediction.NARROWED_TO] = {"batch_sizes": [1, 4], "prompt_lengths": [16, 512], "draft_ks": [4]}
    doc["head_draft_samples"] = {"eagle3": [{"k": 4}]}
    path = tmp_path / "hardware" / "calibrated.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(prediction, "calibrated_path", lambda: path)
    return path


def specbench(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m specbench <args>`` as a user runs it, both streams captured; ``env``: its whole environment
    (None: this process's)."""
    return subprocess.run([sys.executable, "-m", "specbench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1200)


def _run_script(script: str, conn: Connection) -> None:
    """``script`` as ``python -c`` would run it, in this (forked) process; sends back its exit status, what it
    printed and, where it raised, the traceback."""
    out, code, error = io.StringIO(), 0, ""
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(script, "<script>", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - sent to the test, which fails on it
        code, error = 1, traceback.format_exc()
    conn.send((code, out.getvalue(), error))


def run_forked(script: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -c script`` in a fresh process of its own, forked from the engine fork server of this pytest
    process (:func:`specbench.engine.worker_context`) instead of a new interpreter: vLLM is imported there
    once for every engine test of the session, not once per script, and no engine has been built in it.
    Its stdout, and its traceback as stderr; a process that dies or outlives ``timeout`` fails."""
    from specbench import engine

    ctx = engine.worker_context(None)
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_run_script, args=(script, send))
    process.start()
    send.close()
    answered = False
    try:
        if not receive.poll(timeout):
            return subprocess.CompletedProcess(script, -1, "", f"no answer within {timeout:.0f} s")
        code, out, error = receive.recv()
        answered = True
        return subprocess.CompletedProcess(script, code, out, error)
    except EOFError:
        return subprocess.CompletedProcess(script, -1, "", "the process died without a word")
    finally:
        process.join(timeout=30 if answered else 0)
        if process.is_alive():
            process.kill()
            process.join()


@dataclass(frozen=True)
class Sweep:
    """A finished multirun: its directory, the command's outcome, and its merged results."""

    directory: Path
    done: subprocess.CompletedProcess[str]
    results: pd.DataFrame


def run_sweep(grid: Sequence[str], root: Path) -> Sweep:
    """``python -m specbench -m <grid>`` into ``root/sweep`` through the real command line; it must succeed."""
    done = specbench("-m", *grid, f"hydra.sweep.dir={root / 'sweep'}", cwd=root)
    assert done.returncode == 0, done.stderr[-4000:]
    return Sweep(root / "sweep", done, pd.read_parquet(root / "sweep" / "results.parquet"))


# What a grid measured in this process (run_here) asks for: the start environment this session's engine fork server
# starts with (no huge pages), so that every engine forks from it; another would be spawned, importing vLLM again.
HERE = ("engine.cpu_huge_pages=false",)


def run_here(grid: Sequence[str], root: Path, *, measure: Callable[[Cell], bool] | None = None,
             finish: bool = True, pool: EnginePool | None = None) -> Sweep:
    """The plan, cells, results and report ``python -m specbench -m <grid>`` writes to ``root``, measured in this
    process: the sweeper's plan (:func:`specbench.sweep.plan_cells`), each cell as its job measures it
    (:func:`specbench.job.run_cell`) on engines forked from this session's engine fork server, then merged, priced
    and reported as the sweep's finish does (:func:`specbench.sweep.finish`).

    For tests of what the engines measure: a command of its own would cost an interpreter, an import of vLLM and
    the report's imports (about 15 s on 2 cores); what the command line does is tested through it (:func:`run_sweep`).
    ``grid`` gets :data:`HERE`. ``measure``: the planned cells to measure (all by default); ``finish`` false leaves
    the merge out, and the results are then the measured cells' own rows (a speculative cell without its baseline
    has no speedup, which the finish fails). ``pool``: the engines to measure on, left running for the next grid
    whose first cell shares the last engine (as a sweep's next cell would); by default a pool of this grid's own,
    stopped at the end. ``done``: the lines each cell printed and the finish's output.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from specbench import grid as grids
    from specbench import job
    from specbench.engine import EnginePool
    from specbench.results.files import CellFiles
    from specbench.results.schema import read_rows
    from specbench.sweep import finish as finish_sweep
    from specbench.sweep import plan_cells, write_plan

    jobs = grids.grid_points(OverridesParser.create(), {}, [*grid, *HERE])
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        planned = plan_cells(jobs, lambda point: compose(config_name="config", overrides=list(point)))
    GlobalHydra.instance().clear()
    write_plan(root, planned)
    chosen = [p.cell for p in planned if measure is None or measure(p.cell)]
    engines = EnginePool() if pool is None else pool
    out, err = io.StringIO(), io.StringIO()
    try:
        for cell in chosen:
            outcome = job.run_cell(cell, root / "cells", engine_runs=cell.config["engine_runs"],
                                   timeout_s=cell.config["engine"]["cell_timeout_s"], pool=engines,
                                   engine_log=root / "specbench.log")
            assert outcome.status == "ok", outcome.error
            out.write(f"{outcome.summary}\n")
    except BaseException:
        engines.discard()  # a failed cell's engine is suspect
        raise
    finally:
        if pool is None:
            engines.discard()
    if finish:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            finish_sweep(root)
        results = pd.read_parquet(root / "results.parquet")
    else:
        results = pd.DataFrame([read_rows(CellFiles(root / "cells", cell.cell_id).row)[0] for cell in chosen])
    return Sweep(root, subprocess.CompletedProcess(list(grid), 0, out.getvalue(), err.getvalue()), results)


@pytest.fixture
def device_closed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """What stands for a GPU where there is none: this process's torch says CUDA is there, and every call that
    would open the device in this process (a context the next engine would find taken) fails the test. A
    spawned child, a fresh interpreter, sees none of it."""
    import torch

    def opened_here(*args: object, **kwargs: object) -> None:
        raise AssertionError("this process opened the device itself")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("init", "_lazy_init", "device_count", "get_device_properties", "get_device_name", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, opened_here)


@pytest.fixture(scope="session")
def reference_sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    """:data:`REFERENCE_GRID`, run once per session through the real command line.

    The session's engine fork server (:func:`specbench.engine.worker_context`, the start environment of
    :data:`HERE`), which the engine tests that measure in this process fork from, is started first: its import
    of vLLM, one core's work for about 9 s on 2 cores, then runs beside the command's own interpreter start and
    import instead of after the sweep."""
    from specbench import engine

    engine.worker_context(None)
    return run_sweep(REFERENCE_GRID, tmp_path_factory.mktemp("reference"))
