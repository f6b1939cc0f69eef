"""What a cheaper calibration costs the model: an earlier calibration's samples refitted as fewer
rounds, grid points or draft points would have measured them, and the predictions compared.

Prints figures; asserts nothing; starts no engine.

    .venv/bin/python tests/benchmarks/calibration_cost.py [PROFILE.yaml] [SWEEP_DIR]

PROFILE.yaml: a calibration written with ``--rounds 2`` (default: this machine's,
``$SPECBENCH_CACHE/hardware/calibrated.yaml``), whose samples keep every round's time;
SWEEP_DIR: a sweep measured on the same machine (default: outputs/cpu_demo). Each variant keeps
some samples (one round's time each, or the fastest of both), is fitted with
:func:`specbench.calibrate.fit` and :func:`specbench.calibrate.fit_head` (the bounds its device rates
set), and prices the sweep's speculative cells with
:func:`specbench.analytic.prediction.with_predicted_speedups`, as the sweep's merge does. Columns:
the largest and rms change of a predicted speedup against the two-round fit of every sample, the
rms of predicted / measured speedup - 1, the heads' fitted draft overheads, and the rms and worst
residual of the variant's profile on every sample of the grid (the held-out ones included).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from specbench import calibrate
from specbench.analytic import prediction, profile_fit, profiles
from specbench.results.schema import read_rows, results_path

Keep = Callable[[Mapping[str, Any]], bool]


def _every(_: Mapping[str, Any]) -> bool:
    return True


# name: (round index, None for the fastest of both; which grid samples; which draft points (indices))
VARIANTS: dict[str, tuple[int | None, Keep, tuple[int, ...]]] = {
    "2 rounds, full grid, 2 draft points": (None, _every, (0, 1)),
    "1 round, full grid, 2 draft points": (0, _every, (0, 1)),
    "1 round (the second), 2 draft points": (1, _every, (0, 1)),
    "1 round, no batch 4 x 1024": (0, lambda r: not (r["batch_size"] == 4 and r["prompt_tokens"] == 1024), (0, 1)),
    "1 round, no 1024-token row": (0, lambda r: r["prompt_tokens"] != 1024, (0, 1)),
    "1 round, no batch 64": (0, lambda r: r["batch_size"] != 64, (0, 1)),
    "1 round, draft at batch 1 only": (0, _every, (0,)),
    "1 round (the second), draft at batch 1": (1, _every, (0,)),
    "2 rounds, draft at batch 1 only": (None, _every, (0,)),
}


def _sample(record: Mapping[str, Any]) -> profile_fit.StepSample:
    if record["kind"] == "prefill":
        return profile_fit.StepSample(record["batch_size"] * record["prompt_tokens"], record["batch_size"],
                                      record["context_len"], record["seconds"], logits=record["batch_size"])
    return profile_fit.StepSample(record["batch_size"], record["batch_size"], record["context_len"], record["seconds"])


def refit(doc: Mapping[str, Any], round_index: int | None, keep: Keep, draft_points: Sequence[int],
          model: profiles.ModelProfile, bounds: profile_fit.DeviceBounds) -> profiles.HardwareProfile:
    """The profile a calibration of the kept samples, timed in one round (or the fastest of all), would fit."""
    kept = [dict(r, seconds=r["seconds"] if round_index is None else r["round_seconds"][round_index])
            for r in doc["samples"] if keep(r)]
    profile, _ = calibrate.fit([_sample(r) for r in kept], kept, model, doc["name"], bounds)
    cells, _ = calibrate._draft_cells(list((doc.get("settings") or {}).get("overrides") or []))
    overheads, step_overheads = {}, {}
    for method, written in doc["head_draft_samples"].items():
        chosen = [dict(written[i], seconds_per_pass=written[i]["seconds_per_pass"] if round_index is None
                       else written[i]["round_seconds_per_pass"][round_index]) for i in draft_points]
        overheads[method], step_overheads[method], _ = calibrate.fit_head(
            method, cells[method][0].identity["method"], chosen, model, doc["model"]["dtype"], profile)
    return calibrate.with_head_overheads(profile, overheads, step_overheads)


def main(argv: Sequence[str]) -> int:
    """Print one line per variant."""
    profile_path = Path(argv[0]) if argv else prediction.calibrated_path()
    sweep = Path(argv[1]) if len(argv) > 1 else Path("outputs/cpu_demo")
    doc = yaml.safe_load(profile_path.read_text())
    if len((doc.get("samples") or [{}])[0].get("round_seconds") or []) < 2:
        print(f"{profile_path}: its samples were timed in fewer than 2 rounds (calibrate --rounds 2)")
        return 2
    rates = doc["device_rates"]
    bounds = profile_fit.DeviceBounds(rates["copy_bandwidth_gbps"] * 1e9, rates["matmul_tflops"] * 1e12,
                                      source=rates["source"])
    model = prediction.model_profile(doc["model"]["path"], doc["model"]["dtype"], doc["model"]["name"])
    rows = read_rows(results_path(sweep))
    every = [_sample(r) for r in doc["samples"]]

    def speedups(profile: profiles.HardwareProfile) -> dict[str, tuple[float, float]]:
        priced = prediction.with_predicted_speedups(rows, prediction.HardwareChoice(profile, "refit"))
        return {r["cell_id"]: (r["predicted_speedup"], r["speedup"]) for r in priced
                if r["method"] != "baseline" and r.get("predicted_speedup") and r.get("speedup")}

    reference = speedups(refit(doc, None, _every, (0, 1), model, bounds))
    print(f"{profile_path} ({len(every)} samples), {sweep} ({len(reference)} speculative cells)")
    print(f"{'variant':<40} {'max dS':>7} {'rms dS':>7} {'vs meas':>8} {'heads (ms)':>18} {'samples rms, worst':>20}")
    for name, (round_index, keep, points) in VARIANTS.items():
        profile = refit(doc, round_index, keep, points, model, bounds)
        priced = speedups(profile)
        shift = [priced[c][0] / reference[c][0] - 1.0 for c in reference]
        error = [p / m - 1.0 for p, m in priced.values()]
        residuals = [profile_fit.roofline_time(profile, profile_fit.pass_work(
            model, s.num_tokens, s.num_seqs, s.context_len, logits=s.logits)) / s.seconds - 1.0 for s in every]
        heads = ", ".join(f"{m} {o * 1e3:.2f}" for m, o in profile.head_overheads)
        print(f"{name:<40} {max(map(abs, shift)):>7.2%} {_rms(shift):>7.2%} {_rms(error):>8.2%} {heads:>18} "
              f"{_rms(residuals):>10.2%}, {max(residuals, key=abs):+.1%}")
    return 0


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
