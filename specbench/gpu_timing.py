"""``python -m specbench.gpu_timing``: time a model's passes with torch alone, and fit a profile to them.

A GPU user gets a hardware profile in a minute, before installing vLLM:

    python -m specbench.gpu_timing time --model Qwen/Qwen2.5-7B-Instruct --out passes.json
    python -m specbench.gpu_timing fit passes.json --out ~/.cache/specbench/hardware/calibrated.yaml

``time`` builds a decoder of the model's shape (hidden, layers, heads, KV
heads, head dim, FFN, vocabulary: read from its config.json) with random
weights (a pass's time does not depend on their values) and times passes of
B sequences x q new tokens each over C cached tokens, as vLLM runs them on a
GPU: the whole pass captured in one CUDA graph, flash attention with the
grouped-query heads folded into the query block, a static KV cache, logits
for every token and their argmax. No scheduler, sampler or paged attention:
vLLM's step costs at least this. q = 1 is a plain decode step, q = K + 1 a
verify pass; the grid spans B x q from 1 to past the ridge at two contexts.
It also times one EAGLE-3 draft step (the head's decoder layer over
[embedding, hidden state], its own KV cache, an LM head over a reduced
vocabulary), and the device's copy bandwidth and matmul rate, which bound
the fit. This is the procedure that produced the project's H200 table
(tests/data/gpu-h200/).

On a machine without CUDA (the project's tests) the same passes run eagerly
on the CPU, timed with a wall clock, and attention takes PyTorch's default
kernel: the code path is exercised, the figures describe eager CPU PyTorch,
not a GPU.

``fit`` reads such a table (this command's, or the shared H200 one) and fits
:func:`specbench.analytic.profile_fit.fit_hardware_profile` bounded by the
measured rates, with attention at the matmul rate and the fixed cost per
layer, and the draft-step overhead apart; it prints the fit, its warnings, and writes the profile.

Only torch is imported (lazily, by ``time``); never vLLM.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specbench.analytic import drafting, profile_fit, profiles

# Tokens per sequence in a pass: plain decode, then verify passes of K = 1, 2, 4, 8.
DEFAULT_TOKENS_PER_SEQ = (1, 2, 3, 5, 9)
# Batch sizes per context: the short context spans B x q from 1 to 2304 tokens (past any
# GPU's ridge, ~100-400 tokens); the long one pins the KV reads.
DEFAULT_GRID = ((512, (1, 4, 16, 32, 64, 128, 256)), (2048, (1, 8, 64)))
HEAD_GRID = ((512, (1, 4, 16, 64, 256)), (2048, (1, 4, 16, 64)))
DEFAULT_DRAFT_VOCAB = 32000  # the EAGLE-3 heads' reduced vocabulary


@dataclass(frozen=True)
class Shape:
    """A Llama/Qwen2-style decoder's shape, what a pass's time depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    qkv_bias: bool = False
    tied: bool = False

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Shape:
        """From a Hugging Face config.json's keys; ValueError naming a missing one."""
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
            if key not in cfg:
                raise ValueError(f"config.json is missing key {key!r}")
        heads = int(cfg["num_attention_heads"])
        return cls(
            hidden=int(cfg["hidden_size"]), layers=int(cfg["num_hidden_layers"]), heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            ffn=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
            qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias")),
            tied=bool(cfg.get("tie_word_embeddings", False)),
        )

    def config(self) -> dict[str, Any]:
        """The config.json keys :meth:`profiles.ModelProfile.from_config_json` reads."""
        return {
            "model_type": "qwen2" if self.qkv_bias else "llama", "hidden_size": self.hidden,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "intermediate_size": self.ffn, "vocab_size": self.vocab, "tie_word_embeddings": self.tied,
        }


def table_shape(table: dict[str, Any]) -> Shape:
    """The shape a table was timed with (its "shape" keys, as time_passes.py writes them)."""
    s = table.get("shape")
    if not isinstance(s, dict):
        raise ValueError("table has no 'shape' mapping")
    try:
        return Shape(hidden=s["hidden"], layers=s["layers"], heads=s["heads"], kv_heads=s["kv_heads"],
                     head_dim=s["head_dim"], ffn=s["ffn"], vocab=s["vocab"],
                     qkv_bias=bool(table.get("qkv_bias", s.get("qkv_bias", True))), tied=bool(s.get("tied", False)))
    except KeyError as exc:
        raise ValueError(f"table shape is missing key {exc.args[0]!r}") from None


class _Timer:
    """Times a pass: CUDA graph replays with CUDA events on a GPU, eager calls with a wall clock on a CPU."""

    def __init__(self, torch: Any, device: str, reps: int) -> None:
        self.torch, self.cuda, self.reps = torch, device.startswith("cuda"), reps

    def __call__(self, run: Callable[[], Any]) -> tuple[float, float]:
        torch = self.torch
        if not self.cuda:
            for _ in range(2):
                run()
            times = []
            for _ in range(self.reps):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            return statistics.median(times), min(times)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        for _ in range(3):
            graph.replay()
        times = []
        for _ in range(self.reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        del graph
        torch.cuda.empty_cache()
        return statistics.median(times), min(times)


def device_rates(device: str, dtype: str, *, copy_bytes: int | None = None,
                 matmul_size: int | None = None) -> tuple[float, float]:
    """The device's copy bandwidth (bytes/s, read + write) and dense matmul rate (FLOP/s) at ``dtype``.

    A copy of copy_bytes and a matmul_size^3 matmul, each the best of 5 after
    2 warm-ups: what the device reaches, the ceiling a fitted rate may not pass.
    Defaults: 1 GiB and 8192 on a GPU; 256 MiB (far past any CPU cache) and
    2048 (0.1 s a product on 2 cores) on a CPU.
    """
    import torch

    cuda = device.startswith("cuda")
    copy_bytes = copy_bytes or (1 << 30 if cuda else 1 << 28)
    matmul_size = matmul_size or (8192 if cuda else 2048)

    dt = getattr(torch, dtype)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    src = torch.empty(copy_bytes // torch.finfo(dt).bits * 8, device=device, dtype=dt)
    dst = torch.empty_like(src)

    def best(run: Callable[[], Any]) -> float:
        for _ in range(2):
            run()
        sync()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            run()
            sync()
            times.append(time.perf_counter() - start)
        return min(times)

    bandwidth = 2 * src.numel() * src.element_size() / best(lambda: dst.copy_(src))
    del src, dst
    a = torch.randn(matmul_size, matmul_size, device=device, dtype=dt)
    b = torch.randn(matmul_size, matmul_size, device=device, dtype=dt)
    flops = 2 * matmul_size ** 3 / best(lambda: a @ b)
    del a, b
    if cuda:
        # Hand torch's cached blocks (2 GiB at the defaults) back to the device.
        torch.cuda.empty_cache()
    return bandwidth, flops


@dataclass(frozen=True)
class DeviceProbe:
    """What :func:`probe_device` read in its child process: the device, its memory, its rates."""

    device: str  # "cuda" or "cpu": where the rates were timed
    name: str  # the GPU's name, or the CPU's thread count
    memory_bytes: int | None  # the first GPU's total memory, as vLLM sizes its budget from it; None on a CPU
    copy_bandwidth: float | None  # bytes/s, the best of the tries; None when not timed
    matmul_flops: float | None  # FLOP/s, the best of the tries; None when not timed


def probe_device(dtype: str, *, tries: int = 3, copy_bytes: int | None = None,
                 matmul_size: int | None = None) -> DeviceProbe:
    """The device's memory and, for ``tries`` >= 1, its best copy bandwidth and matmul rate
    (:func:`device_rates`, best of ``tries``: other work only ever slows them), read in a child process.

    A command that opens an engine afterwards must not hold the device itself:
    vLLM refuses to start unless free memory is at least
    ``gpu_memory_utilization`` x total (``v1/worker/utils.py``,
    ``request_memory``), and on a 24 GB card at 0.9 that leaves about 2.4 GiB,
    less than a CUDA context (0.3-0.5 GiB) and the 2 GiB of timing buffers
    torch keeps cached. The child is spawned (a fork would share this
    process's state, and a CUDA context cannot cross a fork), and has exited,
    its context and memory with it, when this returns; this process never
    initialises CUDA.
    """
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(_probe_here, dtype, tries, copy_bytes, matmul_size).result()


def _probe_here(dtype: str, tries: int, copy_bytes: int | None, matmul_size: int | None) -> DeviceProbe:
    """:func:`probe_device`'s work, in the child it spawns."""
    import torch

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    rates = [device_rates(device, dtype, copy_bytes=copy_bytes, matmul_size=matmul_size) for _ in range(tries)]
    return DeviceProbe(
        device=device,
        name=torch.cuda.get_device_name(0) if cuda else f"CPU ({torch.get_num_threads()} threads)",
        memory_bytes=int(torch.cuda.get_device_properties(0).total_memory) if cuda else None,
        copy_bandwidth=max((b for b, _ in rates), default=None),
        matmul_flops=max((f for _, f in rates), default=None),
    )


def time_passes(
    shape: Shape,
    *,
    device: str,
    dtype: str,
    grid: Sequence[tuple[int, Sequence[int]]] = DEFAULT_GRID,
    tokens_per_seq: Sequence[int] = DEFAULT_TOKENS_PER_SEQ,
    head_grid: Sequence[tuple[int, Sequence[int]]] = HEAD_GRID,
    draft_vocab: int = DEFAULT_DRAFT_VOCAB,
    reps: int = 20,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time every (C, B, q) pass of ``grid`` and the EAGLE-3 head steps of ``head_grid``; the table as a dict."""
    import torch
    import torch.nn.functional as F

    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    cuda = device.startswith("cuda")
    h, nh, kvh, hd, ff, v = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn, shape.vocab
    group = nh // kvh
    timer = _Timer(torch, device, reps)

    def w(*dims: int) -> Any:
        return torch.empty(*dims, device=device, dtype=dt).normal_(0, 0.02)

    def attention(q: Any, k: Any, v_: Any) -> Any:
        if cuda:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v_)
        return F.scaled_dot_product_attention(q, k, v_)

    qkv_out = (nh + 2 * kvh) * hd
    layers = [dict(qkv=w(h, qkv_out), qkv_b=w(qkv_out) * shape.qkv_bias, o=w(nh * hd, h), gu=w(h, 2 * ff),
                   d=w(ff, h), n1=w(h), n2=w(h)) for _ in range(shape.layers)]
    emb, norm = w(v, h), w(h)
    lm_head = emb.t() if shape.tied else w(h, v)
    weight_bytes = (sum(t.numel() for layer in layers for t in layer.values()) + emb.numel() + norm.numel()
                    + (0 if shape.tied else lm_head.numel())) * emb.element_size()

    def forward(ids: Any, kc: list[Any], vc: list[Any], context: int, q: int) -> Any:
        batch = ids.shape[0]
        x = emb[ids].view(batch * q, h)
        for i, layer in enumerate(layers):
            y = F.rms_norm(x, (h,), layer["n1"], 1e-6) @ layer["qkv"] + layer["qkv_b"]
            qh, kh, vh = y.split([nh * hd, kvh * hd, kvh * hd], dim=-1)
            kc[i][:, :, context:context + q] = kh.view(batch, q, kvh, hd).transpose(1, 2)
            vc[i][:, :, context:context + q] = vh.view(batch, q, kvh, hd).transpose(1, 2)
            # Grouped-query attention as flash attention runs it: each KV head's query heads x q tokens, one block.
            qg = qh.view(batch, q, nh, hd).transpose(1, 2).reshape(batch, kvh, group * q, hd)
            a = attention(qg, kc[i], vc[i])
            x = x + a.reshape(batch, nh, q, hd).transpose(1, 2).reshape(batch * q, nh * hd) @ layer["o"]
            g, u = (F.rms_norm(x, (h,), layer["n2"], 1e-6) @ layer["gu"]).chunk(2, dim=-1)
            x = x + (F.silu(g) * u) @ layer["d"]
        return (F.rms_norm(x, (h,), norm, 1e-6) @ lm_head).argmax(-1)

    passes = []
    for context, batches in grid:
        for batch in batches:
            for q in tokens_per_seq:
                kc = [torch.randn(batch, kvh, context + q, hd, device=device, dtype=dt) for _ in range(shape.layers)]
                vc = [torch.randn_like(k) for k in kc]
                ids = torch.randint(0, v, (batch, q), device=device)
                median, best = timer(lambda: forward(ids, kc, vc, context, q))
                del kc, vc
                passes.append({"B": batch, "q": q, "C": context, "median_s": median, "min_s": best})
                log(f"C={context} B={batch} q={q}: {median * 1e3:.3f} ms (min {best * 1e3:.3f})")

    # The EAGLE-3 head for this target: fc over three target states, one layer whose q/k/v read
    # [embedding, state] (2 x hidden), its own one-layer KV cache, an LM head over draft_vocab tokens.
    hqkv, ho, hgu, hdown = w(2 * h, qkv_out), w(nh * hd, h), w(h, 2 * ff), w(ff, h)
    hlm, fc, hn1, hn2, hnf = w(h, draft_vocab), w(3 * h, h), w(2 * h), w(h), w(h)
    head_bytes = sum(t.numel() for t in (hqkv, ho, hgu, hdown, hlm, fc, hn1, hn2, hnf)) * emb.element_size()

    def head_step(ids: Any, hidden_prev: Any, kc: Any, vc: Any, context: int) -> Any:
        batch = ids.shape[0]
        y = F.rms_norm(torch.cat([emb[ids], hidden_prev], -1), (2 * h,), hn1, 1e-6) @ hqkv
        qh, kh, vh = y.split([nh * hd, kvh * hd, kvh * hd], -1)
        kc[:, :, context] = kh.view(batch, kvh, hd)
        vc[:, :, context] = vh.view(batch, kvh, hd)
        a = attention(qh.view(batch, kvh, group, hd), kc, vc)
        r = hidden_prev + a.reshape(batch, nh * hd) @ ho
        g, u = (F.rms_norm(r, (h,), hn2, 1e-6) @ hgu).chunk(2, -1)
        r = r + (F.silu(g) * u) @ hdown
        return (F.rms_norm(r, (h,), hnf, 1e-6) @ hlm).argmax(-1)

    steps = []
    for context, batches in head_grid:
        for batch in batches:
            kc = torch.randn(batch, kvh, context + 1, hd, device=device, dtype=dt)
            vc = torch.randn_like(kc)
            ids = torch.randint(0, v, (batch,), device=device)
            hidden_prev = torch.randn(batch, h, device=device, dtype=dt)
            median, _ = timer(lambda: head_step(ids, hidden_prev, kc, vc, context))
            steps.append({"B": batch, "C": context, "median_s": median})
            log(f"head step C={context} B={batch}: {median * 1e3:.3f} ms")
    bandwidth, flops = device_rates(device, dtype)
    return {
        "device": torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads)",
        "timing": "CUDA graph replays, CUDA events" if cuda else "eager, wall clock (no CUDA: not a GPU's timing)",
        "torch": torch.__version__, "dtype": dtype, "weight_bytes": weight_bytes,
        "shape": {"hidden": h, "layers": shape.layers, "heads": nh, "kv_heads": kvh, "head_dim": hd,
                  "ffn": ff, "vocab": v, "tied": shape.tied},
        "qkv_bias": shape.qkv_bias,
        "copy_bandwidth_Bps": bandwidth, "matmul_flops": flops,
        "passes": passes,
        "head": {"head_bytes": head_bytes, "draft_vocab": draft_vocab, "steps": steps},
    }


def fit_table(
    table: dict[str, Any], head_steps: Sequence[dict[str, Any]] = (), *, name: str,
    draft_vocab: int = DEFAULT_DRAFT_VOCAB,
) -> tuple[profiles.HardwareProfile, list[float], list[str], profile_fit.DeviceBounds]:
    """The profile fitted to a table's passes, bounded by its measured rates; residuals and warnings.

    The draft-step overhead is the median of each head step's measured time
    less the head's priced work (:func:`profile_fit.fit_draft_step_overhead`).
    """
    shape = table_shape(table)
    dtype = table.get("dtype", "bfloat16")
    model = profiles.ModelProfile.from_config_json(shape.config(), dtype=dtype, name=table.get("name", "model"))
    bounds = profile_fit.DeviceBounds(
        copy_bandwidth=float(table["copy_bandwidth_Bps"]),
        matmul_flops=float(table.get("matmul_flops", table.get("bf16_matmul_flops"))),
        source=f"measured on {table.get('gpu', table.get('device', 'the device'))}",
    )
    samples = [profile_fit.StepSample(p["B"] * p["q"], p["B"], p["C"], p["median_s"]) for p in table["passes"]]
    profile, residuals = profile_fit.fit_hardware_profile(samples, model, name=name, bounds=bounds,
                                                          shared_attention=True, per_layer_fixed=True)
    if head_steps:
        head = drafting.eagle_head_profile(model, "eagle3", profiles.ModelProfile.from_config_json(
            dict(shape.config(), num_hidden_layers=1, draft_vocab_size=draft_vocab), dtype=dtype, name="head"))
        overhead, _ = profile_fit.fit_draft_step_overhead(
            [profile_fit.StepSample(s["B"], s["B"], s["C"], s["median_s"]) for s in head_steps],
            method="eagle3", target=model, head=head, hw=profile)
        profile = replace(profile, draft_overhead_s=overhead)
    labels = [f"B={p['B']} q={p['q']} C={p['C']}" for p in table["passes"]]
    return profile, residuals, profile_fit.fit_warnings(profile, residuals, bounds, labels), bounds


def _significant(value: float, digits: int = 8) -> float:
    """``value`` to ``digits`` significant figures: rounding to decimals put a CPU's 0.09 TFLOP/s above its bound."""
    return value if not math.isfinite(value) or value == 0.0 else float(f"{value:.{digits}g}")


def profile_document(
    profile: profiles.HardwareProfile, residuals: Sequence[float], warnings: Sequence[str],
    bounds: profile_fit.DeviceBounds, table: dict[str, Any], table_path: str,
) -> dict[str, Any]:
    """The YAML document: conf/hardware keys, then the evidence behind them."""
    doc: dict[str, Any] = {
        "name": profile.name, "source": "calibrated",
        "memory_bandwidth_gbps": _significant(profile.memory_bandwidth / 1e9),
        "peak_tflops": _significant(profile.peak_flops / 1e12),
        "fixed_overhead_ms": round(profile.fixed_overhead_s * 1e3, 4),
        "per_layer_overhead_ms": round(profile.per_layer_overhead_s * 1e3, 5),
        "per_sequence_overhead_ms": round(profile.per_seq_overhead_s * 1e3, 5),
        "kv_bandwidth_gbps": _significant(profile.kv_read_bandwidth / 1e9),
        "overlap_exponent": profile.overlap_exponent,
    }
    if profile.draft_overhead_s is not None:
        doc["draft_overhead_ms"] = round(profile.draft_overhead_s * 1e3, 4)
    doc |= {
        "notes": (f"Fitted by python -m specbench.gpu_timing fit to {len(residuals)} passes timed with torch "
                  f"({table.get('timing', 'CUDA graphs')}) on {table.get('gpu', table.get('device'))}; "
                  "attention at the matmul rate; vLLM's scheduler and sampler not included."),
        "device": table.get("gpu", table.get("device")),
        "device_rates": {"copy_bandwidth_gbps": _significant(bounds.copy_bandwidth / 1e9),
                         "matmul_tflops": _significant(bounds.matmul_flops / 1e12), "source": bounds.source},
        "fit_warnings": list(warnings),
        "rms_residual": (sum(r * r for r in residuals) / len(residuals)) ** 0.5,
        "residuals": [round(r, 4) for r in residuals],
        "samples": table_path,
    }
    return doc


def format_fit(profile: profiles.HardwareProfile, residuals: Sequence[float], warnings: Sequence[str],
               bounds: profile_fit.DeviceBounds) -> str:
    """The fitted rates beside the device's, the residuals' summary, and any warning."""
    abs_res = sorted(abs(r) for r in residuals)
    lines = [
        f"weights {profile.memory_bandwidth / 1e9:.0f} GB/s (device copy {bounds.copy_bandwidth / 1e9:.0f}), "
        f"matmul {profile.peak_flops / 1e12:.1f} TFLOP/s (device {bounds.matmul_flops / 1e12:.1f}), "
        f"KV reads {profile.kv_read_bandwidth / 1e9:.0f} GB/s, overlap exponent {profile.overlap_exponent:g}, "
        f"fixed {profile.per_layer_overhead_s * 1e3:.4f} ms per layer and pass"
        + ("" if profile.draft_overhead_s is None else f", {profile.draft_overhead_s * 1e3:.3f} ms per draft step"),
        f"residuals over {len(residuals)} passes: median {statistics.median(abs_res):.1%}, max {abs_res[-1]:.1%}",
    ]
    lines += [f"WARNING: {w}" for w in warnings]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``time`` or ``fit``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m specbench.gpu_timing", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("time", help="time a model's passes with torch (no vLLM) and write the table")
    t.add_argument("--model", required=True, help="a config.json, a folder holding one, or a model the project names")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    t.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on a CPU")
    t.add_argument("--reps", type=int, default=20)
    t.add_argument("--grid", default=None,
                   help="contexts and batch sizes, e.g. '512:1,4,16,64;2048:1,8' (default: 1-256 at 512, 1-64 at 2048)")
    t.add_argument("--tokens-per-seq", default=",".join(map(str, DEFAULT_TOKENS_PER_SEQ)))
    f = sub.add_parser("fit", help="fit a hardware profile to a table and write it")
    f.add_argument("table", type=Path)
    f.add_argument("--head-steps", type=Path, default=None,
                   help="a separate EAGLE-3 head-step table (default: the table's own 'head' key)")
    f.add_argument("--name", default=None)
    f.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        if args.command == "time":
            return _time(args)
        return _fit(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _time(args: argparse.Namespace) -> int:
    grid = DEFAULT_GRID if args.grid is None else _grid(args.grid)
    tokens_per_seq = positive_ints(args.tokens_per_seq, "--tokens-per-seq")
    if args.dtype not in (None, "bfloat16", "float16", "float32"):
        raise ValueError(f"--dtype must be bfloat16, float16 or float32; got {args.dtype!r}")
    if args.reps < 1:
        raise ValueError(f"--reps must be a positive integer; got {args.reps}")
    shape = Shape.from_config(_model_config(args.model))
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if not device.startswith("cuda"):
        print("no CUDA device: timing eagerly on the CPU (no CUDA graphs, default attention kernel)")
    table = time_passes(shape, device=device, dtype=dtype, grid=grid, tokens_per_seq=tokens_per_seq,
                        head_grid=grid, reps=args.reps)
    table["name"] = args.model
    args.out.write_text(json.dumps(table, indent=1))
    print(f"table: {args.out}")
    return 0


def _fit(args: argparse.Namespace) -> int:
    import yaml

    table = json.loads(args.table.read_text())
    head = table.get("head") or {}
    steps = head.get("steps", [])
    if args.head_steps is not None:
        head = json.loads(args.head_steps.read_text())
        steps = head.get("steps", [])
    name = args.name or str(table.get("gpu", table.get("device", "gpu"))).lower().replace(" ", "-")
    profile, residuals, warnings, bounds = fit_table(
        table, steps, name=name, draft_vocab=int(head.get("draft_vocab", DEFAULT_DRAFT_VOCAB)))
    print(format_fit(profile, residuals, warnings, bounds))
    if args.out is not None:
        doc = profile_document(profile, residuals, warnings, bounds, table, str(args.table))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(yaml.safe_dump(doc, sort_keys=False))
        print(f"profile: {args.out}")
    return 0


def _model_config(reference: str) -> dict[str, Any]:
    path = Path(reference).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    from specbench import models

    if reference in models.PUBLISHED_CONFIGS:
        return dict(models.PUBLISHED_CONFIGS[reference])
    folder = Path(models.resolve(reference, prepare=False)).expanduser()
    if (folder / "config.json").is_file():
        return json.loads((folder / "config.json").read_text())
    raise ValueError(f"--model {reference!r}: no config.json there, and not a model the project names")


def _grid(text: str) -> tuple[tuple[int, tuple[int, ...]], ...]:
    out = []
    for part in text.split(";"):
        context, _, batches = part.partition(":")
        try:
            out.append((int(context), tuple(positive_ints(batches, "--grid"))))
        except ValueError:
            raise ValueError(f"--grid must look like '512:1,4,16;2048:1,8'; got {text!r}") from None
    return tuple(out)


def positive_ints(text: str, key: str) -> list[int]:
    """A command-line list such as ``1,4,16`` as positive integers; ValueError naming ``key`` otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{key} expects comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{key} expects comma-separated positive integers, got {text!r}")
    return values


if __name__ == "__main__":
    sys.exit(main())
