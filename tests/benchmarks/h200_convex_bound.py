"""How far can a step model convex in the tokens follow the H200 table? Prints figures; asserts nothing.

    .venv/bin/python tests/benchmarks/h200_convex_bound.py      (scipy: installed with the test extras)

The fitted profile misses two of the issue's maxima on tests/data/gpu-h200/ (verify / decode ratio
10%, composed speedup 15%) at one shape: 192 tokens, where cuBLAS changes kernels. This script asks
whether another form would do better, in two ways (docs/results/2026-12-04-gpu-step-model.md):

1. A linear program. The multiplies' time is a free convex, non-decreasing function of the tokens
   (every roofline is: max() or the blend of steps.overlap), plus free non-negative terms per
   sequence x context (KV reads), per token x context (attention) and per sequence. For each bound
   on every pass's step error it finds the smallest bound on every ratio error that some such model
   meets; the same without convexity (monotone only) for contrast.
2. A wave tail. Compute-bound multiplies run in waves of tiles; the last wave is on average half
   full, which adds Q x K_g FLOPs to multiply g (Q: outputs per wave, SMs x tile area; K_g: its
   reduction length). The term is added to the compute side of steps.roofline_time and fitted two
   ways: least squares over the step residuals (the calibration's criterion), and for the worst
   ratio (mean squared step residual + 10 x the largest ratio residual squared).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares, linprog, minimize

from specbench import gpu_timing
from specbench.analytic.profiles import ModelProfile
from specbench.analytic.steps import overlap, pass_work

DATA = Path(__file__).parents[1] / "data" / "gpu-h200"
TABLE = json.loads((DATA / "verify-passes-qwen2.5-7b-shape.json").read_text())
HEADS = {s["B"]: s["median_s"] for s in json.loads(
    (DATA / "eagle3-head-steps-qwen2.5-7b-shape.json").read_text())["steps"] if s["C"] == 512}
PASSES = {(p["B"], p["q"], p["C"]): p["median_s"] for p in TABLE["passes"]}
MODEL = ModelProfile.from_config_json(gpu_timing.table_shape(TABLE).config(), name="qwen2.5-7b-shape")
SHAPE = TABLE["shape"]
# Reduction lengths of one pass's multiplies: per layer QKV and gate-up (hidden), O (heads x head_dim)
# and down (FFN); then the LM head (hidden).
REDUCTION = SHAPE["layers"] * (2 * SHAPE["hidden"] + SHAPE["heads"] * SHAPE["head_dim"] + SHAPE["ffn"]) \
    + SHAPE["hidden"]
COPY, MATMUL = TABLE["copy_bandwidth_Bps"], TABLE["bf16_matmul_flops"]
ALPHA = 0.7


def smallest_ratio_bound(step_bound: float, convex: bool) -> float | None:
    """The smallest max ratio error some model of the family meets with every step within step_bound."""
    tokens = sorted({b * q for b, q, _ in PASSES})
    column = {m: i for i, m in enumerate(tokens)}
    n = len(tokens) + 3

    def row(b: int, q: int, c: int) -> np.ndarray:
        r = np.zeros(n)
        r[column[b * q]], r[-3], r[-2], r[-1] = 1.0, b * c, b * q * c, b
        return r

    def feasible(ratio_bound: float) -> bool:
        a, ub = [], []
        for (b, q, c), t in PASSES.items():
            a += [row(b, q, c), -row(b, q, c)]
            ub += [(1 + step_bound) * t, -(1 - step_bound) * t]
            if q > 1:
                r = t / PASSES[b, 1, c]
                a += [row(b, q, c) - (1 + ratio_bound) * r * row(b, 1, c),
                      (1 - ratio_bound) * r * row(b, 1, c) - row(b, q, c)]
                ub += [0.0, 0.0]
        for i in range(1, len(tokens)):
            r = np.zeros(n)
            r[i - 1], r[i] = 1.0, -1.0
            a.append(r)
            ub.append(0.0)
            if convex and i + 1 < len(tokens):
                left, right = tokens[i] - tokens[i - 1], tokens[i + 1] - tokens[i]
                r = np.zeros(n)
                r[i - 1], r[i], r[i + 1] = -1 / left, 1 / left + 1 / right, -1 / right
                a.append(r)
                ub.append(0.0)
        return linprog(np.zeros(n), A_ub=np.array(a), b_ub=np.array(ub), bounds=[(0, None)] * n,
                       method="highs").status == 0

    if not feasible(1.0):
        return None
    low, high = 0.0, 1.0
    while high - low > 1e-4:
        mid = (low + high) / 2
        low, high = (low, mid) if feasible(mid) else (mid, high)
    return high


def priced(x: np.ndarray, p: float, b: int, q: int, c: int) -> float:
    """Step seconds with a wave tail: x = (weight TB/s, matmul TFLOP/s, KV TB/s, ms per layer, Q in M)."""
    bandwidth, flops, kv, layer_ms, outputs = x[0] * 1e12, x[1] * 1e12, x[2] * 1e12, x[3], x[4] * 1e6
    w = pass_work(MODEL, b * q, b, c)
    compute = (w.linear_flops + outputs * REDUCTION) / flops
    return (layer_ms * 1e-3 * w.num_layers + overlap(w.weight_bytes / bandwidth, compute, p)
            + w.activation_bytes / bandwidth + w.kv_bytes / kv + w.attention_flops / flops)


def errors(x: np.ndarray, p: float) -> tuple[list[float], list[float], list[float]]:
    """Step, ratio and composed-speedup (ngram and EAGLE-3 with the timed head steps) relative errors."""
    step = [priced(x, p, *k) / t - 1 for k, t in PASSES.items()]
    ratio = [(priced(x, p, b, q, c) / priced(x, p, b, 1, c)) / (t / PASSES[b, 1, c]) - 1
             for (b, q, c), t in PASSES.items() if q > 1]
    speedup = []
    for k in (1, 2, 4, 8):
        for b, head in HEADS.items():
            for draft in (0.0, head):
                measured = PASSES[b, 1, 512] / (PASSES[b, k + 1, 512] + k * draft)
                speedup.append(priced(x, p, b, 1, 512) / (priced(x, p, b, k + 1, 512) + k * draft)
                               / measured - 1)
    return step, ratio, speedup


def line(label: str, x: np.ndarray, p: float) -> str:
    def both(e: list[float]) -> str:
        return f"{statistics.median(map(abs, e)):.1%} / {max(map(abs, e)):.1%}"

    step, ratio, speedup = errors(x, p)
    return (f"{label:<26} p={p:<4} {x[0]:.2f} TB/s {x[1]:.0f} TFLOP/s KV {x[2]:.2f} TB/s {x[3]:.4f} ms/layer "
            f"Q {x[4]:.2f} M | step {both(step)}, ratio {both(ratio)}, speedup {both(speedup)}")


STARTS = (np.array([4.0, 500, 2.5, 0.08, 1.0]), np.array([4.2, 650, 3.0, 0.08, 1.5]),
          np.array([4.26, 796, 2.5, 0.09, 2.5]))
LOWER, UPPER = [0.5, 50, 0.3, 0, 0], [1.05 * COPY / 1e12, 1.05 * MATMUL / 1e12, 1.05 * COPY / 1e12, 1, 20]


def least_squares_fit(p: float) -> np.ndarray:
    fits = [least_squares(lambda x: errors(x, p)[0], s, bounds=(LOWER, UPPER)) for s in STARTS]
    return min(fits, key=lambda f: f.cost).x


def worst_ratio_fit(p: float) -> np.ndarray:
    def loss(x: np.ndarray) -> float:
        if not all(lo <= v <= hi for lo, v, hi in zip(LOWER, x, UPPER)):
            return math.inf
        step, ratio, _ = errors(x, p)
        return float(np.mean(np.square(step)) + 10 * max(map(abs, ratio)) ** 2)

    fits = [minimize(loss, s, method="Nelder-Mead", options={"maxiter": 6000, "xatol": 1e-7, "fatol": 1e-10})
            for s in STARTS]
    return min(fits, key=lambda f: f.fun).x


def main() -> None:
    print("1. Smallest max ratio error any model of the family meets, for a bound on every step's error:")
    for step_bound in (0.05, 0.10, 0.15):
        found = {convex: smallest_ratio_bound(step_bound, convex) for convex in (True, False)}
        text = {c: "none exists" if v is None else f"{v:.1%}" for c, v in found.items()}
        print(f"   steps within {step_bound:.0%}: convex {text[True]}, monotone only {text[False]}")
    print(f"2. Wave tail (Q outputs per wave x {REDUCTION:,} reduction elements per pass), "
          "step / ratio / speedup errors as median / max:")
    for p in (2.5, 4.0, math.inf):
        print("   " + line("least squares", least_squares_fit(p), p))
    print("   " + line("for the worst ratio", worst_ratio_fit(math.inf), math.inf))


if __name__ == "__main__":
    main()
