"""Step time: the roofline price of a decode, verification or prefill pass on a hardware profile.

Units throughout: seconds, bytes, FLOPs, tokens. Standard library only: the model runs and is
tested without vLLM, torch or a GPU.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from specbench.analytic.checks import check_int, check_real
from specbench.analytic.profiles import HardwareProfile, ModelProfile


class PassWork(NamedTuple):
    """What one pass moves and computes, by the rate that prices it."""

    weight_bytes: float
    kv_bytes: float
    linear_flops: float
    attention_flops: float
    num_seqs: float
    activation_bytes: float = 0.0
    num_layers: float = 0.0


def overlap(read_s: float, compute_s: float, exponent: float) -> float:
    """Seconds of matrix multiplies that read for read_s and compute for compute_s:
    (read_s^p + compute_s^p)^(1/p), p = exponent (inf: max, the two fully overlapped)."""
    if math.isinf(exponent):
        return max(read_s, compute_s)
    longer = max(read_s, compute_s)
    if longer == 0.0:
        return 0.0
    # Scaled by the longer term so that large exponents cannot overflow.
    return longer * ((read_s / longer) ** exponent + (compute_s / longer) ** exponent) ** (1.0 / exponent)


def roofline_time(hw: HardwareProfile, work: PassWork, *, draft: bool = False) -> float:
    """Seconds of one pass (see :class:`HardwareProfile`); a draft pass pays only draft_pass_overhead_s.

    Why this form. It was chosen on two data sets: 50 passes of a 7B model
    timed on an H200 (tests/data/gpu-h200/, held in tests/test_gpu_h200.py)
    and this project's CPU calibration (SmolLM2-135M on 2 cores):

    - The fixed cost is real and large: about 2.4 ms per pass of a 28-layer
      model on the H200 even with the whole pass in one CUDA graph, 8 ms on
      2 CPU cores. On a GPU it is the kernels' own latency (a dozen small
      kernels per layer that each ramp up and drain), so it is charged per
      layer (per_layer_overhead_s): 0.087 ms a layer on the H200; an
      EAGLE-3 head step, one layer, measures 0.265 ms, of which its work
      explains 0.19. On a CPU it is vLLM's per-step host work, charged per
      step (fixed_overhead_s).
    - The multiplies do not switch sharply from weight-bound to compute-bound
      at the ridge. On the H200 a pass of 128 tokens (two thirds of the
      ridge, ~200 tokens at the measured 4.26 TB/s and 796 TFLOP/s) costs
      1.34x a batch-1 step, where max() says 1.0x: small-M tiles leave SMs
      idle and the weight stream and the tensor cores only partly overlap.
      One exponent p blends the two, (read^p + compute^p)^(1/p): a property
      of the device's kernels, the same in every regime. The fit finds 2.5
      on the H200 and 1.25 on the CPU (1 would be no overlap at all).
      Quantising the tokens to GEMM tiles (32 to 128) was tried and fitted
      worse; what no smooth form follows is the H200's cuBLAS kernel switch
      between 160 and 192 tokens (1.45x the time for 1.2x the tokens).
    - Activations add traffic that grows with the tokens (each multiply
      reads its input and writes its output): priced at the weights'
      bandwidth, no rate of its own.
    - Each sequence's KV cache and its attention FLOPs are priced apart: they
      grow with batch x context whatever the tokens per sequence.
    """
    overhead = (hw.draft_pass_overhead_s if draft
                else hw.fixed_overhead_s + hw.per_seq_overhead_s * work.num_seqs)
    overhead += hw.per_layer_overhead_s * work.num_layers
    return (
        overhead
        + overlap(work.weight_bytes / hw.memory_bandwidth, work.linear_flops / hw.peak_flops,
                  hw.overlap_exponent)
        + work.activation_bytes / hw.memory_bandwidth
        + work.kv_bytes / hw.kv_read_bandwidth
        + work.attention_flops / hw.attention_peak_flops
    )


def pass_work(
    model: ModelProfile, num_tokens: float, num_seqs: int, context_len: float, logits: float | None = None
) -> PassWork:
    """What one pass of ``model`` moves and computes; ``logits`` tokens (default: all) go through the LM head."""
    linear = num_tokens * model.flops_per_token
    if logits is not None:
        linear -= (num_tokens - logits) * 2.0 * model.vocab_size * model.hidden_size
    # QK^T and PV: each a head_dim-long multiply-add (2 FLOPs) per head, layer and cached token.
    per_context_token = 4.0 * model.num_layers * model.num_attention_heads * model.head_dim
    return PassWork(
        weight_bytes=model.streamed_weight_bytes,
        kv_bytes=num_seqs * context_len * model.kv_bytes_per_token,
        linear_flops=linear,
        attention_flops=num_tokens * context_len * per_context_token,
        num_seqs=num_seqs,
        activation_bytes=num_tokens * model.activation_bytes_per_token,
        num_layers=model.num_layers,
    )


def check_step(num_tokens: float, num_seqs: int, context_len: float) -> tuple[float, int, float]:
    num_seqs = check_int("num_seqs", num_seqs, 1)
    # Every sequence in the pass contributes at least one token. A mean over
    # passes (ngram drafts only some of them) need not be a whole number.
    num_tokens = check_real("num_tokens", num_tokens, num_seqs)
    return num_tokens, num_seqs, check_real("context_len", context_len, 0.0)


def step_time(
    model: ModelProfile, hw: HardwareProfile, *, num_tokens: float, num_seqs: int, context_len: float
) -> float:
    """Seconds for one forward pass of num_tokens tokens over num_seqs sequences.

    T = fixed_overhead_s + per_seq_overhead_s * num_seqs
        + overlap(weight_bytes / memory_bandwidth, num_tokens * flops_per_token / peak_flops)
        + num_tokens * activation_bytes_per_token / memory_bandwidth
        + num_seqs * context_len * kv_bytes_per_token / kv_bandwidth
        + 4 * num_tokens * context_len * num_layers * num_attention_heads * head_dim / attention_flops.
    context_len is the KV-cache length (tokens) each sequence attends to. The
    matrix multiplies read the weights once per pass, so they are weight-bound
    at few tokens and compute-bound at many, with a gradual bend between
    (:func:`overlap`, :func:`roofline_time` says why); attention reads each sequence's own
    KV cache, a cost that grows with batch x context whatever the batch, so
    it is priced apart, at its own rates.
    """
    num_tokens, num_seqs, context_len = check_step(num_tokens, num_seqs, context_len)
    return roofline_time(hw, pass_work(model, num_tokens, num_seqs, context_len))


def plain_decode_step(
    model: ModelProfile, hw: HardwareProfile, batch_size: int, context_len: float
) -> float:
    """Seconds for one plain decode step: step_time with num_tokens = num_seqs = batch_size."""
    batch_size = check_int("batch_size", batch_size, 1)
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
    k = check_int("k", k, 0)
    batch_size = check_int("batch_size", batch_size, 1)
    drafted = k if draft_tokens_per_pass is None else check_real(
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
    steps, num_tokens = prefill_steps(batch_size, prompt_len, max_step_tokens)
    return steps * roofline_time(
        hw, pass_work(model, num_tokens, batch_size, prompt_len / 2.0, logits=batch_size / steps)
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
    output_tokens = check_int("output_tokens", output_tokens, 1)
    step = plain_decode_step(model, hw, batch_size, prompt_len + output_tokens / 2.0)
    return prefill_time(model, hw, batch_size, prompt_len, max_step_tokens) + (output_tokens - 1) * step


def prefill_steps(batch_size: int, prompt_len: float, max_step_tokens: int) -> tuple[int, float]:
    """How many equal steps prefill the batch, and the tokens in each."""
    batch_size = check_int("batch_size", batch_size, 1)
    prompt_len = check_real("prompt_len", prompt_len, 1.0)
    max_step_tokens = check_int("max_step_tokens", max_step_tokens, 1)
    total = batch_size * prompt_len
    steps = math.ceil(total / max_step_tokens)
    return steps, max(total / steps, batch_size)
