"""What a pass costs: the hardware profile (roofline rates and overheads) and the model profile
(weights, KV cache and FLOPs per token, read from a config.json).

Units throughout: seconds, bytes, FLOPs, tokens. Standard library only: the model runs and is
tested without vLLM, torch or a GPU.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from specbench.analytic.checks import check_int, check_real


_DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
_HALF_BYTES = 2.0
_QUANT_METHODS = ("awq", "gptq")


@dataclass(frozen=True)
class HardwareProfile:
    """What one accelerator costs per forward pass, in the roofline's terms.

    A pass (:func:`step_time`) costs, in seconds,

        fixed_overhead_s + per_seq_overhead_s * num_seqs
        + overlap(weight bytes / memory_bandwidth, linear FLOPs / peak_flops)
        + activation bytes / memory_bandwidth
        + KV-cache bytes / kv_bandwidth + attention FLOPs / attention_flops

    where overlap(a, b) = (a^p + b^p)^(1/p) with p = overlap_exponent: how
    fully the matrix multiplies hide their weight reads behind their compute
    (p = inf: max(a, b), perfect overlap; p = 1: a + b, none; see
    :func:`specbench.analytic.steps.roofline_time` for why measured GPUs sit
    near p = 2.5).

    memory_bandwidth in bytes/s and peak_flops in FLOP/s (dense, at the dtype
    the model runs in) price the weight-bound and compute-bound matrix
    multiplies; kv_bandwidth (bytes/s) the KV-cache reads that grow with
    batch x context, attention_flops (FLOP/s) the QK^T and PV products: on
    a GPU the same memory and the same units (None: memory_bandwidth and
    peak_flops), on a CPU attention kernels that run at their own rates.
    fixed_overhead_s is paid once per engine step (kernel launch, scheduler,
    sampler time that does not scale with work), per_layer_overhead_s once
    per decoder layer of every pass, draft passes included (on a GPU, the
    latency of each layer's small kernels, CUDA graphs or not: it moves with
    the model's depth, not its width), per_seq_overhead_s once per
    sequence in it (sampling over the vocabulary, per-request bookkeeping:
    negligible on a GPU, a millisecond on a CPU).
    draft_overhead_s is the fixed cost of a draft pass (an EAGLE head's or a
    draft model's forward inside a step): it skips the scheduler and the
    sampler's bookkeeping, so it can be far below fixed_overhead_s; None (a
    vendor profile, or a calibration without a head to time) charges each
    draft pass the full fixed_overhead_s, an upper bound.
    head_overheads holds a draft pass's fixed cost timed on each head
    (method name, seconds): calibrate times every EAGLE head the model
    ships, since their passes differ in more than the work the model prices
    (EAGLE-1 reads the target's LM head, EAGLE-3 its own reduced one through
    the d2t map, behind an fc over three layers' states); a drafter of
    another method pays draft_overhead_s (:meth:`for_drafter`). A head's
    entry may be below 0: its passes measured cheaper than the roofline
    prices its work, and the entry is that correction
    (:func:`specbench.analytic.profile_fit.fit_draft_overhead`, signed).
    An ``ngram`` entry is the host work of one prompt-lookup step instead,
    paid once per step (:class:`specbench.analytic.drafting.LookupDraft`).
    head_step_overheads holds, per head (method name, seconds, signed), what
    its draft costs once per speculative step whatever K: the proposer's
    set-up, the hidden states' hand-over, the first pass over the accepted
    positions. calibrate fits it beside the per-pass entry from passes timed
    at two K (:func:`specbench.analytic.profile_fit.fit_draft_costs`); a head
    without one (a profile timed at one K) pays 0, as it always did.
    source is "vendor" (datasheet figures) or "calibrated" (fitted on the
    device by fit_hardware_profile).
    model_runner is the vLLM model runner that device runs (:data:`MODEL_RUNNERS`):
    vLLM 0.32 runs Model Runner V2 on CUDA and V1 on the CPU build, and the
    two verify n-gram drafts differently (:func:`specbench.analytic.drafting.verified_draft_tokens`).
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
    overlap_exponent: float = math.inf
    per_layer_overhead_s: float = 0.0
    model_runner: str = "V1"
    head_overheads: tuple[tuple[str, float], ...] = ()
    head_step_overheads: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        for method, seconds in self.head_overheads:
            check_real(f"head_overheads[{method!r}]", seconds, -math.inf)  # a correction: any finite number
        for method, seconds in self.head_step_overheads:
            check_real(f"head_step_overheads[{method!r}]", seconds, -math.inf)
        if self.model_runner not in MODEL_RUNNERS:
            raise ValueError(f"model_runner must be one of {', '.join(MODEL_RUNNERS)}, got {self.model_runner!r}")
        check_real("per_layer_overhead_s", self.per_layer_overhead_s, 0.0)
        check_real("memory_bandwidth", self.memory_bandwidth, 0.0, low_open=True)
        if not (isinstance(self.overlap_exponent, numbers.Real) and not isinstance(self.overlap_exponent, bool)
                and self.overlap_exponent >= 1.0):
            raise ValueError(f"overlap_exponent must be a number >= 1 or inf, got {self.overlap_exponent!r}")
        check_real("peak_flops", self.peak_flops, 0.0, low_open=True)
        check_real("fixed_overhead_s", self.fixed_overhead_s, 0.0)
        check_real("per_seq_overhead_s", self.per_seq_overhead_s, 0.0)
        if self.draft_overhead_s is not None:
            check_real("draft_overhead_s", self.draft_overhead_s, 0.0)
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

    def for_drafter(self, method: str) -> HardwareProfile:
        """This profile as a drafter of ``method`` pays it: its draft passes at the overhead timed on that
        method's head where :attr:`head_overheads` has one, else this profile unchanged. A negative one
        is no overhead (0 here): the head's cost model subtracts it from the pass
        (:class:`specbench.analytic.drafting.EagleHeadCost`)."""
        timed = dict(self.head_overheads).get(method)
        return self if timed is None else replace(self, draft_overhead_s=max(timed, 0.0))

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
        per_layer_overhead_ms (milliseconds per decoder layer and pass),
        head_draft_overhead_ms (method name -> milliseconds: a draft pass's
        fixed cost timed on that method's head),
        head_draft_step_overhead_ms (method name -> milliseconds: that head's
        draft cost once per speculative step; absent: 0),
        overlap_exponent (>= 1; absent or .inf: reads and compute overlap
        fully, the max() of a plain roofline), notes, model_runner (absent:
        :func:`device_model_runner`). Other keys (e.g. memory_gb, the
        sources) are ignored.
        """
        for key in ("name", "source", "memory_bandwidth_gbps", "peak_tflops", "fixed_overhead_ms"):
            if key not in d:
                raise ValueError(f"hardware profile is missing key {key!r}")

        def optional(key: str, scale: float, *, low_open: bool) -> float | None:
            if d.get(key) is None:
                return None
            if d[key] == math.inf:
                return math.inf
            return scale * check_real(key, d[key], 0.0, low_open=low_open)

        return cls(
            name=str(d["name"]),
            memory_bandwidth=1e9 * check_real(
                "memory_bandwidth_gbps", d["memory_bandwidth_gbps"], 0.0, low_open=True
            ),
            peak_flops=1e12 * check_real("peak_tflops", d["peak_tflops"], 0.0, low_open=True),
            fixed_overhead_s=1e-3 * check_real("fixed_overhead_ms", d["fixed_overhead_ms"], 0.0),
            source=str(d["source"]),
            notes=str(d.get("notes", "")),
            draft_overhead_s=optional("draft_overhead_ms", 1e-3, low_open=False),
            per_seq_overhead_s=optional("per_sequence_overhead_ms", 1e-3, low_open=False) or 0.0,
            kv_bandwidth=optional("kv_bandwidth_gbps", 1e9, low_open=True),
            attention_flops=optional("attention_tflops", 1e12, low_open=True),
            per_layer_overhead_s=optional("per_layer_overhead_ms", 1e-3, low_open=False) or 0.0,
            overlap_exponent=math.inf if d.get("overlap_exponent") is None else (
                math.inf if d["overlap_exponent"] == math.inf
                else check_real("overlap_exponent", d["overlap_exponent"], 1.0)),
            model_runner=str(d.get("model_runner") or device_model_runner(d)),
            head_overheads=_head_overheads(d.get("head_draft_overhead_ms")),
            head_step_overheads=_head_overheads(d.get("head_draft_step_overhead_ms"), "head_draft_step_overhead_ms"),
        )


def _head_overheads(value: object, key: str = "head_draft_overhead_ms") -> tuple[tuple[str, float], ...]:
    """``key`` (a mapping of method name to milliseconds, or absent) in seconds; each a
    finite number, below 0 for a head whose passes cost less than their priced work."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} must map method names to milliseconds, got {value!r}")
    return tuple((str(method), 1e-3 * check_real(f"{key}.{method}", ms, -math.inf))
                 for method, ms in sorted(value.items()))


MODEL_RUNNERS = ("V1", "V2")
"""vLLM's model runners: V1 (the CPU build's, and CUDA's for what V2 does not support:
:func:`specbench.methods.model_runner`) and V2 (vLLM 0.32 on CUDA)."""



def device_model_runner(d: Mapping) -> str:
    """The model runner vLLM 0.32 runs on the device a profile mapping describes.

    A GPU profile states its device memory (``memory_bytes``, a datasheet
    profile) or names a device other than a CPU (``device``, as calibration
    records it): V2. A CPU (a ``device`` starting "CPU", or neither key): V1.
    """
    device = str(d.get("device") or "")
    return "V2" if d.get("memory_bytes") or (device and not device.startswith("CPU")) else "V1"


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
    # Bytes of an input-embedding table apart from the LM head (untied): a pass gathers a
    # row per token from it instead of streaming it, so it is not read. 0: tied, or unknown.
    input_embedding_bytes: float = 0.0

    def __post_init__(self) -> None:
        check_real("input_embedding_bytes", self.input_embedding_bytes, 0.0)
        for field in (
            "num_params", "num_layers", "hidden_size", "intermediate_size",
            "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size",
        ):
            check_int(field, getattr(self, field), 1)
        check_real("bytes_per_weight", self.bytes_per_weight, 0.0, low_open=True)
        check_real("kv_bytes_per_element", self.kv_bytes_per_element, 0.0, low_open=True)

    @property
    def weight_bytes(self) -> float:
        """Bytes read per forward pass for the weights: num_params * bytes_per_weight."""
        return self.num_params * self.bytes_per_weight

    @property
    def streamed_weight_bytes(self) -> float:
        """Bytes of weights a forward pass reads: weight_bytes less an untied input-embedding table."""
        return self.weight_bytes - self.input_embedding_bytes

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
    def activation_bytes_per_token(self) -> float:
        """Bytes of activations one token moves through the matrix multiplies, in bytes/token.

        Each multiply reads its input and writes its output once, at the
        activation width kv_bytes_per_element (weights may be quantized,
        activations are not): per layer q/k/v (in: hidden; out: (heads + 2 *
        kv_heads) * head_dim), o (in: heads * head_dim; out: hidden), gate/up
        (in: hidden; out: 2 * intermediate), down (in: intermediate; out:
        hidden), and the LM head's logits (vocab). For a 7B model about 4.7
        MB per token: at a few hundred tokens per pass a tenth of the weights.
        """
        q_out = self.num_attention_heads * self.head_dim
        qkv_out = (self.num_attention_heads + 2 * self.num_kv_heads) * self.head_dim
        per_layer = 4 * self.hidden_size + qkv_out + q_out + 3 * self.intermediate_size
        return (self.num_layers * per_layer + self.vocab_size) * self.kv_bytes_per_element

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
            return check_int(key, value, 1)

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
            bits = check_int("quantization_config.bits", quant.get("bits"), 1)
            group = check_int("quantization_config.group_size", quant.get("group_size"), 1)
            per_linear = bits / 8 + (_HALF_BYTES + bits / 8) / group
            total_bytes = layer_linears * per_linear + (num_params - layer_linears) * _HALF_BYTES
            bytes_per_weight = total_bytes / num_params
        draft_vocab = cfg.get("draft_vocab_size")
        # Embeddings stay 16-bit in AWQ/GPTQ checkpoints, at the dtype width otherwise.
        embedding_width = _HALF_BYTES if quant is not None else _DTYPE_BYTES[dtype]
        untied_embedding = 0 if cfg.get("tie_word_embeddings", False) else vocab * hidden
        return replace(
            shape, num_params=num_params, bytes_per_weight=bytes_per_weight,
            input_embedding_bytes=untied_embedding * embedding_width,
            draft_vocab_size=None if draft_vocab is None else check_int("draft_vocab_size", draft_vocab, 1),
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
    return hw.peak_flops * model.streamed_weight_bytes / (hw.memory_bandwidth * model.flops_per_token)
