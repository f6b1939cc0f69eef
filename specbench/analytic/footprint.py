"""Engine memory: weights, KV cache, activations and CUDA graphs of a target and its drafter, the budget they
must fit, and the problems (or batch waves) when they do not.

Units throughout: seconds, bytes, FLOPs, tokens. Standard library only: the model runs and is
tested without vLLM, torch or a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specbench.analytic.checks import check_int, check_real
from specbench.analytic.profiles import ModelProfile


GIB = 1 << 30
"""Bytes in a GiB: vLLM's VLLM_CPU_KVCACHE_SPACE and device memory are counted in it."""

# vLLM's KV block size when the config leaves it to vLLM (the CUDA attention
# backends' default; a request occupies whole blocks).
DEFAULT_KV_BLOCK_SIZE = 16
# Logits are materialised in float32 for every sequence of a step before sampling.
_LOGIT_BYTES = 4
# What vLLM's CUDA-graph profiler charges each captured graph at least (driver overhead):
# _MIN_PER_GRAPH_BYTES in vllm/v1/worker/gpu/cudagraph_utils.py, 1 MiB in vLLM 0.32 (V1's
# profile_cudagraph_memory uses the same floor per captured size and mode).
GRAPH_OVERHEAD_BYTES = 1 << 20
# What one PIECEWISE graph (one compiled piece of the model at one size) holds beyond the shared pool:
# an assumed order of magnitude, not a measurement (no GPU has run specbench yet). A piecewise capture
# records one graph per piece between attention splits, num_layers + 1 per model, and vLLM logs of
# 7-8B models capturing ~67 sizes in well under a GiB put each near a quarter MiB. A GPU row's
# recorded graph memory is the figure to trust over it.
PIECE_GRAPH_BYTES = 1 << 18


def compiled_pieces(model: ModelProfile) -> int:
    """The pieces vLLM's piecewise compilation splits a model's forward into, one CUDA graph each per size:
    the code between attention ops (which run outside the graphs), num_layers + 1."""
    return model.num_layers + 1


def kv_bytes_per_token(models: Sequence[ModelProfile]) -> int:
    """KV-cache bytes one token costs across every model an engine runs.

    Sum of each model's kv_bytes_per_token (2 * layers * KV heads * head dim *
    width): vLLM v1 allocates the drafter's KV layers from the same pool as
    the target's, so a draft model or EAGLE head shrinks the tokens the pool
    holds. An integer number of bytes.
    """
    return int(sum(m.kv_bytes_per_token for m in models))


def request_kv_tokens(prompt_len: int, output_len: int, k: int, block_size: int) -> int:
    """KV slots one request occupies at its longest, in tokens (whole blocks).

    prompt_len + output_len tokens, plus the k lookahead slots vLLM reserves
    for drafted tokens on each step, rounded up to whole blocks of
    block_size tokens.
    """
    tokens = (
        check_int("prompt_len", prompt_len, 0)
        + check_int("output_len", output_len, 1)
        + check_int("k", k, 0)
    )
    block_size = check_int("block_size", block_size, 1)
    return math.ceil(tokens / block_size) * block_size


def activation_bytes(model: ModelProfile, *, step_tokens: int, num_seqs: int) -> int:
    """The activation peak of one forward pass, the margin vLLM profiles at start-up.

    vLLM runs a dummy pass of step_tokens tokens (its max_num_batched_tokens)
    and keeps the peak free of KV cache. Per token in flight at once: the
    gated MLP's gate and up outputs (2 * intermediate), the residual stream,
    its normed copy, attention output and MLP output (4 * hidden) and the
    q, k and v projections ((heads + 2 * kv_heads) * head_dim), at the KV
    dtype width (activations run in the compute dtype); plus float32 logits
    for num_seqs sequences (num_seqs * vocab * 4). A margin of the right
    order, not an allocator trace.
    """
    step_tokens = check_int("step_tokens", step_tokens, 1)
    num_seqs = check_int("num_seqs", num_seqs, 1)
    return int(step_tokens * _activation_bytes_per_token(model) + num_seqs * model.vocab_size * _LOGIT_BYTES)


def _activation_bytes_per_token(model: ModelProfile) -> float:
    """Bytes one token in flight holds in a forward pass (see :func:`activation_bytes`)."""
    per_token = (
        2 * model.intermediate_size
        + 4 * model.hidden_size
        + (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim
    )
    return per_token * model.kv_bytes_per_element


def cuda_graph_bytes(models: Sequence[ModelProfile], capture_sizes: Sequence[int], model_runner: str = "V2") -> int:
    """Device memory the CUDA graphs of an engine hold: what vLLM reserves before sizing the KV cache.

    vLLM 0.32 profiles it at start-up (``Worker.determine_available_memory``
    in ``vllm/v1/worker/gpu_worker.py`` subtracts the runner's ``profile_cudagraph_memory()``
    from the KV budget unless ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0``), under its default
    FULL_AND_PIECEWISE mode: a FULL graph and a PIECEWISE capture per size, FULL and PIECEWISE
    overlaid in one pool. The two runners account differently, and this follows each:

    - Model Runner V2 (``vllm/v1/worker/gpu/cudagraph_utils.py``) measures the PIECEWISE,
      speculator and encoder graphs in full, every size, and extrapolates only the FULL
      ones from the two largest: the first capture (the pool) plus (sizes - 1) x the
      second's cost, at least ``_MIN_PER_GRAPH_BYTES``.
    - V1 (``GPUModelRunner.profile_cudagraph_memory``) extrapolates both modes that way:
      per mode the first capture, then (sizes - 1) x max(the second capture, 1 MiB); the
      largest first capture is the pool. Where a size's graphs cost less than the floor, V1
      reserves more than V2.

    Without a device: the pool is the activations of one pass at the largest size
    (:func:`activation_bytes` per token, logits excluded: they are computed outside the graph),
    summed over the target and its drafter (the speculator's graphs are captured too); a FULL
    graph costs :data:`GRAPH_OVERHEAD_BYTES`; a PIECEWISE capture of one size is one graph per
    compiled piece (:func:`compiled_pieces`, of every model) at :data:`PIECE_GRAPH_BYTES`
    each, and on V1 at least :data:`GRAPH_OVERHEAD_BYTES`. 0 without capture sizes (eager
    engines, the CPU build).
    """
    if not capture_sizes:
        return 0
    if model_runner not in ("V1", "V2"):
        raise ValueError(f"model_runner must be V1 or V2, got {model_runner!r}")
    sizes = len(capture_sizes)
    largest = max(check_int("capture size", s, 1) for s in capture_sizes)
    pool = largest * sum(_activation_bytes_per_token(m) for m in models)
    piecewise_size = sum(compiled_pieces(m) for m in models) * PIECE_GRAPH_BYTES
    full = (sizes - 1) * GRAPH_OVERHEAD_BYTES
    if model_runner == "V2":  # every PIECEWISE graph measured
        piecewise = sizes * piecewise_size
    else:  # the first size measured, the others extrapolated from the second, with vLLM's floor per size
        piecewise = piecewise_size + (sizes - 1) * max(piecewise_size, GRAPH_OVERHEAD_BYTES)
    return int(pool + full + piecewise)


@dataclass(frozen=True)
class MemoryBudget:
    """The memory one engine may use, as vLLM decides it.

    On a GPU, vLLM may use total_bytes * utilization (gpu_memory_utilization);
    whatever the weights, the activation peak and runtime_bytes (CUDA
    context and other memory outside torch's allocator) leave becomes KV
    cache. On vllm-cpu the KV pool is fixed instead (VLLM_CPU_KVCACHE_SPACE):
    kv_pool_bytes; total_bytes is then the host's memory, and runtime_bytes
    the process floor (Python, torch and vLLM loaded, no model).
    """

    total_bytes: int
    utilization: float = 1.0
    runtime_bytes: int = 0
    kv_pool_bytes: int | None = None

    def __post_init__(self) -> None:
        check_int("total_bytes", self.total_bytes, 1)
        check_real("utilization", self.utilization, 0.0, 1.0, low_open=True)
        check_int("runtime_bytes", self.runtime_bytes, 0)
        if self.kv_pool_bytes is not None:
            check_int("kv_pool_bytes", self.kv_pool_bytes, 0)

    @property
    def usable_bytes(self) -> int:
        """total_bytes * utilization, rounded down: what the engine may occupy."""
        return int(self.total_bytes * self.utilization)


@dataclass(frozen=True)
class MemoryEstimate:
    """Where an engine's memory goes, and how many requests its KV cache holds.

    All sizes in bytes, token counts in tokens. kv_pool_bytes is the KV cache
    vLLM allocates (a fixed pool on CPU, what is left on a GPU; 0 when nothing
    is left); kv_capacity_tokens the tokens it holds, in whole blocks.
    """

    target_weight_bytes: int
    drafter_weight_bytes: int
    activation_bytes: int
    runtime_bytes: int
    kv_bytes_per_token: int
    block_size: int
    kv_pool_bytes: int
    request_tokens: int  # the cell's longest request (request_kv_tokens)
    # Each request of the cell's heaviest batch, longest first (request_kv_tokens each).
    batch_request_tokens: tuple[int, ...]
    max_model_len_tokens: int  # one request of max_model_len, in whole blocks
    batch_size: int
    usable_bytes: int
    kv_pool_fixed: bool  # vllm-cpu: the pool is set, not what is left
    # CUDA graphs: the sizes the engine captures (tokens) and the memory they hold; none when eager.
    capture_sizes: tuple[int, ...] = ()
    graph_bytes: int = 0

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV pool holds: whole blocks of block_size tokens."""
        block_bytes = self.kv_bytes_per_token * self.block_size
        return self.kv_pool_bytes // block_bytes * self.block_size

    @property
    def requests_fit(self) -> int:
        """Requests as long as the cell's longest the KV cache holds at once."""
        return self.kv_capacity_tokens // self.request_tokens

    @property
    def batch_tokens(self) -> int:
        """KV slots the cell's heaviest batch occupies with every request at its longest."""
        return sum(self.batch_request_tokens)

    @property
    def kv_bytes_needed(self) -> int:
        """KV bytes the cell's heaviest batch occupies at its longest."""
        return self.batch_tokens * self.kv_bytes_per_token

    @property
    def batch_at_once(self) -> int:
        """Requests of the heaviest batch the KV cache holds together, longest first.

        The batch's size when all fit; fewer means vLLM admits the rest as
        earlier ones finish (the batch runs in waves). Counting the longest
        first makes it the least concurrency the pool guarantees.
        """
        held, used = 0, 0
        for tokens in self.batch_request_tokens:
            if used + tokens > self.kv_capacity_tokens:
                break
            held, used = held + 1, used + tokens
        return held

    @property
    def fixed_bytes(self) -> int:
        """Everything but the KV cache: weights, activation peak, CUDA graphs and runtime."""
        return (self.target_weight_bytes + self.drafter_weight_bytes
                + self.activation_bytes + self.graph_bytes + self.runtime_bytes)

    @property
    def device_bytes(self) -> int:
        """What must fit before any KV cache: fixed_bytes, plus the pool where it is fixed."""
        return self.fixed_bytes + (self.kv_pool_bytes if self.kv_pool_fixed else 0)

    @property
    def peak_bytes(self) -> int:
        """Peak memory of the engine: fixed_bytes plus the whole KV pool (vLLM allocates it up front)."""
        return self.fixed_bytes + self.kv_pool_bytes


def engine_memory(
    target: ModelProfile,
    drafter: ModelProfile | None,
    budget: MemoryBudget,
    *,
    batch_size: int,
    prompt_len: int,
    output_len: int,
    k: int,
    max_model_len: int,
    step_tokens: int,
    block_size: int = DEFAULT_KV_BLOCK_SIZE,
    batch_prompt_lens: Sequence[int] | None = None,
    capture_sizes: Sequence[int] = (),
    model_runner: str = "V2",
) -> MemoryEstimate:
    """The memory model of one engine running one cell.

    Weights: target.weight_bytes and drafter.weight_bytes (None for
    baseline and ngram: no drafter, no bytes), rounded to whole bytes.
    Activation margin: activation_bytes of the target at step_tokens tokens
    and batch_size sequences (a drafter's pass is smaller and runs after
    the target's, so it adds nothing to the peak). KV bytes per token: summed
    over target and drafter (kv_bytes_per_token). KV pool:
    budget.kv_pool_bytes when fixed, else budget.usable_bytes minus weights,
    activations and budget.runtime_bytes (0 if negative). A request of the
    cell occupies request_kv_tokens(prompt, output_len, k, block_size), prompt
    one of batch_prompt_lens: the prompt lengths of the cell's heaviest batch,
    one per request, as measured or bounded by the caller. None prices
    batch_size prompts of prompt_len tokens (the longest the workload admits).
    CUDA graphs: cuda_graph_bytes of target and drafter at capture_sizes
    (empty for an eager engine) as model_runner accounts them, taken from the KV pool as vLLM takes them.
    """
    batch_size = check_int("batch_size", batch_size, 1)
    prompts = [prompt_len] * batch_size if batch_prompt_lens is None else list(batch_prompt_lens)
    if not prompts:
        raise ValueError("batch_prompt_lens must name at least one request")
    requests = sorted((request_kv_tokens(p, output_len, k, block_size) for p in prompts), reverse=True)
    max_model_len = check_int("max_model_len", max_model_len, 1)
    models = [target] + ([drafter] if drafter is not None else [])
    target_weights = int(round(target.weight_bytes))
    drafter_weights = int(round(drafter.weight_bytes)) if drafter is not None else 0
    activations = activation_bytes(target, step_tokens=step_tokens, num_seqs=batch_size)
    graphs = cuda_graph_bytes(models, capture_sizes, model_runner)
    if budget.kv_pool_bytes is not None:
        pool = budget.kv_pool_bytes
    else:
        pool = max(
            budget.usable_bytes - target_weights - drafter_weights - activations - graphs - budget.runtime_bytes,
            0,
        )
    return MemoryEstimate(
        target_weight_bytes=target_weights,
        drafter_weight_bytes=drafter_weights,
        activation_bytes=activations,
        runtime_bytes=budget.runtime_bytes,
        kv_bytes_per_token=kv_bytes_per_token(models),
        block_size=block_size,
        kv_pool_bytes=pool,
        request_tokens=requests[0],
        batch_request_tokens=tuple(requests),
        max_model_len_tokens=math.ceil(max_model_len / block_size) * block_size,
        batch_size=batch_size,
        usable_bytes=budget.usable_bytes,
        kv_pool_fixed=budget.kv_pool_bytes is not None,
        capture_sizes=tuple(capture_sizes),
        graph_bytes=graphs,
    )


@dataclass(frozen=True)
class MemoryProblem:
    """One reason an engine cannot run its cell: kind is "device", "max_model_len" or "request"."""

    kind: str
    message: str


def memory_problems(estimate: MemoryEstimate) -> list[MemoryProblem]:
    """Why an engine cannot run its cell at all; empty if it can.

    At most one problem, the first that applies:

    - "device": device_bytes (weights + activation peak + runtime, and the
      KV pool where it is fixed) exceed the usable memory;
    - "max_model_len": the KV cache holds less than one request of
      max_model_len, and vLLM refuses to start such an engine;
    - "request": the cell's longest request alone needs more KV slots than
      the cache holds, so vLLM can never schedule it.

    A batch that exceeds the KV cache while each request fits is not a
    problem: vLLM admits its requests as earlier ones finish (in waves; see
    :func:`batch_waves`).
    """
    e = estimate
    gb = 1e9
    if e.device_bytes > e.usable_bytes:
        pool = f" + KV pool {e.kv_pool_bytes / gb:.2f}" if e.kv_pool_fixed else ""
        graphs = f" + CUDA graphs {e.graph_bytes / gb:.2f}" if e.graph_bytes else ""
        return [MemoryProblem("device", (
            f"too big for the device: needs {e.device_bytes / gb:.1f} GB (weights "
            f"{e.target_weight_bytes / gb:.2f} + drafter {e.drafter_weight_bytes / gb:.2f} + activations "
            f"{e.activation_bytes / gb:.2f}{graphs} + runtime {e.runtime_bytes / gb:.2f}{pool}), "
            f"{e.usable_bytes / gb:.1f} GB usable"
        ))]
    capacity = e.kv_capacity_tokens
    if capacity < e.max_model_len_tokens:
        return [MemoryProblem("max_model_len", (
            f"KV cache below one request: {e.kv_pool_bytes / gb:.2f} GB holds {capacity} tokens at "
            f"{e.kv_bytes_per_token} B/token, one max_model_len request needs {e.max_model_len_tokens} "
            f"({e.max_model_len_tokens * e.kv_bytes_per_token / gb:.2f} GB); vLLM refuses to start"
        ))]
    if e.request_tokens > capacity:
        return [MemoryProblem("request", (
            f"KV cache below the longest request: it needs {e.request_tokens} tokens (prompt + output + K, "
            f"in blocks of {e.block_size}), {e.kv_pool_bytes / gb:.2f} GB left for KV holds {capacity} "
            f"at {e.kv_bytes_per_token} B/token; vLLM could never schedule it"
        ))]
    return []


def batch_waves(estimate: MemoryEstimate) -> str | None:
    """How the cell's heaviest batch overflows the KV cache, or None when it fits at once.

    Not a problem (see :func:`memory_problems`): vLLM runs such a batch in
    waves, so the cell measures fewer requests at a time than batch_size.
    """
    e = estimate
    if e.batch_tokens <= e.kv_capacity_tokens:
        return None
    return (
        f"batch_size={e.batch_size} needs up to {e.batch_tokens:,} KV tokens and the KV cache holds "
        f"{e.kv_capacity_tokens:,}: {e.batch_at_once} of its requests at once"
    )
