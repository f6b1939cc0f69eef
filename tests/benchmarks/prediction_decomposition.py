"""Predicted against measured speedup of a stored sweep, per cell and per engine run, split into its two factors.

    .venv/bin/python tests/benchmarks/prediction_decomposition.py outputs/<sweep> [--hardware PROFILE.yaml] \
        [--ngram-host-ms 0 2 4 --lookup-from outputs/<other sweep> --lookup-hardware PROFILE.yaml]

A decode speedup is tokens per target step times (plain step / speculative
step). The tokens per step the prediction reads are the row's own counters
(:func:`specbench.analytic.prediction.decode_acceptance`), so any gap between
predicted and measured lies in the step-time ratio, in the prefill or in the
batch's tail. Each engine run's cell file (``cells/*-r<N>.parquet``) is
priced through the project's own prediction code
(:func:`~specbench.analytic.prediction.with_predicted_speedups`) with the
hardware profile the sweep's rows name (or ``--hardware``), and held against
the baseline of the same engine run. Per line:

- tok/step: decode tokens per decode pass (measured; the prediction reads the same);
- plain ms, spec ms: at batch 1, time per target step, measured (the mean TPOT x decode tokens / decode passes)
  and predicted (the model's plain and speculative step); at larger batches the steps thin, and only the
  ratios are shown;
- ratio: speculative step over plain step, measured (tok/step / measured decode speedup) and predicted;
- speedup: wall-time, measured (baseline wall / speculative wall, this engine run) and predicted.

``--ngram-host-ms`` then prices the merged rows again with each figure as the
profile's ngram host work per step (:class:`specbench.analytic.drafting.LookupDraft`);
``--lookup-from`` adds the figures :func:`specbench.analytic.profile_fit.fit_lookup_overhead`
fits to another sweep's batch-1 ngram engine runs (as calibrate fits its own
timed ngram passes), so that no sweep is priced with a figure taken from
itself: as timed, and relative to the plain step of each run's own baseline.

``--heads-from SWEEP --head-ks 2 4`` fits each EAGLE head's draft cost per pass
and per speculative step (:func:`specbench.analytic.profile_fit.fit_draft_costs`,
as calibrate fits its passes timed at two K) to that sweep's batch-1 engine runs
at those K, and prices the merged rows again with them: a leave-out check where
the K priced (8) is not among those fitted.
"""

from __future__ import annotations

import argparse
import glob
import math
import re
import statistics
from pathlib import Path
from typing import Any

from dataclasses import replace

from specbench import methods
from specbench.analytic import prediction, profile_fit, speedup, steps
from specbench.results.schema import read_rows, row_config


def _rows(sweep: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(glob.glob(str(sweep / "cells" / "*-r*.parquet"))):
        if re.search(r"-r\d+\.parquet$", path):
            rows.extend(read_rows(Path(path)))
    # Offline cells only: a serving cell's batch is what its load induced.
    return [r for r in rows if r.get("status") == "ok" and r.get("load_request_rate") is None]


def _steps_ms(row: dict[str, Any], hw: Any) -> tuple[float, float]:
    """Predicted plain and speculative step (ms) at the row's batch size, as the prediction prices them."""
    cfg = row_config(row)
    target = prediction.model_profile(cfg["model"]["path"], row["dtype"], row["model"])
    context = prediction.context_length(row)
    batch = int(row["batch_size"])
    plain = steps.plain_decode_step(target, hw, batch, context)
    if row["method"] == "baseline":
        return plain * 1e3, plain * 1e3
    acceptance = prediction.decode_acceptance(row)
    k = int(row["num_speculative_tokens"])
    draft = prediction.drafter_profile({**(cfg.get("method") or {}), "name": row["method"]}, target, row["dtype"])
    spec = speedup.speculative_step(methods.cost(row["method"]), target=target, hw=hw, batch_size=batch, k=k,
                                    context_len=context, draft=draft,
                                    draft_tokens_per_pass=min(acceptance.draft_tokens_per_pass, float(k)))
    return plain * 1e3, spec * 1e3


def _measured_step_ms(row: dict[str, Any]) -> float:
    outputs = row.get("output_tokens_per_request")
    passes = row.get("decode_passes_per_request")
    decoded = sum(n - 1 for n in outputs)
    return row["tpot_s_mean"] * decoded / (sum(passes) if passes is not None else decoded) * 1e3


def hardware_of(sweep: Path, hardware: Path | None) -> prediction.HardwareChoice:
    """``hardware`` if given, else the calibrated profile file the sweep's rows were priced with."""
    choice = prediction.load_hardware_file(hardware) if hardware else None
    if choice is None:
        label = next((r["hardware_profile"] for r in read_rows(sweep / "results.parquet") if r.get("hardware_profile")),
                     None)
        found = re.search(r", (/[^)]+\.yaml)\)$", label or "")
        choice = prediction.load_hardware_file(Path(found.group(1))) if found else None
    if choice is None:
        raise SystemExit("no hardware profile: pass --hardware")
    return choice


def lookup_samples(
    sweep: Path, choice: prediction.HardwareChoice, relative: bool = False
) -> tuple[list[profile_fit.LookupSample], Any]:
    """Each batch-1 ngram engine run of a sweep as calibrate times an ngram engine: seconds per decode pass
    and draft tokens verified per pass; and the target's profile. ``relative``: each pass scaled by the
    predicted over the measured plain step of the same engine run's baseline, so that a run whose engines
    all ran slow (or fast) adds nothing of it to the ngram figure."""
    rows = _rows(sweep)
    plain = {(r["workload"], r["engine_run"]): _measured_step_ms(r) for r in rows
             if r["method"] == "baseline" and r["batch_size"] == 1}
    samples, target = [], None
    for row in rows:
        if row["method"] != "ngram" or row["batch_size"] != 1:
            continue
        cfg = row_config(row)
        target = prediction.model_profile(cfg["model"]["path"], row["dtype"], row["model"])
        acceptance = prediction.decode_acceptance(row)
        scale = _steps_ms(row, choice.profile)[0] / plain[(row["workload"], row["engine_run"])] if relative else 1.0
        samples.append(profile_fit.LookupSample(1, int(row["num_speculative_tokens"]), prediction.context_length(row),
                                                _measured_step_ms(row) * scale / 1e3, acceptance.draft_tokens_per_pass))
    return samples, target


def head_costs(
    sweep: Path, choice: prediction.HardwareChoice, ks: set[int], relative: bool = False
) -> dict[str, tuple[float, float, int]]:
    """Per EAGLE head, its draft cost per pass and per step fitted to the sweep's batch-1 engine runs at ``ks``
    (each run's step as calibrate times a pass), and how many runs; ``relative`` as in :func:`lookup_samples`."""
    rows = _rows(sweep)
    plain = {(r["workload"], r["engine_run"]): _measured_step_ms(r) for r in rows
             if r["method"] == "baseline" and r["batch_size"] == 1}
    by_method: dict[str, list[profile_fit.DraftSample]] = {}
    heads: dict[str, Any] = {}
    target = None
    for row in rows:
        k = int(row["num_speculative_tokens"])
        if row["method"] not in ("eagle", "eagle3") or row["batch_size"] != 1 or k not in ks:
            continue
        cfg = row_config(row)
        target = prediction.model_profile(cfg["model"]["path"], row["dtype"], row["model"])
        heads[row["method"]] = prediction.drafter_profile({**(cfg.get("method") or {}), "name": row["method"]},
                                                          target, row["dtype"])
        scale = _steps_ms(row, choice.profile)[0] / plain[(row["workload"], row["engine_run"])] if relative else 1.0
        by_method.setdefault(row["method"], []).append(
            profile_fit.DraftSample(1, k, prediction.context_length(row), _measured_step_ms(row) * scale / 1e3))
    out = {}
    for method, samples in by_method.items():
        per_pass, per_step, _ = profile_fit.fit_draft_costs(samples, method=method, target=target,
                                                            head=heads[method], hw=choice.profile)
        out[method] = (per_pass, per_step, len(samples))
    return out


def reprice(sweep: Path, choice: prediction.HardwareChoice, host_s: float | None = None,
            heads: dict[str, tuple[float, float, int]] | None = None) -> list[dict[str, Any]]:
    """The sweep's merged rows priced again with ``host_s`` as the profile's ngram host work per step (None: the
    profile's), and each head of ``heads`` at its cost per pass and per step."""
    hw = choice.profile
    if host_s is not None:
        others = tuple((m, s) for m, s in hw.head_overheads if m != "ngram")
        hw = replace(hw, head_overheads=(*others, ("ngram", host_s)))
    if heads:
        hw = replace(hw, head_overheads=tuple((m, heads[m][0] if m in heads else s) for m, s in hw.head_overheads),
                     head_step_overheads=tuple((m, c[1]) for m, c in heads.items()))
    return prediction.with_predicted_speedups(read_rows(sweep / "results.parquet"),
                                              prediction.HardwareChoice(hw, choice.label))


def decompose(sweep: Path, hardware: Path | None) -> list[dict[str, Any]]:
    """One dict per speculative cell and engine run: the factors of its predicted and measured speedup."""
    rows = _rows(sweep)
    choice = hardware_of(sweep, hardware)
    priced = prediction.with_predicted_speedups(rows, choice)
    base = {(r["workload"], r["batch_size"], r["engine_run"]): r for r in priced if r["method"] == "baseline"}
    out = []
    for row in priced:
        if row["method"] == "baseline" or row.get("predicted_speedup") is None:
            continue
        plain_row = base[(row["workload"], row["batch_size"], row["engine_run"])]
        acceptance = prediction.decode_acceptance(row)
        measured_decode = plain_row["tpot_s_mean"] / row["tpot_s_mean"]
        plain_ms, spec_ms = _steps_ms(row, choice.profile)
        out.append({
            "method": row["method"], "k": int(row["num_speculative_tokens"]), "batch": int(row["batch_size"]),
            "workload": row["workload"], "run": int(row["engine_run"]),
            "tok_step": acceptance.tokens_per_pass,
            "plain_ms": _measured_step_ms(plain_row) if row["batch_size"] == 1 else math.nan,
            "spec_ms": _measured_step_ms(row) if row["batch_size"] == 1 else math.nan,
            "plain_ms_pred": plain_ms, "spec_ms_pred": spec_ms,
            "ratio": acceptance.tokens_per_pass / measured_decode,
            "ratio_pred": acceptance.tokens_per_pass / row["predicted_decode_speedup"],
            "speedup": plain_row["wall_time_s"] / row["wall_time_s"], "speedup_pred": row["predicted_speedup"],
            "other_cpu": row.get("other_cpu_share"),
        })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--hardware", type=Path, help="a hardware profile YAML (default: the one the rows name)")
    parser.add_argument("--ngram-host-ms", type=float, nargs="*", default=[],
                        help="price the merged rows again with each as ngram's host work per step")
    parser.add_argument("--lookup-from", type=Path, help="fit ngram's host work to this sweep's ngram engine runs")
    parser.add_argument("--lookup-hardware", type=Path, help="the profile --lookup-from was priced with")
    parser.add_argument("--heads-from", type=Path,
                        help="fit each EAGLE head's cost per pass and per step to this sweep's batch-1 runs")
    parser.add_argument("--head-ks", type=int, nargs="+", default=[2, 4], help="the K --heads-from fits at")
    args = parser.parse_args()
    lines = decompose(args.sweep, args.hardware)
    print("method  K  b  workload   run  tok/step | plain ms meas/pred | spec ms meas/pred | "
          "spec/plain meas/pred | speedup meas/pred (pred/meas-1)")
    for d in sorted(lines, key=lambda d: (d["method"], d["workload"], d["batch"], d["k"], d["run"])):
        print(f"{d['method']:7s} {d['k']}  {d['batch']:<2d} {d['workload']:10s} r{d['run']}  {d['tok_step']:6.3f}  | "
              f"{d['plain_ms']:6.2f} / {d['plain_ms_pred']:6.2f}   | {d['spec_ms']:6.2f} / {d['spec_ms_pred']:6.2f}   | "
              f"{d['ratio']:5.3f} / {d['ratio_pred']:5.3f}       | {d['speedup']:5.3f} / {d['speedup_pred']:5.3f} "
              f"({d['speedup_pred'] / d['speedup'] - 1:+.1%})")
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for d in lines:
        groups.setdefault((d["method"], d["workload"], d["batch"]), []).append(d)
    print("per method, workload and batch: geometric mean over cells and engine runs of")
    print("  measured / predicted spec/plain step ratio (above 1: the speculative step costs more than priced)")
    for key, group in sorted(groups.items()):
        gap = math.exp(statistics.fmean(math.log(d["ratio"] / d["ratio_pred"]) for d in group))
        err = math.exp(statistics.fmean(math.log(d["speedup_pred"] / d["speedup"]) for d in group))
        print(f"  {key[0]:7s} {key[1]:10s} b{key[2]:<2d} n {len(group):2d}  step ratio gap {gap:5.3f}  "
              f"speedup pred/meas {err:5.3f}")
    if args.heads_from:
        choice = hardware_of(args.sweep, args.hardware)
        source = hardware_of(args.heads_from, args.hardware)
        print("merged cells priced again with each head's cost per pass and per step fitted to "
              f"{args.heads_from} at K={', '.join(map(str, args.head_ks))}: predicted / measured - 1")
        variants = [("profile as written", None)]
        for relative in (False, True):
            fitted = head_costs(args.heads_from, source, set(args.head_ks), relative)
            for method, (per_pass, per_step, n) in fitted.items():
                print(f"  {method}{' (relative to own baseline)' if relative else ''}: {per_pass * 1e3:+.2f} ms per "
                      f"pass + {per_step * 1e3:+.2f} ms per step, from {n} engine runs")
            variants.append(("fitted, relative" if relative else "fitted", fitted))
        print_repriced([name for name, _ in variants], [reprice(args.sweep, choice, heads=h) for _, h in variants],
                       width=18)
    figures = list(args.ngram_host_ms)
    if args.lookup_from:
        source = hardware_of(args.lookup_from, args.lookup_hardware)
        for relative in (False, True):
            samples, target = lookup_samples(args.lookup_from, source, relative)
            fitted, _ = profile_fit.fit_lookup_overhead(samples, target=target, hw=source.profile)
            print(f"ngram host work fitted to {len(samples)} engine runs of {args.lookup_from}"
                  f"{' relative to their own baseline' if relative else ''}: {fitted * 1e3:.2f} ms")
            figures.append(round(fitted * 1e3, 2))
    if not figures:
        return
    choice = hardware_of(args.sweep, args.hardware)
    print("merged cells priced again: predicted / measured - 1 at each ngram host work per step (ms)")
    print_repriced([f"{ms:.2f}" for ms in figures], [reprice(args.sweep, choice, ms / 1e3) for ms in figures], width=7)


def print_repriced(columns: list[str], priced: list[list[dict]], width: int) -> None:
    """One line per speculative cell: its measured speedup, then predicted / measured - 1 under each pricing."""
    print("  cell                              measured " + " ".join(f"{name:>{width}}" for name in columns))
    for i, row in enumerate(priced[0]):
        if row["method"] == "baseline" or not row.get("speedup") or row.get("predicted_speedup") is None:
            continue
        label = f"{row['method']} K={row['num_speculative_tokens']} b{row['batch_size']} {row['workload']}"
        errors = " ".join(f"{p[i]['predicted_speedup'] / row['speedup'] - 1:>+{width}.1%}" for p in priced)
        print(f"  {label:33s} {row['speedup']:8.3f}x {errors}")


if __name__ == "__main__":
    main()
