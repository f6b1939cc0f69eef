"""Hand-computed checks for the analytic roofline-decay model (specbench.analytic)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from specbench.analytic.acceptance import expected_tokens_from_rates, expected_tokens_per_pass
from specbench.analytic.drafting import draft_prefill_time, draft_time, eagle_head_profile
from specbench.analytic.profile_fit import DraftSample, StepSample, fit_draft_overhead, fit_hardware_profile
from specbench.analytic.profiles import HardwareProfile, ModelProfile, ridge_point
from specbench.analytic.speedup import batch_decode_time, batch_tail, best_k, break_even_batch_size, end_to_end_speedup, mean_tpot, num_speculative_tokens_per_batch_size, predicted_decode_speedup
from specbench.stats.acceptance import fit_alpha
from specbench.analytic.steps import plain_batch_time, plain_decode_step, prefill_time, step_time, verify_step

HARDWARE_DIR = Path(__file__).resolve().parents[1] / "conf" / "hardware"

SMOLLM2_135M = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
QWEN25_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
AWQ_4BIT = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}


def load_hardware(name: str) -> HardwareProfile:
    raw = yaml.safe_load((HARDWARE_DIR / f"{name}.yaml").read_text())
    return HardwareProfile.from_mapping(raw)


@pytest.fixture(scope="module")
def qwen() -> ModelProfile:
    return ModelProfile.from_config_json(QWEN25_7B)


@pytest.fixture(scope="module")
def smol() -> ModelProfile:
    return ModelProfile.from_config_json(SMOLLM2_135M)


@pytest.fixture(scope="module")
def h200() -> HardwareProfile:
    """The H200's datasheet figures (4.8 TB/s, 989 TFLOP/s, 0.1 ms per step, a plain max()
    roofline): the theory's closed forms need round numbers, not conf/hardware/h200.yaml's fit."""
    return HardwareProfile("h200", 4800e9, 989e12, 1e-4, "vendor", kv_bandwidth=4800e9, attention_flops=989e12)


def no_overhead(hw: HardwareProfile) -> HardwareProfile:
    return HardwareProfile(hw.name, hw.memory_bandwidth, hw.peak_flops, 0.0, hw.source)


# --------------------------------------------------------------------------- acceptance


@pytest.mark.parametrize(("alpha", "expected"), [(0.5, 1.9375), (0.7, 2.7731), (0.9, 4.0951)])
def test_expected_tokens_reference_values(alpha: float, expected: float) -> None:
    assert expected_tokens_per_pass(alpha, 4) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.5, 0.7, 0.9, 0.99, 0.999999, 1.0])
@pytest.mark.parametrize("k", [0, 1, 2, 4, 8, 16])
def test_closed_form_equals_sum(alpha: float, k: int) -> None:
    assert expected_tokens_per_pass(alpha, k) == pytest.approx(sum(alpha**i for i in range(k + 1)))


def test_expected_tokens_edges() -> None:
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(0.8, 0) == 1.0


def test_expected_tokens_from_rates() -> None:
    # vLLM PR #23563's EAGLE K=3 cumulative rates: 1 + 0.66 + 0.36 + 0.17.
    assert expected_tokens_from_rates([0.66, 0.36, 0.17]) == pytest.approx(2.19)
    assert expected_tokens_from_rates([1.0, 1.0, 1.0]) == 4.0
    assert expected_tokens_from_rates([]) == 1.0
    geometric = [0.7 ** (i + 1) for i in range(4)]
    assert expected_tokens_from_rates(geometric) == pytest.approx(expected_tokens_per_pass(0.7, 4))


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.55, 0.8, 0.95, 1.0])
def test_fit_alpha_recovers_geometric_rates(alpha: float) -> None:
    assert fit_alpha([alpha ** (i + 1) for i in range(5)]) == pytest.approx(alpha, abs=1e-9)


def test_fit_alpha_non_geometric_hand_case() -> None:
    # L'(a) = 2(a - 0.6) + 4a(a^2 - 0.15) = 0 at a = 0.5: -0.1 + 0.1 = 0, and 0.6^2 != 0.15.
    assert fit_alpha([0.6, 0.15]) == pytest.approx(0.5, abs=1e-9)
    assert fit_alpha([0.42]) == pytest.approx(0.42, abs=1e-9)


def test_fit_alpha_is_a_least_squares_minimum() -> None:
    rates = [0.66, 0.36, 0.17]
    alpha = fit_alpha(rates)

    def loss(a: float) -> float:
        return sum((a ** (i + 1) - r) ** 2 for i, r in enumerate(rates))

    assert 0.36 < alpha < 0.66
    assert loss(alpha) < loss(alpha - 1e-4) and loss(alpha) < loss(alpha + 1e-4)


# --------------------------------------------------------------------------- model profiles


def test_smollm2_profile(smol: ModelProfile) -> None:
    layer = 576 * (2 * 576 + 2 * 192) + 3 * 576 * 1536
    assert smol.layer_matmul_params == layer
    # Tied embeddings: one vocab x hidden matrix; two norms per layer plus the final one.
    assert smol.num_params == 49152 * 576 + 30 * (layer + 2 * 576) + 576 == 134_515_008
    assert smol.bytes_per_weight == 2.0 and smol.kv_bytes_per_element == 2.0
    assert smol.weight_bytes == 2 * 134_515_008
    assert smol.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
    # The LM head is a matmul even when tied, so it counts once.
    assert smol.flops_per_token == 2 * (30 * layer + 49152 * 576)


def test_qwen25_7b_profile(qwen: ModelProfile) -> None:
    layer = 3584 * (2 * 3584 + 2 * 512) + 3 * 3584 * 18944
    qkv_bias = 3584 + 2 * 512
    expected = 2 * 152064 * 3584 + 28 * (layer + qkv_bias + 2 * 3584) + 3584
    assert qwen.num_params == expected == 7_615_616_512
    assert qwen.head_dim == 128 and qwen.num_kv_heads == 4
    assert qwen.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2


def test_awq_profile_quarters_the_linear_weights(qwen: ModelProfile) -> None:
    awq_config = {**QWEN25_7B, "quantization_config": AWQ_4BIT}
    awq = ModelProfile.from_config_json(awq_config, dtype="float16")
    assert awq.num_params == qwen.num_params
    assert awq.kv_bytes_per_element == 2.0
    linears = qwen.num_layers * qwen.layer_matmul_params
    unquantized_bytes = 2.0 * (qwen.num_params - linears)
    linear_bytes = awq.weight_bytes - unquantized_bytes
    assert linear_bytes == pytest.approx(linears * (0.5 + 2.5 / 128))
    assert 3.5 < (2.0 * linears) / linear_bytes < 4.0
    # A linear-dominated model (small vocab) averages just over half a byte per weight.
    llama = ModelProfile.from_config_json({**LLAMA2_7B, "quantization_config": AWQ_4BIT})
    assert 0.5 < llama.bytes_per_weight < 0.6
    gptq = {**AWQ_4BIT, "quant_method": "gptq"}
    assert ModelProfile.from_config_json({**LLAMA2_7B, "quantization_config": gptq}) == llama


def test_profile_defaults_dtype_and_biases() -> None:
    profile = ModelProfile.from_config_json(LLAMA2_7B, dtype="float32", name="llama-2-7b")
    assert profile.name == "llama-2-7b"
    assert profile.num_kv_heads == 32 and profile.head_dim == 128
    assert profile.bytes_per_weight == 4.0 and profile.kv_bytes_per_element == 4.0
    with_bias = ModelProfile.from_config_json({**LLAMA2_7B, "attention_bias": True})
    assert with_bias.num_params - profile.num_params == 32 * 4 * 4096


def test_profile_from_path_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "SmolLM2-135M"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMOLLM2_135M))
    from_folder = ModelProfile.from_config_json(folder)
    assert from_folder.name == "SmolLM2-135M"
    assert from_folder == ModelProfile.from_config_json(str(folder / "config.json"))
    assert from_folder.num_params == 134_515_008


# --------------------------------------------------------------------------- hardware profiles


@pytest.mark.parametrize(
    ("name", "bandwidth", "peak"),
    [("rtx4090", 1008e9, 165.2e12), ("h200", 4800e9, 989e12), ("a100", 2039e9, 312e12)],
)
def test_hardware_yaml_loads(name: str, bandwidth: float, peak: float) -> None:
    raw = yaml.safe_load((HARDWARE_DIR / f"{name}.yaml").read_text())
    assert raw["memory_gb"] > 0 and "datasheet" in raw["sources"]
    profile = HardwareProfile.from_mapping(raw)
    assert profile.name == name
    # Effective rates: what the kernels reach, below the datasheet (bandwidth, peak), never above.
    assert 0.5 * bandwidth < profile.memory_bandwidth < bandwidth
    assert 0.3 * peak < profile.peak_flops < peak
    assert profile.kv_read_bandwidth <= profile.memory_bandwidth
    assert 1.0 < profile.overlap_exponent < math.inf
    # The fixed cost of a 28-layer pass is milliseconds (kernel latency per layer), not the 0.1 ms once assumed.
    assert 1e-3 < 28 * profile.per_layer_overhead_s + profile.fixed_overhead_s < 5e-3


def test_hardware_from_mapping_names_the_bad_key() -> None:
    good = {"name": "x", "source": "vendor", "memory_bandwidth_gbps": 1000,
            "peak_tflops": 100, "fixed_overhead_ms": 0.1}
    with pytest.raises(ValueError, match="peak_tflops"):
        HardwareProfile.from_mapping({k: v for k, v in good.items() if k != "peak_tflops"})
    with pytest.raises(ValueError, match="memory_bandwidth_gbps"):
        HardwareProfile.from_mapping({**good, "memory_bandwidth_gbps": -5})
    with pytest.raises(ValueError, match="fixed_overhead_ms"):
        HardwareProfile.from_mapping({**good, "fixed_overhead_ms": "fast"})
    with pytest.raises(ValueError, match="source"):
        HardwareProfile.from_mapping({**good, "source": "guessed"})


def test_ridge_point(qwen: ModelProfile, h200: HardwareProfile) -> None:
    n_star = ridge_point(qwen, h200)
    assert n_star == pytest.approx(989e12 / 4800e9 * qwen.streamed_weight_bytes / qwen.flops_per_token)
    assert 150 < n_star < 300


# --------------------------------------------------------------------------- step time


def test_step_time_memory_bound_then_compute_bound(smol: ModelProfile) -> None:
    hw = HardwareProfile("toy", 1e12, 1e14, 1e-4, "vendor")
    # n = 1: reading 269 MB takes 269 us, computing 0.27 GFLOP takes 2.7 us; each token's
    # activations move through the multiplies at the same bandwidth.
    act = smol.activation_bytes_per_token
    assert step_time(smol, hw, num_tokens=1, num_seqs=1, context_len=0) == pytest.approx(
        smol.streamed_weight_bytes / 1e12 + act / 1e12 + 1e-4
    )
    assert step_time(smol, hw, num_tokens=4096, num_seqs=64, context_len=0) == pytest.approx(
        4096 * smol.flops_per_token / 1e14 + 4096 * act / 1e12 + 1e-4
    )
    # The KV cache is read on top of the weights, at the same bandwidth on a GPU profile.
    kv = 8 * 1000 * smol.kv_bytes_per_token
    attention = 4 * 8 * 1000 * 30 * 9 * 64
    assert step_time(smol, hw, num_tokens=8, num_seqs=8, context_len=1000) == pytest.approx(
        smol.streamed_weight_bytes / 1e12 + 8 * act / 1e12 + kv / 1e12 + attention / 1e14 + 1e-4
    )


def test_step_time_prices_each_kernel_at_its_own_rate(smol: ModelProfile) -> None:
    # A CPU-like profile: KV reads and attention slower than the weight stream, a cost per sequence.
    hw = HardwareProfile("cpu", 30e9, 0.3e12, 15e-3, "calibrated", per_seq_overhead_s=1e-3,
                         kv_bandwidth=10e9, attention_flops=0.05e12)
    for tokens, seqs, context in ((1, 1, 100), (32, 32, 1000), (288, 32, 1000), (2048, 4, 256)):
        linear = tokens * smol.flops_per_token
        kv = seqs * context * smol.kv_bytes_per_token
        attention = 4 * tokens * context * 30 * 9 * 64
        expected = (15e-3 + 1e-3 * seqs + max(smol.streamed_weight_bytes / 30e9, linear / 0.3e12)
                    + tokens * smol.activation_bytes_per_token / 30e9 + kv / 10e9 + attention / 0.05e12)
        assert step_time(smol, hw, num_tokens=tokens, num_seqs=seqs, context_len=context) == pytest.approx(expected)
    # A verify pass of 32 sequences x 9 tokens pays the per-sequence cost once per sequence, not per token.
    verify = verify_step(smol, hw, 32, 8, 1000)
    plain = plain_decode_step(smol, hw, 32, 1000)
    assert verify - plain < 9 * plain - 8 * (15e-3 + 32e-3)
    # An unmeasurable cost (a fitted rate of inf) is free.
    free = replace(hw, kv_bandwidth=math.inf, attention_flops=math.inf)
    assert step_time(smol, free, num_tokens=1, num_seqs=1, context_len=5000) == pytest.approx(
        16e-3 + (smol.streamed_weight_bytes + smol.activation_bytes_per_token) / 30e9)


def test_plain_and_verify_steps(qwen: ModelProfile, h200: HardwareProfile) -> None:
    assert plain_decode_step(qwen, h200, 8, 512) == step_time(
        qwen, h200, num_tokens=8, num_seqs=8, context_len=512
    )
    assert verify_step(qwen, h200, 8, 3, 512) == step_time(
        qwen, h200, num_tokens=32, num_seqs=8, context_len=512
    )
    # Only drafted tokens are verified: 8 sequences x (1 + 1.5 drafted on average).
    assert verify_step(qwen, h200, 8, 3, 512, draft_tokens_per_pass=1.5) == step_time(
        qwen, h200, num_tokens=20, num_seqs=8, context_len=512
    )
    assert verify_step(qwen, h200, 8, 3, 512, draft_tokens_per_pass=0.0) == plain_decode_step(
        qwen, h200, 8, 512
    )
    with pytest.raises(ValueError, match="draft_tokens_per_pass"):
        verify_step(qwen, h200, 8, 3, 512, draft_tokens_per_pass=3.5)


def test_prefill_runs_in_steps_of_at_most_max_step_tokens(smol: ModelProfile) -> None:
    hw = HardwareProfile("toy", 1e12, 1e14, 1e-3, "vendor")
    head = 2.0 * smol.vocab_size * smol.hidden_size  # LM head FLOPs per token
    one_step = prefill_time(smol, hw, 4, 500, max_step_tokens=4096)
    # Compute-bound here; logits only at the 4 prompts' last positions, not at all 2000 tokens.
    assert one_step == pytest.approx(
        step_time(smol, hw, num_tokens=2000, num_seqs=4, context_len=250) - (2000 - 4) * head / hw.peak_flops
    )
    # 32 x 500 = 16000 tokens: 4 steps of 4000 (8 logits each), each paying the fixed overhead.
    assert prefill_time(smol, hw, 32, 500, max_step_tokens=4096) == pytest.approx(
        4 * (step_time(smol, hw, num_tokens=4000, num_seqs=32, context_len=250) - (4000 - 8) * head / hw.peak_flops)
    )
    # Compute-bound: eight times the prompts cost about eight times as long.
    assert 7 < prefill_time(smol, hw, 32, 500, max_step_tokens=4096) / one_step < 9


def test_a_plain_batch_is_its_prefill_then_one_step_per_token_after_the_first(smol: ModelProfile) -> None:
    hw = HardwareProfile("toy", 1e12, 1e14, 1e-3, "vendor")
    # 4 prompts of 500 tokens, 33 tokens each: the prefill emits the first, 32 decode
    # steps at the mean context 500 + 33 / 2 emit the rest.
    assert plain_batch_time(smol, hw, 4, 500, 33, max_step_tokens=4096) == pytest.approx(
        prefill_time(smol, hw, 4, 500, max_step_tokens=4096) + 32 * plain_decode_step(smol, hw, 4, 516.5)
    )
    assert plain_batch_time(smol, hw, 4, 500, 1, max_step_tokens=4096) == pytest.approx(
        prefill_time(smol, hw, 4, 500, max_step_tokens=4096))
    with pytest.raises(ValueError, match="output_tokens"):
        plain_batch_time(smol, hw, 4, 500, 0, max_step_tokens=4096)


def test_tpot_carries_the_prefill_steps_that_run_beside_a_requests_decode() -> None:
    tpot = lambda passes, outputs, s: mean_tpot(passes, outputs, lambda b: 0.1, prefill_steps=s,  # noqa: E731
                                                mixed_step_s=1.0)
    # One prefill step: no request decodes beside another's prefill. 20 tokens after the first in 10 passes.
    assert tpot([[10.0] * 3], [[21] * 3], 1) == pytest.approx(0.05)
    # Three steps: the three requests' prefills end in step 1, 2, 3, so they decode beside 2, 1, 0 of them.
    # Plainly, 20 passes each, 1 of them mixed on average ...
    assert tpot([[20.0] * 3], [[21] * 3], 3) == pytest.approx((1.0 + 19 * 0.1) / 20)
    # ... speculative at 2 tokens a pass, 10 passes of which 1 mixed.
    assert tpot([[10.0] * 3], [[21] * 3], 3) == pytest.approx((1.0 + 9 * 0.1) / 20)
    # A request cannot decode beside more steps than it has passes: 1 token after the first, 5 steps, 5 requests.
    assert tpot([[1.0] * 5], [[2] * 5], 5) == pytest.approx(0.8 * 1.0 + 0.2 * 0.1)
    # The shared steps dilute a TPOT ratio towards 1: 2x per pass becomes 1.53x.
    ratio = tpot([[20.0] * 3], [[21] * 3], 3) / tpot([[10.0] * 3], [[21] * 3], 3)
    assert ratio == pytest.approx(2.9 / 1.9) and 1.0 < ratio < 2.0
    with pytest.raises(ValueError, match="prefill_steps"):
        tpot([[20.0] * 3], [[21] * 3], 0)


def test_tpot_follows_the_batch_as_it_thins() -> None:
    per_sequence = lambda b: 0.1 * b  # noqa: E731  (a step over b sequences)
    # Two requests of 10 tokens after the first: one needs 5 passes, the other 10, the last 5 of them alone.
    thinning = mean_tpot([[5.0, 10.0]], [[11, 11]], per_sequence)
    assert thinning == pytest.approx((5 * 0.2 + (5 * 0.2 + 5 * 0.1)) / 20)
    # Below the full-batch price of the mean request (7.5 passes at batch 2): the straggler steps alone.
    assert thinning < 7.5 * per_sequence(2) / 10
    # Equal passes: no thinning, every pass at the full batch.
    assert mean_tpot([[7.5, 7.5]], [[11, 11]], per_sequence) == pytest.approx(7.5 * 0.2 / 10)
    # Weighted by tokens, as the measured tpot_s_mean: total decode time over total tokens.
    assert mean_tpot([[2.0], [8.0]], [[3], [9]], per_sequence) == pytest.approx((2 * 0.1 + 8 * 0.1) / 10)
    # One-token requests have no TPOT and add nothing (nor do they decode beside the others); a batch of only
    # those has no TPOT at all.
    assert mean_tpot([[4.0, 0.0]], [[5, 1]], per_sequence) == pytest.approx(4 * 0.1 / 4)
    with pytest.raises(ValueError, match="no TPOT"):
        mean_tpot([[0.0]], [[1]], per_sequence)
    with pytest.raises(ValueError, match="one pass count per request"):
        mean_tpot([[1.0, 2.0]], [[3]], per_sequence)


def test_end_to_end_speedup_is_decode_speedup_diluted_by_prefill() -> None:
    assert end_to_end_speedup(2.0, 0.0, 10.0) == pytest.approx(2.0)
    assert end_to_end_speedup(2.0, 10.0, 10.0) == pytest.approx(20 / 15)
    assert end_to_end_speedup(0.5, 10.0, 10.0) == pytest.approx(20 / 30)
    assert end_to_end_speedup(3.0, 1e9, 1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="decode_speedup"):
        end_to_end_speedup(0.0, 1.0, 1.0)


# --------------------------------------------------------------------------- draft and speedup


def test_draft_time_by_method(
    qwen: ModelProfile, smol: ModelProfile, h200: HardwareProfile
) -> None:
    common = {"hw": h200, "batch_size": 4, "k": 3, "context_len": 256}
    assert draft_time("baseline", **common) == 0.0
    assert draft_time("ngram", **common) == 0.0
    assert draft_time("draft_model", draft=smol, **common) == pytest.approx(
        3 * plain_decode_step(smol, h200, 4, 256)
    )
    eagle = draft_time("eagle", target=qwen, **common)
    eagle3 = draft_time("eagle3", target=qwen, **common)
    # One layer plus the LM head: far cheaper than the target, dearer than nothing.
    assert 0.0 < eagle < eagle3 < 3 * plain_decode_step(qwen, h200, 4, 256)
    head_bytes = 2 * (qwen.layer_matmul_params + 2 * 3584**2 + 152064 * 3584)
    head_bytes += 4 * 256 * qwen.kv_bytes_per_token / 28
    attention = 4 * 4 * 256 * 28 * 128  # the head's one layer over 4 sequences' 256-token contexts
    assert eagle == pytest.approx(
        3 * (head_bytes / h200.memory_bandwidth + attention / h200.peak_flops + h200.fixed_overhead_s))


def test_a_draft_pass_pays_its_own_overhead_where_the_profile_has_one(
    qwen: ModelProfile, smol: ModelProfile, h200: HardwareProfile
) -> None:
    # A draft pass runs inside the engine step: it pays draft_overhead_s, not the step's overhead.
    cheap = replace(h200, draft_overhead_s=0.0)
    for method, kw in (("eagle3", {"target": qwen}), ("draft_model", {"draft": smol})):
        full = draft_time(method, hw=h200, batch_size=2, k=4, context_len=300, **kw)
        free = draft_time(method, hw=cheap, batch_size=2, k=4, context_len=300, **kw)
        assert full - free == pytest.approx(4 * h200.fixed_overhead_s)
        prompt = {"hw": h200, "batch_size": 2, "prompt_len": 100, "max_step_tokens": 64}  # 4 prefill steps
        full = draft_prefill_time(method, **prompt, **kw)
        free = draft_prefill_time(method, **{**prompt, "hw": cheap}, **kw)
        assert full - free == pytest.approx(4 * h200.fixed_overhead_s)
    assert h200.draft_overhead_s is None and h200.draft_pass_overhead_s == h200.fixed_overhead_s
    mapped = HardwareProfile.from_mapping({"name": "x", "source": "calibrated", "memory_bandwidth_gbps": 30,
                                           "peak_tflops": 0.15, "fixed_overhead_ms": 18, "draft_overhead_ms": 4})
    assert mapped.draft_pass_overhead_s == pytest.approx(4e-3)
    with pytest.raises(ValueError, match="draft_overhead_ms"):
        HardwareProfile.from_mapping({"name": "x", "source": "calibrated", "memory_bandwidth_gbps": 30,
                                      "peak_tflops": 0.15, "fixed_overhead_ms": 18, "draft_overhead_ms": -1})


def test_draft_overhead_fit_recovers_a_known_machine(smol: ModelProfile) -> None:
    truth = HardwareProfile("cpu", 30e9, 0.15e12, 18e-3, "calibrated", draft_overhead_s=3.5e-3)
    head = eagle_head_profile(smol, "eagle3", replace(smol, num_layers=1, draft_vocab_size=4096))
    samples = [
        DraftSample(batch_size=b, k=k, context_len=ctx, seconds=verify_step(smol, truth, b, k, ctx)
                    + draft_time("eagle3", hw=truth, batch_size=b, k=k, context_len=ctx, draft=head, target=smol))
        for b, k, ctx in ((1, 3, 524), (4, 3, 524), (8, 2, 100))
    ]
    target_only = replace(truth, draft_overhead_s=None)
    overhead, residuals = fit_draft_overhead(samples, method="eagle3", target=smol, head=head, hw=target_only)
    assert overhead == pytest.approx(3.5e-3, rel=1e-9)
    assert max(abs(r) for r in residuals) < 1e-9
    # Passes faster than the target's fit allows for: the overhead floors at 0, the residuals say so.
    fast = [replace(s, seconds=s.seconds / 3) for s in samples]
    overhead, residuals = fit_draft_overhead(fast, method="eagle3", target=smol, head=head, hw=target_only)
    assert overhead == 0.0 and min(residuals) > 0.5
    with pytest.raises(ValueError, match="EAGLE"):
        fit_draft_overhead(samples, method="ngram", target=smol, head=None, hw=target_only)


def test_free_draft_speedup_equals_e_at_batch_one(
    qwen: ModelProfile, h200: HardwareProfile
) -> None:
    e = expected_tokens_per_pass(0.7, 4)
    hw = no_overhead(h200)
    # Memory-bound at 1 and 5 tokens: both passes read the same weights; the verify pass moves
    # four more tokens' activations (0.2% of the weights), so S is E less that.
    speedup = predicted_decode_speedup(
        method="ngram", k=4, batch_size=1, tokens_per_pass=e, target=qwen, hw=hw, context_len=0
    )
    weights, act = qwen.streamed_weight_bytes, qwen.activation_bytes_per_token
    assert speedup == pytest.approx(e * (weights + act) / (weights + 5 * act), rel=1e-12)
    assert speedup == pytest.approx(e, rel=3e-3)


def test_draft_model_speedup_matches_leviathan(
    qwen: ModelProfile, smol: ModelProfile, h200: HardwareProfile
) -> None:
    e = expected_tokens_per_pass(0.8, 3)
    hw = no_overhead(h200)
    # Every pass memory-bound: each costs the bytes it streams (weights, and its tokens' activations).
    def pass_bytes(model: ModelProfile, tokens: int) -> float:
        return model.streamed_weight_bytes + tokens * model.activation_bytes_per_token
    c = pass_bytes(smol, 1) / pass_bytes(qwen, 1)
    speedup = predicted_decode_speedup(method="draft_model", k=3, batch_size=1, tokens_per_pass=e,
                                target=qwen, hw=hw, context_len=0, draft=smol)
    assert speedup == pytest.approx(e / (3 * c + pass_bytes(qwen, 4) / pass_bytes(qwen, 1)), rel=1e-12)


def test_baseline_and_k0_speedup_is_one(qwen: ModelProfile, h200: HardwareProfile) -> None:
    for method, k in [("baseline", 4), ("ngram", 0)]:
        assert predicted_decode_speedup(method=method, k=k, batch_size=64, tokens_per_pass=1.0,
                                 target=qwen, hw=h200, context_len=100) == 1.0


@pytest.mark.parametrize(
    ("hw_name", "config", "falls_below_one"),
    [
        ("h200", QWEN25_7B, True),
        ("rtx4090", QWEN25_7B, True),
        # 135M weights next to 1024 KV tokens per sequence: the KV read keeps even
        # batch-1024 verification memory-bound, so speculation stays free (MagicDec).
        ("rtx4090", SMOLLM2_135M, False),
    ],
)
def test_speedup_decays_monotonically_with_batch(
    hw_name: str, config: dict, falls_below_one: bool
) -> None:
    model, hw = ModelProfile.from_config_json(config), load_hardware(hw_name)
    e = expected_tokens_per_pass(0.7, 4)
    curve = [
        predicted_decode_speedup(method="ngram", k=4, batch_size=b, tokens_per_pass=e,
                          target=model, hw=hw, context_len=1024)
        for b in range(1, 1025)
    ]
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in zip(curve, curve[1:]))
    assert curve[0] == pytest.approx(e, rel=0.05)
    assert (curve[-1] < 1.0) == falls_below_one


def test_break_even_batch_size() -> None:
    # Crosses halfway (in speedup) between 4 and 8: 2^2.5.
    assert break_even_batch_size([1, 2, 4, 8], [2.0, 1.5, 1.2, 0.8]) == pytest.approx(2**2.5)
    assert break_even_batch_size([1, 2, 4], [1.5, 1.0, 0.5]) == pytest.approx(2.0)
    assert break_even_batch_size([1, 2, 4], [2.0, 1.5, 1.1]) is None
    assert break_even_batch_size([4, 8], [0.9, 0.5]) == 4.0


def test_break_even_on_predicted_curve(qwen: ModelProfile, h200: HardwareProfile) -> None:
    batches = [2**i for i in range(11)]
    e = expected_tokens_per_pass(0.7, 4)
    speedups = [predicted_decode_speedup(method="ngram", k=4, batch_size=b, tokens_per_pass=e,
                                  target=qwen, hw=h200, context_len=1024) for b in batches]
    crossing = break_even_batch_size(batches, speedups)
    assert crossing is not None and 128 < crossing < 256


def test_best_k_shrinks_with_batch(qwen: ModelProfile, h200: HardwareProfile) -> None:
    common = {"candidate_ks": range(1, 9), "alpha": 0.8, "target": qwen, "hw": h200,
              "context_len": 512}
    k_small, s_small = best_k(method="ngram", batch_size=1, **common)
    assert k_small == 8 and s_small == pytest.approx(expected_tokens_per_pass(0.8, 8), rel=0.01)
    # Past the ridge verification costs compute; only the KV reads, paid once per sequence
    # however many tokens it verifies, still favour a short draft at long context.
    k_large, s_large = best_k(method="ngram", batch_size=4096, **common)
    assert k_large <= 1 and s_large < 1.1
    assert best_k(method="ngram", batch_size=4096, **{**common, "context_len": 16}) == (0, 1.0)
    k_eagle_small, _ = best_k(method="eagle", batch_size=1, **common)
    k_eagle_large, _ = best_k(method="eagle", batch_size=256, **common)
    assert k_eagle_small > k_eagle_large


def test_schedule_from_best_k() -> None:
    assert num_speculative_tokens_per_batch_size({1: 4, 4: 4, 16: 2, 64: 0}) == [
        (1, 15, 4), (16, 63, 2), (64, 64, 0)
    ]
    assert num_speculative_tokens_per_batch_size({16: 0, 2: 5, 8: 2}) == [
        (1, 7, 5), (8, 15, 2), (16, 16, 0)
    ]
    assert num_speculative_tokens_per_batch_size({4: 3, 8: 3}) == [(1, 8, 3)]


# --------------------------------------------------------------------------- calibration


Shape = tuple[int, int, float, "int | None"]


def synthetic(
    model: ModelProfile, hw: HardwareProfile, shapes: list[Shape], noise: list[float] | None = None
) -> list[StepSample]:
    noise = noise or [0.0] * len(shapes)
    samples = []
    for (n, s, c, logits), e in zip(shapes, noise):
        sample = StepSample(n, s, c, 1.0, logits)
        samples.append(replace(sample, seconds=(1 + e) * _truth_time(model, hw, sample)))
    return samples


def _truth_time(model: ModelProfile, hw: HardwareProfile, sample: StepSample) -> float:
    """What ``hw`` charges for the sample's pass: the work the fit charges, logits included."""
    from specbench.analytic.steps import pass_work, roofline_time
    return roofline_time(hw, pass_work(model, sample.num_tokens, sample.num_seqs, sample.context_len, logits=sample.logits))


# Decode steps (one token per sequence) at short and long contexts, small and
# large batches, and prefill steps (many tokens per sequence, logits at one):
# what the calibration measures, and what pins every rate.
CALIBRATION_SHAPES: list[Shape] = [
    (1, 1, 24, None), (8, 8, 24, None), (64, 64, 24, None), (1, 1, 1036, None), (16, 16, 1036, None),
    (4, 4, 524, None), (16, 1, 8, 1), (512, 1, 256, 1), (2048, 4, 256, 4), (1024, 1, 512, 1), (1024, 64, 8, 64),
]


def test_fit_recovers_synthetic_profile(smol: ModelProfile) -> None:
    truth = HardwareProfile("truth", 30e9, 0.3e12, 15e-3, "calibrated", per_seq_overhead_s=0.8e-3,
                            kv_bandwidth=10e9, attention_flops=0.05e12)
    samples = synthetic(smol, truth, CALIBRATION_SHAPES)
    profile, residuals = fit_hardware_profile(samples, smol, name="fit")
    assert profile.name == "fit" and profile.source == "calibrated"
    for field in ("memory_bandwidth", "peak_flops", "fixed_overhead_s", "per_seq_overhead_s",
                  "kv_bandwidth", "attention_flops"):
        assert getattr(profile, field) == pytest.approx(getattr(truth, field), rel=1e-3), field
    assert max(abs(r) for r in residuals) < 1e-6


def test_fit_recovers_a_gpu_whose_kv_and_attention_share_the_weight_rates(qwen: ModelProfile) -> None:
    truth = HardwareProfile("truth", 2.0e12, 300e12, 2e-4, "vendor")
    shapes = [(1, 1, 100, None), (8, 8, 500, None), (64, 16, 1000, None), (256, 64, 200, None),
              (1024, 256, 100, None), (2048, 512, 50, None), (4096, 4, 512, 4), (8192, 2, 2048, 2)]
    profile, residuals = fit_hardware_profile(synthetic(qwen, truth, shapes), qwen, name="fit")
    assert profile.memory_bandwidth == pytest.approx(truth.memory_bandwidth, rel=1e-3)
    assert profile.peak_flops == pytest.approx(truth.peak_flops, rel=1e-3)
    assert profile.kv_read_bandwidth == pytest.approx(truth.memory_bandwidth, rel=1e-3)
    assert profile.attention_peak_flops == pytest.approx(truth.peak_flops, rel=1e-3)
    assert profile.fixed_overhead_s == pytest.approx(truth.fixed_overhead_s, rel=1e-2)
    assert profile.per_seq_overhead_s == pytest.approx(0.0, abs=1e-9)
    assert max(abs(r) for r in residuals) < 1e-6


def test_fit_tolerates_noise(smol: ModelProfile) -> None:
    truth = HardwareProfile("truth", 30e9, 0.3e12, 15e-3, "calibrated", per_seq_overhead_s=0.8e-3,
                            kv_bandwidth=10e9, attention_flops=0.05e12)
    noise = [0.01, -0.01, 0.005, -0.005, 0.01, -0.01, 0.0, 0.01, -0.01, 0.005, -0.005]
    profile, residuals = fit_hardware_profile(synthetic(smol, truth, CALIBRATION_SHAPES, noise), smol, name="fit")
    assert profile.memory_bandwidth == pytest.approx(truth.memory_bandwidth, rel=0.1)
    assert profile.peak_flops == pytest.approx(truth.peak_flops, rel=0.1)
    assert max(abs(r) for r in residuals) < 0.02
    # What matters downstream: a verify pass far from every sample is priced within the noise.
    probe = StepSample(32 * 9, 32, 1000, 1.0)
    assert _truth_time(smol, profile, probe) == pytest.approx(_truth_time(smol, truth, probe), rel=0.05)


def test_fit_memory_bound_samples_pick_the_smallest_consistent_peak(qwen: ModelProfile) -> None:
    truth = HardwareProfile("truth", 4.8e12, 989e12, 5e-5, "vendor")
    shapes = [(1, 1, 100, None), (2, 2, 500, None), (4, 4, 1000, None), (8, 8, 2000, None),
              (16, 16, 300, None), (3, 3, 50, None)]
    profile, residuals = fit_hardware_profile(synthetic(qwen, truth, shapes), qwen, name="fit")
    assert max(abs(r) for r in residuals) < 1e-9
    # Every sample reads the same weights, but each token's activations stream at the same
    # bandwidth: the growth with tokens tells weight reads from the fixed overhead.
    assert profile.memory_bandwidth == pytest.approx(truth.memory_bandwidth, rel=1e-6)
    assert profile.fixed_overhead_s == pytest.approx(truth.fixed_overhead_s, rel=1e-4)
    assert math.isinf(profile.overlap_exponent)
    # The peak is only bounded below: the fit puts the most compute-heavy sample on the ridge.
    intensity = max(n * qwen.flops_per_token / qwen.streamed_weight_bytes for n, _, _, _ in shapes)
    assert profile.peak_flops == pytest.approx(intensity * profile.memory_bandwidth, rel=1e-6)
    assert profile.peak_flops < truth.peak_flops


# --------------------------------------------------------------------------- invalid input


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: expected_tokens_per_pass(1.5, 4), "alpha"),
        (lambda: expected_tokens_per_pass(math.nan, 4), "alpha"),
        (lambda: expected_tokens_per_pass(0.5, -1), "k"),
        (lambda: expected_tokens_per_pass(0.5, 2.0), "k"),
        (lambda: expected_tokens_from_rates([0.5, 1.2]), r"rates\[1\]"),
        (lambda: fit_alpha([]), "rates"),
        (lambda: fit_alpha([-0.1]), r"rates\[0\]"),
        (lambda: ModelProfile.from_config_json({**SMOLLM2_135M, "hidden_size": None}),
         "hidden_size"),
        (lambda: ModelProfile.from_config_json(SMOLLM2_135M, dtype="int8"), "dtype"),
        (lambda: ModelProfile.from_config_json(
            {**SMOLLM2_135M, "quantization_config": {"quant_method": "fp8"}}), "quant_method"),
        (lambda: ModelProfile.from_config_json(
            {**SMOLLM2_135M, "quantization_config": {"quant_method": "awq", "bits": 4}}),
         "group_size"),
        (lambda: ModelProfile.from_config_json("/nonexistent/model"), "config"),
        (lambda: HardwareProfile("x", 0.0, 1e12, 0.0, "vendor"), "memory_bandwidth"),
        (lambda: break_even_batch_size([1, 2], [1.0]), "equal length"),
        (lambda: break_even_batch_size([2, 2], [1.0, 0.5]), "strictly increasing"),
        (lambda: num_speculative_tokens_per_batch_size({}), "best_k_by_batch"),
        (lambda: num_speculative_tokens_per_batch_size({4: -1}), "K for batch size 4"),
    ],
)
def test_invalid_inputs_name_the_argument(call: Callable[[], object], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        call()


def test_invalid_step_and_method_inputs(qwen: ModelProfile, h200: HardwareProfile) -> None:
    with pytest.raises(ValueError, match="num_tokens"):
        step_time(qwen, h200, num_tokens=0, num_seqs=1, context_len=0)
    with pytest.raises(ValueError, match="num_tokens"):
        step_time(qwen, h200, num_tokens=2, num_seqs=4, context_len=0)
    with pytest.raises(ValueError, match="num_seqs"):
        step_time(qwen, h200, num_tokens=1, num_seqs=0, context_len=0)
    with pytest.raises(ValueError, match="context_len"):
        step_time(qwen, h200, num_tokens=1, num_seqs=1, context_len=-1)
    with pytest.raises(ValueError, match="batch_size"):
        plain_decode_step(qwen, h200, 0, 10)
    with pytest.raises(ValueError, match="method must be one of baseline, ngram"):
        draft_time("medusa", hw=h200, batch_size=1, k=2, context_len=0)
    with pytest.raises(ValueError, match="draft"):
        draft_time("draft_model", hw=h200, batch_size=1, k=2, context_len=0)
    with pytest.raises(ValueError, match="target"):
        draft_time("eagle", hw=h200, batch_size=1, k=2, context_len=0)
    with pytest.raises(ValueError, match="tokens_per_pass"):
        predicted_decode_speedup(method="ngram", k=2, batch_size=1, tokens_per_pass=3.5,
                          target=qwen, hw=h200, context_len=0)
    with pytest.raises(ValueError, match="samples"):
        fit_hardware_profile([StepSample(1, 1, 0, 1e-3)] * 5, qwen, name="x")
    with pytest.raises(ValueError, match=r"samples\[0\].seconds"):
        fit_hardware_profile([StepSample(1, 1, 0, 0.0)] * 6, qwen, name="x")


def test_drafters_prefill_the_prompts_too(smol: ModelProfile) -> None:
    from specbench.analytic.drafting import draft_prefill_time

    hw = HardwareProfile("toy", 1e12, 1e14, 1e-3, "vendor")
    common = dict(hw=hw, batch_size=4, prompt_len=500, max_step_tokens=4096)
    assert draft_prefill_time("ngram", **common) == 0.0
    assert draft_prefill_time("draft_model", draft=smol, **common) == prefill_time(smol, hw, 4, 500, 4096)
    eagle = draft_prefill_time("eagle", target=smol, **common)
    # One layer (plus fc) over the prompt tokens: far below the target's prefill, yet not free.
    assert 0.0 < eagle < prefill_time(smol, hw, 4, 500, 4096) / 4
    # The wall-time speedup pays it: (P + D) / (P + P_d + D / S).
    assert end_to_end_speedup(2.0, 10.0, 10.0, draft_prefill_s=5.0) == pytest.approx(20 / 20)


def test_a_batch_decodes_until_its_slowest_request_on_a_thinning_batch() -> None:
    # Passes 2, 5, 5: 2 steps of 3 sequences, then 3 steps of 2.
    assert batch_decode_time([5, 2, 5], lambda b: 10.0 * b) == pytest.approx(2 * 30 + 3 * 20)
    assert batch_decode_time([], lambda b: 1.0) == 0.0


def test_batch_tail_is_one_for_even_requests_and_grows_with_their_spread() -> None:
    constant = lambda b: 1.0  # noqa: E731  (a step that costs the same at any batch)
    assert batch_tail([[4, 4], [6, 6]], constant) == pytest.approx(1.0)
    # max / mean per batch, weighted by each batch's even time: (4 + 6) / (3 + 3).
    assert batch_tail([[2, 4], [6, 0]], constant) == pytest.approx(10 / 6)
    # A thinner batch that steps faster pays less of the spread: (2 * 2 + 2 * 1) / (3 * 2).
    assert batch_tail([[2, 4]], lambda b: float(b)) == pytest.approx(1.0)
    assert 1.0 < batch_tail([[2, 4]], lambda b: 1.0 + 0.1 * b) < 4 / 3


def test_end_to_end_speedup_pays_each_sides_tail() -> None:
    # (P + g_p D) / (P + P_d + g_s D / S) = (10 + 1.0 * 10) / (10 + 0 + 1.5 * 10 / 2)
    assert end_to_end_speedup(2.0, 10.0, 10.0, plain_tail=1.0, speculative_tail=1.5) == pytest.approx(20 / 17.5)
    assert end_to_end_speedup(2.0, 0.0, 10.0, plain_tail=1.2, speculative_tail=1.2) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="speculative_tail"):
        end_to_end_speedup(2.0, 1.0, 1.0, speculative_tail=0.5)


# --------------------------------------------------------------------------- overlap, per-layer cost, bounds


def test_overlap_blends_reads_and_compute_between_sum_and_max() -> None:
    from specbench.analytic.steps import overlap

    assert overlap(3.0, 1.0, math.inf) == 3.0
    assert overlap(3.0, 4.0, 1.0) == pytest.approx(7.0)
    assert overlap(3.0, 4.0, 2.0) == pytest.approx(5.0)
    assert overlap(4.0, 3.0, 2.5) == pytest.approx(overlap(3.0, 4.0, 2.5))
    # Between max and sum, and closer to max the larger the exponent; huge exponents do not overflow.
    assert 4.0 < overlap(3.0, 4.0, 2.5) < overlap(3.0, 4.0, 1.5) < 7.0
    assert overlap(3e-3, 4e-3, 400.0) == pytest.approx(4e-3)
    assert overlap(0.0, 0.0, 2.0) == 0.0


def test_fit_recovers_a_blended_roofline_with_a_per_layer_cost(qwen: ModelProfile) -> None:
    truth = HardwareProfile("truth", 4.0e12, 600e12, 0.0, "calibrated", per_layer_overhead_s=9e-5,
                            kv_bandwidth=2.5e12, overlap_exponent=2.5)
    shapes = [(b * q, b, c, None) for c in (512, 2048) for b in (1, 8, 64, 256) for q in (1, 3, 9)]
    profile, residuals = fit_hardware_profile(synthetic(qwen, truth, shapes), qwen, name="fit",
                                              shared_attention=True, per_layer_fixed=True)
    assert max(abs(r) for r in residuals) < 1e-6
    assert profile.overlap_exponent == 2.5 and profile.fixed_overhead_s == 0.0
    assert profile.per_layer_overhead_s == pytest.approx(9e-5, rel=1e-4)
    assert profile.memory_bandwidth == pytest.approx(4.0e12, rel=1e-4)
    assert profile.peak_flops == pytest.approx(600e12, rel=1e-4)
    # A one-layer draft head pays one layer's latency; a 28-layer pass 28 of them.
    head = eagle_head_profile(qwen, "eagle3")
    free = replace(truth, draft_overhead_s=0.0, per_layer_overhead_s=0.0)
    assert draft_time("eagle3", hw=replace(truth, draft_overhead_s=0.0), batch_size=1, k=1, context_len=0,
                      draft=head, target=qwen) - draft_time("eagle3", hw=free, batch_size=1, k=1, context_len=0,
                                                            draft=head, target=qwen) == pytest.approx(9e-5)


def test_draft_step_overhead_is_what_the_head_steps_leave_unexplained(qwen: ModelProfile) -> None:
    from specbench.analytic.profile_fit import fit_draft_step_overhead

    hw = HardwareProfile("gpu", 4.0e12, 600e12, 0.0, "calibrated", per_layer_overhead_s=9e-5, draft_overhead_s=0.0)
    head = eagle_head_profile(qwen, "eagle3")
    steps = [StepSample(b, b, c, draft_time("eagle3", hw=hw, batch_size=b, k=1, context_len=c, draft=head,
                                              target=qwen) + 5e-5) for b, c in ((1, 512), (16, 512), (64, 2048))]
    overhead, residuals = fit_draft_step_overhead(steps, method="eagle3", target=qwen, head=head, hw=hw)
    assert overhead == pytest.approx(5e-5) and max(abs(r) for r in residuals) < 1e-9
    with pytest.raises(ValueError, match="EAGLE"):
        fit_draft_step_overhead(steps, method="ngram", target=qwen, head=head, hw=hw)


def test_device_bounds_and_overlap_exponent_refuse_bad_values() -> None:
    from specbench.analytic.profile_fit import DeviceBounds

    with pytest.raises(ValueError, match="copy_bandwidth"):
        DeviceBounds(copy_bandwidth=0.0, matmul_flops=1e12)
    with pytest.raises(ValueError, match="overlap_exponent"):
        HardwareProfile("x", 1e9, 1e12, 0.0, "vendor", overlap_exponent=0.5)
    good = {"name": "x", "source": "vendor", "memory_bandwidth_gbps": 1000, "peak_tflops": 100,
            "fixed_overhead_ms": 0.1}
    assert math.isinf(HardwareProfile.from_mapping(good).overlap_exponent)
    assert HardwareProfile.from_mapping({**good, "overlap_exponent": 2.5, "per_layer_overhead_ms": 0.08}
                                        ).per_layer_overhead_s == pytest.approx(8e-5)
    with pytest.raises(ValueError, match="overlap_exponent"):
        HardwareProfile.from_mapping({**good, "overlap_exponent": 0.9})


def test_lookup_overhead_is_what_timed_ngram_passes_cost_beyond_their_verification():
    from specbench.analytic.profile_fit import LookupSample, fit_lookup_overhead

    smol = ModelProfile.from_config_json(SMOLLM2_135M, dtype="float32")
    hw = HardwareProfile(name="t", memory_bandwidth=15e9, peak_flops=0.3e12, fixed_overhead_s=0.001,
                         source="calibrated")
    # Passes that verified 0.5 and 2 drafted tokens, each 5 ms above their priced verification.
    samples = [LookupSample(1, 3, 524.0, verify_step(smol, hw, 1, 3, 524.0, d) + 0.005, d) for d in (0.5, 2.0)]
    overhead, residuals = fit_lookup_overhead(samples, target=smol, hw=hw)
    assert overhead == pytest.approx(0.005)
    assert residuals == pytest.approx([0.0, 0.0])
    # Passes cheaper than their verification leave no negative host work.
    cheap = [LookupSample(1, 3, 524.0, verify_step(smol, hw, 1, 3, 524.0, 1.0) * 0.9, 1.0)]
    assert fit_lookup_overhead(cheap, target=smol, hw=hw)[0] == 0.0
    with pytest.raises(ValueError, match="samples must not be empty"):
        fit_lookup_overhead([], target=smol, hw=hw)
