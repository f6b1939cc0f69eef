"""The engine layer, worker side: everything that runs inside an engine's own process.

:func:`serve` is the worker's main loop (started by
:class:`specbench.engine.EngineWorker`): it builds a :class:`VllmEngine` and
runs :func:`specbench.measure.measure` on each plan it receives. Around vLLM:
hooks that count what vLLM's metrics leave out (drafts per position, tokens
cut from a request's last pass), the memory an engine holds, and the near ties
of greedy decoding. This module, :mod:`specbench.engine.preload` and
:mod:`specbench.engine.fixes` are the only ones that import vLLM (with :mod:`specbench.engine.serving`
and :mod:`specbench.engine.server`, which the worker builds for serving cells), and this one
only inside its functions, so the
fork server can preload it and the sweep process can name :func:`serve`.
"""

from __future__ import annotations

import gc
import math
import os
import time
import traceback
import uuid
import warnings
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Sequence

from specbench.engine import (
    MEMORY_REQUEST, EngineInfo, EngineMemory, EngineMode, EngineSpec, _descendants, _signal_all, describe_machine,
    fixes,
)
from specbench.engine.mode import engine_mode
from specbench.measure import GeneratedRequest, SpecCounters, TopTokens
from specbench.sampling import GREEDY, Sampling

# Drafts that reached each position, counted in this worker. vLLM counts them
# (SpecDecodingStats.num_draft_tokens_per_pos) but exports only the accepted
# tokens per position; with drafts shorter than K (ngram) the accepted count
# over all drafts understates each position's acceptance.
_DRAFTED_PER_POS: list[int] = []


def _count_drafted_positions() -> None:
    """Wrap vLLM's per-draft statistics hook to count drafted positions; a no-op if it moved.

    The scheduler calls it in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0).
    """
    try:
        from vllm.v1.spec_decode.metrics import SpecDecodingStats
    except ImportError:
        return
    original = SpecDecodingStats.observe_draft
    if getattr(original, "_specbench_counts", False):
        return

    def observe_draft(self: Any, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        original(self, num_draft_tokens=num_draft_tokens, num_accepted_tokens=num_accepted_tokens)
        _DRAFTED_PER_POS.extend([0] * (num_draft_tokens - len(_DRAFTED_PER_POS)))
        for position in range(num_draft_tokens):
            _DRAFTED_PER_POS[position] += 1

    observe_draft._specbench_counts = True  # type: ignore[attr-defined]
    SpecDecodingStats.observe_draft = observe_draft  # type: ignore[method-assign]


# Tokens a request's last pass generated beyond its end (max_tokens or a stop
# token), by vLLM's external request id; read once by _request_result.
_CUT_TOKENS: dict[str, int] = {}


def _count_cut_tokens() -> None:
    """Wrap vLLM's stop check to count the tokens it cuts from a request's last pass; a no-op if it moved.

    The scheduler counts a verify pass's accepted drafts before this check
    trims them, so the cut is what vLLM's acceptance counters hold beyond
    the output. The scheduler runs in this process (in-process engine).
    """
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError:
        return
    original = Scheduler._update_request_with_output
    if getattr(original, "_specbench_counts", False):
        return

    def update(self: Any, request: Any, new_token_ids: list[int], is_stale: bool = False) -> tuple[list[int], bool]:
        generated = len(new_token_ids)  # the check trims the list in place
        kept, stopped = original(self, request, new_token_ids, is_stale)
        if stopped and generated > len(kept):
            # Internal ids are the external one plus "-<random>" (vLLM's input processor).
            _CUT_TOKENS[request.request_id.rsplit("-", 1)[0]] = generated - len(kept)
        return kept, stopped

    update._specbench_counts = True  # type: ignore[attr-defined]
    Scheduler._update_request_with_output = update  # type: ignore[method-assign]


def _inspect_models_in_process() -> None:
    """On the CPU build, let vLLM inspect a model class in this process instead of a new one; a no-op on a GPU.

    Where its model-info cache (``$VLLM_CACHE_ROOT/modelinfos``) has no entry for an
    architecture, vLLM 0.32 imports the model class in a fresh Python process, so that
    an API server never initialises CUDA before it forks its engine: that process imports
    vLLM again, ~9 s on 2 cores, once per architecture on a new machine (the target's,
    each EAGLE head's). This worker's offline and serving engines run in-process and, on a
    CPU, there is no CUDA to keep uninitialised, so the inspection runs here, on the vLLM
    this worker already imported; vLLM writes the cache as before (a server engine's
    ``vllm serve`` keeps its own way).
    On a GPU vLLM's own way is kept. A no-op if vLLM's registry moved.
    """
    import torch

    if torch.cuda.is_available():
        return
    try:
        from vllm.model_executor.models import registry
    except ImportError:
        return
    if hasattr(registry, "_run_in_subprocess"):
        registry._run_in_subprocess = lambda inspect: inspect()  # type: ignore[attr-defined]


class VllmEngine:
    """A vLLM ``LLM`` with the :class:`specbench.measure.Generator` interface."""

    def __init__(self, spec: EngineSpec) -> None:
        from vllm import LLM

        _count_drafted_positions()
        _count_cut_tokens()
        self.llm = LLM(**spec.llm_kwargs())
        # After LLM(): the engine registers its platform's kernels while it starts.
        self.vllm_fixes: tuple[str, ...] = fixes.apply() if spec.vllm_fixes else ()
        # In-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0): one worker, this process.
        self._static_memory: dict[str, int] = self.llm.collective_rpc(_weights_and_kv)[0]
        # The worker's own config: its model runner may still lower the graph mode as it starts.
        self.mode: EngineMode = self.llm.collective_rpc(_worker_mode)[0]
        # False once the kernel refused to reset VmHWM: from then on it may be an earlier cell's peak.
        self._rss_peak_resets = True

    def reset_peaks(self) -> None:
        """Restart the peak figures from what the engine holds now, so that the next cell's peaks are its own.

        Without it a batch-1 cell served after a batch-64 cell on the same
        engine would report the batch-64 peak. On a GPU, torch's peak
        statistics; on CPU, the resident high-water mark
        (:func:`_reset_peak_rss`). Where the kernel refuses that, the CPU
        peak is reported unknown (None) from then on, not as this cell's.
        """
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        elif self._rss_peak_resets and not _reset_peak_rss():
            self._rss_peak_resets = False
            warnings.warn(
                "cannot reset the resident high-water mark (writing 5 to /proc/self/clear_refs failed): "
                "peak_rss_bytes is left empty rather than report an earlier cell's peak",
                RuntimeWarning, stacklevel=2,
            )

    def memory(self) -> EngineMemory:
        """Weights and KV cache as allocated at start, and the peaks since the last :meth:`reset_peaks`."""
        import torch

        peaks: dict[str, int | None] = {"peak_rss_bytes": _peak_rss_bytes() if self._rss_peak_resets else None}
        if torch.cuda.is_available():
            peaks |= {
                "peak_gpu_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "peak_gpu_reserved_bytes": int(torch.cuda.max_memory_reserved()),
                "gpu_used_bytes": _nvml_used_bytes(torch.cuda.current_device()),
                # Resident host memory says little about a GPU engine.
                "peak_rss_bytes": None,
            }
        return EngineMemory(**self._static_memory, **peaks)

    def generate(
        self, prompts: Sequence[Sequence[int]], max_tokens: int, sampling: Sampling = GREEDY,
        seeds: Sequence[int] | None = None,
    ) -> list[GeneratedRequest]:
        """One batch, greedy or sampled with one seed per request, with per-request latencies."""
        return [_request_result(o) for o in self._generate(prompts, max_tokens, sampling, seeds)]

    def top_tokens(self, prompts: Sequence[Sequence[int]], max_tokens: int, tolerance: float) -> list[TopTokens]:
        """Greedy generation of one batch with every position's near ties (untimed)."""
        outputs = self._generate(prompts, max_tokens, GREEDY, None, logprobs=NEAR_TIE_CANDIDATES)
        return [_top_tokens(o.outputs[0], tolerance) for o in outputs]

    def _generate(
        self, prompts: Sequence[Sequence[int]], max_tokens: int, sampling: Sampling,
        seeds: Sequence[int] | None, **extra: Any,
    ) -> list[Any]:
        """vLLM's outputs for one batch of token-id prompts: greedy, or sampled with a seed per request."""
        from vllm import SamplingParams

        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        if sampling.greedy:
            params: Any = SamplingParams(max_tokens=max_tokens, **sampling.params(), **extra)
        else:
            if seeds is None or len(seeds) != len(prompts):
                raise ValueError("a sampled batch needs one seed per request")
            params = [SamplingParams(max_tokens=max_tokens, seed=s, **sampling.params(), **extra) for s in seeds]
        return self.llm.generate(requests, params, use_tqdm=False)

    def reference_pass(self, batches: Sequence[Sequence[Sequence[int]]], max_tokens: int) -> None:
        """Decode ``batches`` plainly, untimed, and hand the outputs to the controlled proposer."""
        from specbench import controlled

        controlled.reference_pass(
            lambda prompts, n: [r.token_ids for r in self.generate(prompts, n)], batches, max_tokens
        )

    def spec_counters(self) -> SpecCounters:
        """Read vLLM's cumulative spec-decode counters (zero without speculation)."""
        values: dict[str, Any] = {}
        for metric in self.llm.get_metrics():
            if metric.name.startswith("vllm:spec_decode_"):
                values[metric.name] = getattr(metric, "values", None) or getattr(metric, "value", 0)
        return SpecCounters(
            drafts=int(values.get("vllm:spec_decode_num_drafts", 0)),
            draft_tokens=int(values.get("vllm:spec_decode_num_draft_tokens", 0)),
            accepted_tokens=int(values.get("vllm:spec_decode_num_accepted_tokens", 0)),
            accepted_per_pos=tuple(
                int(v) for v in values.get("vllm:spec_decode_num_accepted_tokens_per_pos", ())
            ),
            drafted_per_pos=tuple(_DRAFTED_PER_POS),
        )


def _worker_mode(worker: Any) -> EngineMode:
    """Run by vLLM inside its worker (collective_rpc): :func:`engine_mode` of the worker's config."""
    return engine_mode(worker.vllm_config, getattr(worker, "use_v2_model_runner", None))
def _proposer(runner: Any) -> Any:
    """The model runner's drafter: ``speculator`` in model runner V2 (vLLM 0.32 on CUDA,
    ``vllm/v1/worker/gpu/model_runner.py``), ``drafter`` in V1 (the CPU build); None without one."""
    speculator = getattr(runner, "speculator", None)
    return speculator if speculator is not None else getattr(runner, "drafter", None)


def _module_device(module: Any) -> Any:
    """Where a layer's parameters live (the GPU on a CUDA engine): the device its input must be on."""
    return next(module.parameters()).device


def _weights_and_kv(worker: Any) -> dict[str, int]:
    """Run by vLLM inside its worker (collective_rpc): parameter bytes and the KV cache config."""
    runner = worker.model_runner
    seen: set[int] = set()

    def unique_bytes(module: Any) -> int:
        total = 0
        for param in module.parameters():
            key = param.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += param.untyped_storage().nbytes()
        return total

    target = unique_bytes(runner.get_model())
    draft_model = getattr(_proposer(runner), "model", None)
    drafter = unique_bytes(draft_model) if draft_model is not None else 0

    config = runner.kv_cache_config
    # vLLM sizes a block by its largest group: the sum of its layers' pages.
    bytes_per_block = 0
    for group in config.kv_cache_groups:
        specs = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        pages = (
            sum(specs[name].page_size_bytes for name in group.layer_names) if specs
            else group.kv_cache_spec.page_size_bytes * len(group.layer_names)
        )
        bytes_per_block = max(bytes_per_block, pages)
    block_size = config.kv_cache_groups[0].kv_cache_spec.block_size
    return {
        "target_weight_bytes": target,
        "drafter_weight_bytes": drafter,
        "kv_cache_blocks": int(config.num_blocks),
        "kv_block_size": int(block_size),
        "kv_bytes_per_token": bytes_per_block // block_size,
        "kv_cache_bytes": int(config.num_blocks) * bytes_per_block,
    }


def _peak_rss_bytes() -> int | None:
    """This process's peak resident memory (VmHWM), from /proc; None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_peak_rss(clear_refs: str = "/proc/self/clear_refs") -> bool:
    """Reset this process's resident high-water mark (VmHWM) to its resident size now; False if refused.

    Linux 4.0 and later do it when "5" is written to clear_refs (it touches
    nothing else: the page flags that 1 to 4 clear stay). Another system, an
    older kernel or a sandbox without that file refuses.
    """
    try:
        with open(clear_refs, "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _nvml_used_bytes(device: int) -> int | None:
    """Device memory in use as the driver reports it (every process on the device)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML: torch's own figures remain
        return None
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(device)).used)
    finally:
        pynvml.nvmlShutdown()


def loaded_allocator(maps: str = "/proc/self/maps") -> str | None:
    """The malloc this process runs with, from the libraries mapped into it: ``tcmalloc``, ``jemalloc`` or
    ``glibc``; None where the map cannot be read. What was loaded, not what was asked for: a preload
    that failed to load (a missing file) shows as glibc."""
    try:
        with open(maps) as f:
            text = f.read()
    except OSError:
        return None
    return next((name for name in ("tcmalloc", "jemalloc") if f"lib{name}" in text), "glibc")


def loaded_plugins() -> tuple[str, ...]:
    """The general plugins vLLM loaded into this process: the installed ones its ``VLLM_PLUGINS`` allows
    (all where it is unset), as ``vllm.plugins.load_plugins_by_group`` picks them; empty before vLLM has
    loaded any (``plugins_loaded`` still false)."""
    from importlib.metadata import entry_points

    import vllm.envs as envs
    import vllm.plugins as plugins

    if not plugins.plugins_loaded:
        return ()
    allowed = envs.VLLM_PLUGINS
    return tuple(sorted(ep.name for ep in entry_points(group=plugins.DEFAULT_PLUGINS_GROUP)
                        if allowed is None or ep.name in allowed))


def huge_page_bytes(rollup: str = "/proc/self/smaps_rollup") -> int | None:
    """Anonymous memory of this process the kernel backs with transparent huge pages (AnonHugePages);
    None where the kernel does not say."""
    try:
        with open(rollup) as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _request_result(output: Any) -> GeneratedRequest:
    completion = output.outputs[0]
    stats = output.metrics
    ttft = e2e = tpot = None
    if stats is not None and stats.first_token_ts > 0:
        ttft = stats.first_token_latency
        decode = stats.last_token_ts - stats.first_token_ts
        e2e = ttft + decode
        if stats.num_generation_tokens > 1:
            tpot = decode / (stats.num_generation_tokens - 1)
    drafts = accepted = last = None
    spec = getattr(completion, "spec_decode_metrics", None)
    if spec is not None:
        # histogram[j]: this request's passes whose draft had j tokens accepted;
        # per_step_accepted (the "detailed" level) in order, so its last is the pass an end can cut.
        drafts = sum(spec.histogram)
        accepted = sum(j * n for j, n in enumerate(spec.histogram))
        steps = getattr(spec, "per_step_accepted", None)
        last = int(steps[-1]) if steps else None
    scheduled = finished = None
    if stats is not None and stats.scheduled_ts > 0 and stats.last_token_ts > 0:
        scheduled, finished = stats.scheduled_ts, stats.last_token_ts
    cut = _CUT_TOKENS.pop(output.request_id, 0) if spec is not None else None
    return GeneratedRequest(
        tuple(completion.token_ids), ttft, e2e, tpot, drafts, accepted, scheduled, finished,
        last_accepted=last, cut_tokens=cut,
    )


# Tokens per position whose log-probabilities are read for near ties: in a
# 16-bit dtype several logits can round to one value, so a tie may be three-way.
NEAR_TIE_CANDIDATES = 5


def _top_tokens(completion: Any, tolerance: float) -> TopTokens:
    """Margins and near ties from a completion decoded with ``logprobs=NEAR_TIE_CANDIDATES``.

    vLLM returns, per position, the top-ranked tokens (rank 1 the best) and
    the sampled one; greedy decoding sampled rank 1.
    """
    margins: list[float] = []
    near_ties: list[tuple[int, ...]] = []
    for position in completion.logprobs or []:
        ranked = sorted(position.items(), key=lambda item: item[1].rank)
        best = ranked[0][1].logprob
        margins.append(float(best - ranked[1][1].logprob) if len(ranked) > 1 else math.inf)
        near_ties.append(tuple(int(t) for t, lp in ranked if best - lp.logprob <= tolerance))
    return TopTokens(tuple(completion.token_ids), tuple(margins), tuple(near_ties))


def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker if the sweep process dies (even by SIGKILL).

    Otherwise an orphaned engine would keep the cores (or the GPU) busy until
    its current cell ends.
    """
    try:
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


# Called before the worker exits on its sweep's death (_exit_with): processes of the worker's that its
# own death does not take down.
_ON_SWEEP_DEATH: list[Callable[[], None]] = []


def _exit_with(sweep_pid: int) -> None:
    """Exit this worker within a second of the sweep process's death.

    A worker forked by the fork server has the server as its parent, and the
    server outlives a killed sweep for as long as any worker holds the pipe it
    watches (each forked child inherits it): so :func:`_die_with_parent` alone
    would leave the engine running its cell. A daemon thread polls the sweep
    once a second instead. Before it exits it kills every process below the
    worker: vLLM's async engine (a serving cell) runs its core in a child
    process that watches nothing, and an orphaned core kept polling for work
    at a third of a core until killed by hand.
    """
    import signal
    import threading

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(sweep_pid, 0)
            except ProcessLookupError:
                for stop in _ON_SWEEP_DEATH:
                    stop()
                _signal_all(_descendants(os.getpid()), signal.SIGKILL)
                os._exit(1)
            except PermissionError:  # a process of another user: the pid is alive
                pass

    threading.Thread(target=watch, name="exit-with-sweep", daemon=True).start()


# The engine of a worker about to exit, kept referenced so that returning from serve() does not take its object
# graph apart piece by piece: 1.9 s of every stop on 2 busy cores. A worker forked by the fork server then ends
# in os._exit (multiprocessing's forkserver), and the kernel takes its memory back at once.
_EXITING: list[Any] = []


def serve(
    conn: Connection,
    spec: EngineSpec,
    log_path: Path | None = None,
    environment: dict[str, str] | None = None,
    sweep_pid: int | None = None,
) -> None:
    """Worker main loop: build the engine, then measure plans until told to stop."""
    _die_with_parent()
    if sweep_pid is not None:
        _exit_with(sweep_pid)
    os.environ.update(environment or {})
    if log_path is not None:
        from specbench.logs import redirect_output

        redirect_output(log_path)  # before vLLM is imported: its log handler writes to stdout
    from tqdm import tqdm

    from specbench.measure import measure

    # What the fork server imported (vLLM, torch, transformers: ~670,000 objects, ~20 of them garbage) lives as
    # long as this process. Frozen, it stays out of the full collections vLLM runs as the engine starts (after
    # each model's weights load, and before it freezes its own heap): they took 2.6-4.3 s of a start on 2
    # busy cores, 0.2-0.4 s with it frozen. vLLM freezes the whole heap once the engine is built either way, so
    # the engine measures with the same heap frozen.
    gc.freeze()
    _inspect_models_in_process()
    try:
        start = time.perf_counter()
        if spec.via_server:
            from specbench.engine.server import ServerEngine

            engine: Any = ServerEngine(spec)
            # The server leads a process group of its own, which this worker's death would leave running.
            _ON_SWEEP_DEATH.append(engine.kill)
        elif spec.serving:
            from specbench.engine.serving import ServingEngine

            engine = ServingEngine(spec)
        else:
            engine = VllmEngine(spec)
        import torch
        import transformers
        import vllm

        info = EngineInfo(
            machine=describe_machine(),
            vllm_version=vllm.__version__,
            torch_version=torch.__version__,
            transformers_version=transformers.__version__,
            start_s=time.perf_counter() - start,
            vllm_fixes=engine.vllm_fixes,
            mode=engine.mode,
            engine_id=uuid.uuid4().hex,
            allocator=loaded_allocator(),
            huge_page_bytes=huge_page_bytes(),
            plugins=loaded_plugins(),
        )
        conn.send(("ok", info))
    except BaseException:  # noqa: BLE001 - everything must reach the parent
        conn.send(("error", "engine failed to start:\n" + traceback.format_exc()))
        return
    while True:
        plan = conn.recv()
        if plan is None:
            break
        if plan == MEMORY_REQUEST:
            try:
                conn.send(("ok", engine.memory()))
            except BaseException:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))
            continue
        if spec.serving:
            try:
                conn.send(("ok", engine.serve(plan)))
            except BaseException:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))
            continue
        try:
            engine.reset_peaks()  # before the warm-up: the cell's peaks, not an earlier cell's
            # tqdm stays silent when stderr is not a terminal (logs, CI).
            with tqdm(total=plan.timed_batches, desc="  batches", leave=False, disable=None) as bar:
                conn.send(("ok", measure(engine, plan, on_batch=bar.update)))
        except BaseException:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))
    if spec.serving:
        engine.shutdown()
    else:
        _release_before_exit()
    _EXITING.append(engine)


def _release_before_exit() -> None:
    """What an offline engine must release before its worker exits: only what outlives the process, the file
    store of vLLM's distributed group (a ``/tmp/vllm_dist_*`` file, removed as the group is destroyed).

    Not vLLM's whole teardown (``engine_core.shutdown()``): it unfreezes the heap and collects it whole, for
    memory the exit hands back anyway: 2.0 s of an engine's stop on 2 busy cores, against 0.1 s for this.
    """
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()


def loaded_drafter_parameters(spec: EngineSpec) -> dict[str, Any]:
    """Start ``spec``'s engine in this process; the drafter's own parameters as vLLM loaded them.

    Parameters the drafter shares with the target (an EAGLE head's embedding
    and LM head) are left out. EAGLE heads' ``load_weights`` skip vLLM's
    "weights not initialized" check, so this is how a test proves that every
    tensor of a head came from its file. Needs the worker environment of
    :func:`worker_environment` already set (in-process engine).
    """
    engine = VllmEngine(spec)

    def collect(worker: Any) -> dict[str, Any]:
        import torch
        from vllm.model_executor.layers.linear import LinearBase

        runner = worker.model_runner
        shared = {id(p) for p in runner.model.parameters()}
        drafter = _proposer(runner).model
        found: dict[str, Any] = {}
        for name, module in drafter.named_modules():
            if isinstance(module, LinearBase):
                # The CPU backend repacks linear weights (the parameter is left
                # empty), so read each one back through the layer: W = f(I)^T.
                weight = module.weight if hasattr(module, "weight") else None
                if weight is not None and id(weight) in shared:
                    continue
                identity = torch.eye(module.input_size, dtype=runner.model_config.dtype,
                                     device=_module_device(module))
                out = module(identity)
                out = out[0] if isinstance(out, tuple) else out
                found[f"{name}.weight"] = out.detach().T.contiguous().cpu()
        for name, p in drafter.named_parameters():
            owner = drafter.get_submodule(name.rsplit(".", 1)[0]) if "." in name else drafter
            if id(p) in shared or isinstance(owner, LinearBase):
                continue
            found[name] = p.detach().cpu().clone()
        return found

    try:
        return engine.llm.collective_rpc(collect)[0]
    finally:
        engine.llm.llm_engine.engine_core.shutdown()
