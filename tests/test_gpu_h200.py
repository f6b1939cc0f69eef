"""The step model held against passes timed on a real GPU: one H200, a Qwen2.5-7B shape.

The table (tests/data/gpu-h200/, copied from the project's shared/data/gpu-h200/; SOURCE.md says how
it was measured) holds 50 decode and verify passes (B sequences x q tokens over C = 512 or 2048
cached tokens) and 9 EAGLE-3 draft steps. The fit is the one ``python -m specbench.gpu_timing fit``
runs: bounded by the device's measured copy bandwidth and matmul rate.

One cell is outside what a smooth model can follow, and the tests say so rather than hide it: at
B x q = 192 tokens cuBLAS switches kernels and the pass costs 1.45x the 160-token one (2.9 ms more
for 20% more tokens), then barely more up to 288 tokens. The model, monotone in the tokens,
underprices those two passes (B = 64, q = 3) by 12-16%; every threshold below is asserted on the
other cells, and these two are asserted to be the only ones beyond 10%.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from specbench import gpu_timing
from specbench.analytic.drafting import draft_time, eagle_head_profile
from specbench.analytic.profiles import HardwareProfile, ModelProfile
from specbench.analytic.steps import step_time

DATA = Path(__file__).parent / "data" / "gpu-h200"
HARDWARE = Path(__file__).parents[1] / "specbench" / "conf" / "hardware"
CLIFF_TOKENS = 192  # B x q where cuBLAS changes kernels on the H200 (see the module docstring)
ALPHA = 0.7


@pytest.fixture(scope="module")
def table() -> dict:
    return json.loads((DATA / "verify-passes-qwen2.5-7b-shape.json").read_text())


@pytest.fixture(scope="module")
def head_table() -> dict:
    return json.loads((DATA / "eagle3-head-steps-qwen2.5-7b-shape.json").read_text())


@pytest.fixture(scope="module")
def target(table: dict) -> ModelProfile:
    return ModelProfile.from_config_json(gpu_timing.table_shape(table).config(), name="qwen2.5-7b-shape")


@pytest.fixture(scope="module")
def head(table: dict, head_table: dict, target: ModelProfile) -> ModelProfile:
    config = dict(gpu_timing.table_shape(table).config(), num_hidden_layers=1,
                  draft_vocab_size=head_table["draft_vocab"])
    return eagle_head_profile(target, "eagle3", ModelProfile.from_config_json(config, name="eagle3-head"))


@pytest.fixture(scope="module")
def fitted(table: dict, head_table: dict) -> tuple[HardwareProfile, list[str]]:
    profile, _, warnings, _ = gpu_timing.fit_table(table, head_table["steps"], name="h200-fit")
    return profile, warnings


def passes(table: dict) -> dict[tuple[int, int, int], float]:
    return {(p["B"], p["q"], p["C"]): p["median_s"] for p in table["passes"]}


def step(model: ModelProfile, hw: HardwareProfile, batch: int, q: int, context: int) -> float:
    return step_time(model, hw, num_tokens=batch * q, num_seqs=batch, context_len=context)


def step_errors(table: dict, model: ModelProfile, hw: HardwareProfile) -> dict[tuple[int, int, int], float]:
    return {k: step(model, hw, *k) / t - 1.0 for k, t in passes(table).items()}


def ratio_errors(table: dict, model: ModelProfile, hw: HardwareProfile) -> dict[tuple[int, int, int], float]:
    """Verify pass over plain decode step at the same B and C: predicted / measured - 1."""
    t = passes(table)
    return {(b, q, c): (step(model, hw, b, q, c) / step(model, hw, b, 1, c)) / (t[b, q, c] / t[b, 1, c]) - 1.0
            for (b, q, c) in t if q > 1}


def speedup_errors(
    table: dict, head_table: dict, model: ModelProfile, head: ModelProfile, hw: HardwareProfile
) -> dict[tuple[str, int, int], float]:
    """E(alpha, K) T(B, 1) / (T(B, K+1) + K T_head(B)) from the model against the same from the
    timed costs, for ngram (T_head = 0) and EAGLE-3, K = 1, 2, 4, 8, B = 1 ... 256 at C = 512."""
    t = passes(table)
    heads = {s["B"]: s["median_s"] for s in head_table["steps"] if s["C"] == 512}
    out = {}
    for method in ("ngram", "eagle3"):
        for k in (1, 2, 4, 8):
            e = (1 - ALPHA ** (k + 1)) / (1 - ALPHA)
            for b, measured_head in heads.items():
                priced_head = draft_time("eagle3", hw=hw, batch_size=b, k=1, context_len=512, draft=head,
                                         target=model) if method == "eagle3" else 0.0
                measured_head = measured_head if method == "eagle3" else 0.0
                measured = e * t[b, 1, 512] / (t[b, k + 1, 512] + k * measured_head)
                predicted = e * step(model, hw, b, 1, 512) / (step(model, hw, b, k + 1, 512) + k * priced_head)
                out[method, k, b] = predicted / measured - 1.0
    return out


def summary(errors: dict) -> tuple[float, float]:
    values = [abs(e) for e in errors.values()]
    return statistics.median(values), max(values)


def off_cliff(errors: dict, tokens: Callable[[tuple], int]) -> dict:
    return {k: e for k, e in errors.items() if tokens(k) != CLIFF_TOKENS}


def test_fitted_rates_stay_within_what_the_h200_measured(table: dict, fitted: tuple) -> None:
    profile, warnings = fitted
    assert profile.memory_bandwidth <= 1.05 * table["copy_bandwidth_Bps"]
    assert profile.peak_flops <= 1.05 * table["bf16_matmul_flops"]
    assert profile.kv_read_bandwidth <= profile.memory_bandwidth
    # Neither rate needed its ceiling: the fit found them, the bound did not make them.
    assert not [w for w in warnings if "bound" in w]
    # The fixed cost is the kernels' latency: about 2 ms for 28 layers at batch 1, with CUDA graphs.
    assert 1.5e-3 < 28 * profile.per_layer_overhead_s < 3e-3


def test_fitted_step_time_reproduces_the_table(table: dict, target: ModelProfile, fitted: tuple) -> None:
    errors = step_errors(table, target, fitted[0])
    median, worst = summary(off_cliff(errors, lambda k: k[0] * k[1]))
    assert median <= 0.05 and worst <= 0.15
    # Beyond 10%: only the kernel-switch passes, and the model underprices them.
    beyond = {k: e for k, e in errors.items() if abs(e) > 0.10}
    assert beyond and all(b * q == CLIFF_TOKENS and e < 0 for (b, q, _), e in beyond.items())
    assert summary(errors)[0] <= 0.05


def test_verify_over_decode_ratio(table: dict, target: ModelProfile, fitted: tuple) -> None:
    errors = ratio_errors(table, target, fitted[0])
    assert summary(off_cliff(errors, lambda k: k[0] * k[1]))[1] <= 0.10
    # The decay is real: at 128 tokens a verify pass already costs more than the decode step
    # it replaces (B = 64, q = 2: 1.10x measured), where a max() roofline says 1.00x.
    t = passes(table)
    assert step(target, fitted[0], 64, 2, 512) / step(target, fitted[0], 64, 1, 512) == pytest.approx(
        t[64, 2, 512] / t[64, 1, 512], rel=0.05)


def test_composed_decode_speedup(
    table: dict, head_table: dict, target: ModelProfile, head: ModelProfile, fitted: tuple
) -> None:
    errors = speedup_errors(table, head_table, target, head, fitted[0])
    assert len(errors) == 40
    median, worst = summary(off_cliff(errors, lambda key: key[2] * (key[1] + 1)))
    assert median <= 0.05 and worst <= 0.15


def test_fit_on_the_short_context_carries_to_the_long_one(table: dict, target: ModelProfile) -> None:
    short = dict(table, passes=[p for p in table["passes"] if p["C"] == 512])
    profile, _, _, _ = gpu_timing.fit_table(short, name="h200-512")
    long = {k: e for k, e in step_errors(table, target, profile).items() if k[2] == 2048}
    assert len(long) == 15 and summary(long)[1] <= 0.15


def test_shipped_h200_profile_against_the_table(table: dict, target: ModelProfile) -> None:
    shipped = HardwareProfile.from_mapping(yaml.safe_load((HARDWARE / "h200.yaml").read_text()))
    median, _ = summary(step_errors(table, target, shipped))
    assert median <= 0.05
    assert summary(off_cliff(ratio_errors(table, target, shipped), lambda k: k[0] * k[1]))[1] <= 0.10
    # The datasheet profile it replaces (4.8 TB/s, 989 TFLOP/s, 0.1 ms, max()) was 46% low.
    datasheet = HardwareProfile("h200", 4800e9, 989e12, 1e-4, "vendor")
    assert summary(step_errors(table, target, datasheet))[0] > 0.4
