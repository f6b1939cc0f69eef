"""Engine teardown: close() returns only once the engine's processes are gone and, on a GPU, its memory is free."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from specbench import engine
from specbench.engine import EngineError, EngineSpec, EngineWorker

SPEC = EngineSpec(model="m", dtype="float32", seed=0, max_model_len=64, max_num_seqs=1, enforce_eager=True,
                  enable_prefix_caching=False, gpu_memory_utilization=0.9, cpu_kvcache_space_gib=1)
# A process that outlives its parent's stop and ignores SIGTERM, as an engine core or a `vllm serve`
# that is still shutting down can: its own process group, as the server's is (specbench.engine.server).
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(120)"


def _worker_leaving_a_stubborn_child(conn: Any) -> None:
    """A worker's stand-in: starts STUBBORN, reports its pid, exits when told to stop, leaving it behind."""
    child = subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True, stdout=subprocess.PIPE)
    child.stdout.readline()  # its SIGTERM handler is set
    conn.send(child.pid)
    conn.recv()


def _worker(target: Any, free_before: int | None = None) -> EngineWorker:
    """An EngineWorker whose process runs ``target`` instead of a vLLM engine (none can run in this test)."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    worker = object.__new__(EngineWorker)
    worker.spec, worker._conn = SPEC, parent
    if free_before is not None:
        worker._free_before = free_before
    # A daemon: a test that fails before close() must not leave pytest waiting on it at exit.
    worker._process = ctx.Process(target=target, args=(child,), daemon=True)
    worker._process.start()
    child.close()
    return worker


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_close_waits_for_the_engines_processes_and_kills_one_that_ignores_sigterm():
    worker = _worker(_worker_leaving_a_stubborn_child)
    stubborn = worker._conn.recv()
    try:
        assert _running(stubborn)
        worker.close(wait_s=0.5, bound_s=30)
        assert not worker.alive
        # Before, close() returned once the worker had exited, with its child still holding whatever it held.
        assert not _running(stubborn)
    finally:
        if _running(stubborn):
            os.kill(stubborn, signal.SIGKILL)


def _idle_worker(conn: Any) -> None:
    conn.recv()


def test_close_waits_for_the_device_memory_to_return_and_says_so_when_it_does_not(monkeypatch):
    # What stands for a GPU: NVML's free-memory reading (engine.device_free_bytes), 20 GiB before the
    # engine started; the driver hands the exited engine's 8 GiB back two reads after its process exited.
    gib = 1 << 30
    reads = iter([12 * gib, 12 * gib, 20 * gib])
    monkeypatch.setattr(engine, "device_free_bytes", lambda: next(reads))
    worker = _worker(_idle_worker, free_before=20 * gib)
    worker.close(bound_s=30)
    assert next(reads, None) is None  # it read until the memory was back, and no further
    # A driver that never frees it: a clear error within the bound, not a refusal at the next engine's start.
    monkeypatch.setattr(engine, "device_free_bytes", lambda: 12 * gib)
    worker = _worker(_idle_worker, free_before=20 * gib)
    started = time.monotonic()
    with pytest.raises(EngineError, match=r"GPU memory did not return within 1 s.*12.00 GiB free, 20.00 GiB before"):
        worker.close(bound_s=1)
    assert time.monotonic() - started < 20
    # No GPU (no NVML): nothing to wait for.
    monkeypatch.setattr(engine, "device_free_bytes", lambda: None)
    _worker(_idle_worker, free_before=None).close(bound_s=0)


def _worker_with_a_child_core(sweep_pid: int, conn: Any) -> None:
    """A worker's stand-in on the real watch: a child that, like vLLM's async engine core, watches nothing."""
    from specbench.engine import worker

    worker._exit_with(sweep_pid)
    core = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(120)"],
                            stdout=subprocess.PIPE)
    core.stdout.readline()
    conn.send(core.pid)
    time.sleep(120)


def test_a_worker_whose_sweep_dies_takes_its_engine_core_with_it():
    # No vLLM engine can run in a fast test: the "sweep" is a sleeping process killed here, the core a plain
    # child. The watch thread and the kill are the worker's own (worker._exit_with).
    sweep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_worker_with_a_child_core, args=(sweep.pid, child), daemon=True)
    process.start()
    core = parent.recv()
    try:
        assert _running(core)
        sweep.kill()
        sweep.wait()
        deadline = time.monotonic() + 10
        while (_running(core) or process.is_alive()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process.is_alive(), "the worker outlived its sweep"
        assert not _running(core), "the worker's engine core outlived the sweep"
    finally:
        for pid in (core, process.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
