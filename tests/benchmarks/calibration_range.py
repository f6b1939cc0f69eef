"""What a calibration narrowed to the demo's range costs the model: a full calibration's samples refitted as
the narrowed one measures them (batch 1 and 4 at 16 and 512 tokens, 8 of 16 samples), and the demo's cells
priced with each fit.

Prints figures; asserts nothing; starts no engine.

    .venv/bin/python tests/benchmarks/calibration_range.py [PROFILE.yaml]

PROFILE.yaml: a calibration over the default grid with ``--rounds 2`` (default: the committed
``conf/hardware/cpu-amd-epyc-2-cores.yaml``, quiet, 2026-12-04). Each fit keeps the full grid's samples or the
demo range's, at the fastest of both rounds or one round's time; the EAGLE-3 head is fitted against each target
fit from its quiet two-K timing (63.0 ms at K=2, 69.9 ms at K=8 a speculative pass, batch 1, 512-token
prompts: docs/results/2026-12-07-two-k-heads-headline.md). The demo's 16 speculative cells (ngram and EAGLE-3
at K=4, batch 1 and 4, summarize and creative at their measured prompt lengths, 32 output tokens: its 8
speculative cells) are priced at fixed representative acceptances, so that only the profile differs. Columns:
the largest and rms change of a predicted decode speedup, and the largest of a wall-time one, against the full
grid's two-round fit; the largest change of a decode speedup against the full grid's fit of the same round(s);
the fit's rms and worst residual on the demo range's 8 samples and on all 16.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from specbench import calibrate
from specbench.analytic import prediction, profile_fit, profiles, speedup, steps

Keep = Callable[[Mapping[str, Any]], bool]

# The demo's prompt lengths (mean of its four prompts, template included) and output length.
PROMPT_TOKENS = {"summarize": 464, "creative": 70}
OUTPUT_TOKENS = 32
# Tokens per target pass and draft tokens verified per pass, representative of the demo's cells.
ACCEPTANCE = {("ngram", "summarize"): (2.2, 3.0), ("ngram", "creative"): (1.3, 1.0),
              ("eagle3", "summarize"): (1.9, 4.0), ("eagle3", "creative"): (1.7, 4.0)}
HEAD_TIMING = [{"batch_size": 1, "prompt_tokens": 512, "k": k, "context_len": 524.0, "seconds_per_pass": s}
               for k, s in ((2, 0.0630), (8, 0.0699))]


def _every(_: Mapping[str, Any]) -> bool:
    return True


def _demo_range(record: Mapping[str, Any]) -> bool:
    return record["batch_size"] <= 4 and record["prompt_tokens"] <= 512


VARIANTS: dict[str, tuple[Keep, int | None]] = {
    "full grid, fastest of 2 rounds": (_every, None),
    "demo range, fastest of 2 rounds": (_demo_range, None),
    "full grid, round 1": (_every, 0),
    "demo range, round 1": (_demo_range, 0),
    "full grid, round 2": (_every, 1),
    "demo range, round 2": (_demo_range, 1),
}


def refit(doc: Mapping[str, Any], keep: Keep, round_index: int | None, model: profiles.ModelProfile,
          bounds: profile_fit.DeviceBounds) -> profiles.HardwareProfile:
    """The target's profile fitted to the kept samples (one round's time, or the fastest), EAGLE-3's head
    fitted against it."""
    kept = [dict(r, seconds=r["seconds"] if round_index is None else r["round_seconds"][round_index])
            for r in doc["samples"] if keep(r)]
    samples, records = calibrate.samples_from_document({"samples": kept})
    profile, _ = calibrate.fit(samples, records, model, doc["name"], bounds)
    cells, _ = calibrate._draft_cells([], ("eagle3",))
    overhead, per_step, _ = calibrate.fit_head("eagle3", cells["eagle3"][0].identity["method"], HEAD_TIMING, model,
                                               doc["model"]["dtype"], profile)
    return calibrate.with_head_overheads(profile, {"eagle3": overhead}, {"eagle3": per_step})


def demo_speedups(profile: profiles.HardwareProfile, model: profiles.ModelProfile,
                  head: profiles.ModelProfile) -> dict[tuple[str, str, int], tuple[float, float]]:
    """Each demo cell's predicted decode and wall-time speedup under ``profile``."""
    out = {}
    for (method, workload), (per_pass, drafted) in ACCEPTANCE.items():
        prompt = PROMPT_TOKENS[workload]
        context = prompt + OUTPUT_TOKENS / 2
        for batch in (1, 4):
            decode = speedup.predicted_decode_speedup(
                method=method, k=4, batch_size=batch, tokens_per_pass=per_pass, target=model, hw=profile,
                context_len=context, draft=head if method == "eagle3" else None,
                draft_tokens_per_pass=drafted if method == "ngram" else None)
            prefill = steps.prefill_time(model, profile, batch, prompt, prediction.DEFAULT_STEP_TOKENS)
            plain = (OUTPUT_TOKENS - 1) * steps.plain_decode_step(model, profile, batch, context)
            out[(method, workload, batch)] = (decode, speedup.end_to_end_speedup(decode, prefill, plain))
    return out


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values))


def main(argv: Sequence[str]) -> int:
    """Print one line per variant."""
    path = Path(argv[0]) if argv else Path(__file__).parents[2] / "conf" / "hardware" / "cpu-amd-epyc-2-cores.yaml"
    doc = yaml.safe_load(path.read_text())
    rates = doc["device_rates"]
    bounds = profile_fit.DeviceBounds(rates["copy_bandwidth_gbps"] * 1e9, rates["matmul_tflops"] * 1e12)
    model = prediction.model_profile(doc["model"]["path"], doc["model"]["dtype"], doc["model"]["name"])
    cells, _ = calibrate._draft_cells([], ("eagle3",))
    head = prediction.drafter_profile(dict(cells["eagle3"][0].identity["method"]), model, doc["model"]["dtype"])
    every, _ = calibrate.samples_from_document(doc)
    in_range = [_demo_range(r) for r in doc["samples"]]
    reference = demo_speedups(refit(doc, _every, None, model, bounds), model, head)
    print(f"{path}: {len(every)} samples, {len(reference)} demo cells")
    print(f"{'variant':<34} {'max dS':>7} {'rms dS':>7} {'max dS wall':>11} {'vs same rounds':>14} "
          f"{'range rms, worst':>17} {'all rms':>8}")
    full_grid: dict[int | None, dict[tuple[str, str, int], tuple[float, float]]] = {}
    for name, (keep, round_index) in VARIANTS.items():
        profile = refit(doc, keep, round_index, model, bounds)
        priced = demo_speedups(profile, model, head)
        same = full_grid.setdefault(round_index, priced)
        paired = max(abs(priced[c][0] / same[c][0] - 1.0) for c in reference)
        decode = [priced[c][0] / reference[c][0] - 1.0 for c in reference]
        wall = [priced[c][1] / reference[c][1] - 1.0 for c in reference]
        residuals = [steps.roofline_time(profile, steps.pass_work(
            model, s.num_tokens, s.num_seqs, s.context_len, logits=s.logits)) / s.seconds - 1.0 for s in every]
        inside = [r for r, kept in zip(residuals, in_range) if kept]
        print(f"{name:<34} {max(map(abs, decode)):>7.2%} {_rms(decode):>7.2%} {max(map(abs, wall)):>11.2%} "
              f"{paired:>14.2%} {_rms(inside):>8.2%}, {max(inside, key=abs):+.1%} {_rms(residuals):>8.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
