"""Capacity: the highest request rate at which a configuration meets every SLO, found by bisection.

An operator asks of speculative decoding "how much more traffic does it let me
serve within my latency targets?", not "how much faster is one request?". The
answer is a *capacity*: the highest offered rate (requests/s) at which a
configuration's probe meets every ``load.slo.*`` target at the chosen
percentile (TPOT p90 <= 100 ms, say) and its engine keeps up with the load
(not saturated: :func:`specbench.results.serving.saturation`). Past that rate
latency grows with the queue, so capacity is where the SLO breaks.

The search (:func:`search`) is bisection on a log scale over a probe
function: probe the lowest rate (if it fails, capacity is below it), then the
highest (if it passes, capacity is at least it), then the geometric midpoint
of the highest rate passed and the lowest failed, until the two are within
the tolerance or the probes run out. (GuideLLM's sweep spaces its rates
evenly between a synchronous and a throughput probe; bisection spends its
probes around the knee instead.) The capacity is the highest rate that
passed, and the interval ``[passed, failed)`` says how finely the probes
pinned it. A probe function serves one schedule at one rate and returns a
:class:`Probe`; :func:`probe_of` reads one from a served measurement.

Pure Python: probes are functions handed in (``python -m specbench.capacity``
drives them through the engine); nothing here measures.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specbench.load import ServingMeasurement, warmup_problems
from specbench.results import serving


# load.slo.<key> -> the per-request latency it bounds, and how the verdict names it.
SLO_METRICS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}


class CapacityError(ValueError):
    """A capacity search that cannot be run as configured (one line, naming the keys)."""


@dataclass
class CapacitySchema:
    """Types of ``capacity.*`` (conf/config.yaml holds the defaults and what each means)."""

    min_rate: float = 0.5
    max_rate: float = 8.0
    max_probes: int = 6
    requests_per_probe: int = 16
    warmup: int = 2
    percentile: float = 90.0
    tolerance: float = 0.1


@dataclass(frozen=True)
class Settings:
    """How one search runs: the rates it spans, its probes, the percentile the SLOs are read at."""

    min_rate: float
    max_rate: float
    max_probes: int
    percentile: float = 90.0
    tolerance: float = 0.1

    @classmethod
    def of(cls, capacity: Mapping[str, Any]) -> Settings:
        """Settings from a ``capacity`` config block; :class:`CapacityError` names every bad key."""
        errors = []
        low, high = capacity.get("min_rate"), capacity.get("max_rate")
        if not (isinstance(low, (int, float)) and 0 < low < math.inf):
            errors.append(f"capacity.min_rate={low!r} must be a finite rate > 0 (requests/s)")
        elif not (isinstance(high, (int, float)) and low < high < math.inf):
            errors.append(f"capacity.max_rate={high!r} must be a finite rate above capacity.min_rate={low!r}")
        if not (isinstance(capacity.get("max_probes"), int) and capacity["max_probes"] >= 2):
            errors.append(f"capacity.max_probes={capacity.get('max_probes')!r} must be an integer >= 2 "
                          "(the lowest and the highest rate)")
        errors += warmup_problems("capacity.requests_per_probe", capacity.get("requests_per_probe"),
                                  "capacity.warmup", capacity.get("warmup"))
        if not (isinstance(capacity.get("percentile"), (int, float)) and 0 < capacity["percentile"] <= 100):
            errors.append(f"capacity.percentile={capacity.get('percentile')!r} must be in (0, 100]")
        if not (isinstance(capacity.get("tolerance"), (int, float)) and capacity["tolerance"] > 0):
            errors.append(f"capacity.tolerance={capacity.get('tolerance')!r} must be > 0 (relative width)")
        if errors:
            raise CapacityError("; ".join(errors))
        return cls(float(low), float(high), int(capacity["max_probes"]), float(capacity["percentile"]),
                   float(capacity["tolerance"]))


def slo_targets(slo: Mapping[str, Any] | None) -> dict[str, float]:
    """The SLO targets set in ``load.slo`` (ms, by key); :class:`CapacityError` where none is set.

    Capacity is defined by the SLOs: without one there is no rate at which a configuration stops
    meeting it, only the rate at which the engine falls behind.
    """
    targets = {k: float(v) for k, v in (slo or {}).items() if v is not None}
    if not targets:
        raise CapacityError("a capacity search needs at least one SLO: set load.slo.ttft_ms, load.slo.tpot_ms "
                            "or load.slo.e2e_ms (milliseconds), e.g. load.slo.tpot_ms=100")
    unknown = sorted(set(targets) - set(SLO_METRICS))
    bad = [f"load.slo.{k}={v:g}" for k, v in targets.items() if not v > 0]
    if unknown or bad:
        raise CapacityError("; ".join(([f"unknown SLO key(s) load.slo.{', load.slo.'.join(unknown)}"] if unknown else [])
                                      + [f"{b} must be > 0 (milliseconds)" for b in bad]))
    return targets


def slo_text(targets: Mapping[str, float], percentile: float) -> str:
    """``"TPOT p90 <= 100 ms"``; several targets joined with "and"."""
    return " and ".join(f"{SLO_METRICS[k]} p{percentile:g} <= {v:g} ms" for k, v in sorted(targets.items()))


@dataclass(frozen=True)
class Probe:
    """One probe: the rate served, each SLO metric at the percentile (ms), why it failed (None: it passed),
    and, apart, why its engine fell behind the load (None: it kept up), part of ``failed`` too."""

    rate: float
    figures_ms: Mapping[str, float | None]
    failed: str | None
    duration_s: float = 0.0
    achieved_rate: float | None = None
    saturated: str | None = None
    # Share of the machine's cores other processes kept busy while it ran (None: not read): a probe
    # disturbed by them may fail a rate its configuration serves on a quiet machine.
    other_cpu_share: float | None = None

    @property
    def passed(self) -> bool:
        """Whether the probe met every SLO and its engine kept up."""
        return self.failed is None


def judge(figures_ms: Mapping[str, float | None], targets: Mapping[str, float], percentile: float,
          saturated: str | None = None) -> str | None:
    """Why a probe fails, in words (every target missed, and saturation); None when it meets them all.

    A metric that no request reported (a TPOT where every request produced one token) cannot fail.
    """
    reasons = [f"{SLO_METRICS[k]} p{percentile:g} {figures_ms[k]:.1f} ms > {v:g} ms"
               for k, v in sorted(targets.items()) if figures_ms.get(k) is not None and figures_ms[k] > v]
    if saturated:
        reasons.append(f"saturated: {saturated}")
    return "; ".join(reasons) or None


def probe_of(m: ServingMeasurement, load: Mapping[str, Any], targets: Mapping[str, float], percentile: float,
             duration_s: float = 0.0) -> Probe:
    """A probe read from a served measurement at ``load`` (its ``request_rate`` the probe's rate): each SLO
    metric at the percentile over the measured requests, and the saturation test of a serving cell."""
    latencies = [serving.request_latencies(r) for r in m.requests[m.warmup_requests:]]
    per_metric = {"ttft_ms": [t for t, _, _, _ in latencies], "tpot_ms": [t for _, t, _, _ in latencies],
                  "e2e_ms": [e for _, _, e, _ in latencies]}
    figures = {}
    for key in targets:
        known = [v for v in per_metric[key] if v is not None]
        figures[key] = float(np.percentile(known, percentile)) * 1000.0 if known else None
    columns = serving.cell_columns(m, dict(load, slo={}))
    saturated = columns["saturation_reason"]
    return Probe(float(load["request_rate"]), figures, judge(figures, targets, percentile, saturated),
                 duration_s, columns["achieved_request_rate"], saturated)


@dataclass(frozen=True)
class Capacity:
    """What a search found: the highest rate that passed (None: not even the lowest), the interval the probes
    pinned it to (``low`` passed, ``high`` failed; inf: the highest rate searched passed), and every probe."""

    capacity: float | None
    low: float
    high: float
    probes: tuple[Probe, ...] = field(default_factory=tuple)
    duration_s: float = 0.0

    def limited_by(self, targets: Mapping[str, float]) -> str:
        """What the failed probes missed: the SLO metrics over target and "saturation" (the engine fell
        behind), each once; '' where no probe failed."""
        missed: dict[str, None] = {}
        for p in self.probes:
            if p.passed:
                continue
            for key, target in sorted(targets.items()):
                if (p.figures_ms.get(key) or 0.0) > target:
                    missed[SLO_METRICS[key]] = None
            if p.saturated:
                missed["saturation"] = None
        return ", ".join(missed)

    def text(self) -> str:
        """``"2.38 req/s [2.38, 2.83)"``, ``"below 0.25 req/s"``, ``"at least 8 req/s"``."""
        if self.capacity is None:
            return f"below {self.high:.3g} req/s"
        if math.isinf(self.high):
            return f"at least {self.capacity:.3g} req/s"
        return f"{self.capacity:.3g} req/s [{self.low:.3g}, {self.high:.3g})"


def search(probe: Callable[[float], Probe], settings: Settings,
           clock: Callable[[], float] = time.perf_counter) -> Capacity:
    """Bisect ``probe`` over the rates of ``settings`` for the highest rate that passes (see the module).

    Assumes a rate that fails fails at every higher rate (latency grows with load); a noisy probe that
    breaks it costs resolution, not correctness of the interval's lower end: the capacity named is
    always a rate that passed.
    """
    started = clock()
    probes: list[Probe] = []

    def run(rate: float) -> Probe:
        probes.append(probe(rate))
        return probes[-1]

    if not run(settings.min_rate).passed:
        return Capacity(None, 0.0, settings.min_rate, tuple(probes), clock() - started)
    low, high = settings.min_rate, settings.max_rate
    if run(high).passed:
        return Capacity(high, high, math.inf, tuple(probes), clock() - started)
    while len(probes) < settings.max_probes and high / low > 1.0 + settings.tolerance:
        rate = math.sqrt(low * high)
        if run(rate).passed:
            low = rate
        else:
            high = rate
    return Capacity(low, low, high, tuple(probes), clock() - started)


def verdict(label: str, baseline: Capacity, speculative: Capacity, targets: Mapping[str, float],
            percentile: float) -> str:
    """One sentence: how a configuration moves capacity at the SLOs against the baseline's.

    It *raises* (or *lowers*) capacity only where the two intervals do not overlap; otherwise the
    probes cannot tell the two apart at the search's resolution, and the sentence says so.
    """
    at = slo_text(targets, percentile)
    base, spec = baseline.capacity, speculative.capacity
    if base is None and spec is None:
        return f"{label}: neither it nor the baseline meets {at} at {baseline.high:.3g} req/s, the lowest rate searched"
    if base is None:
        return f"{label} raises capacity at {at} from below {baseline.high:.3g} to {speculative.text()}"
    if spec is None:
        return f"{label} lowers capacity at {at} from {baseline.text()} to below {speculative.high:.3g} req/s"
    ratio = spec / base
    if speculative.low >= baseline.high:
        return f"{label} raises capacity at {at} from {base:.3g} to {spec:.3g} req/s ({ratio:.2f}x)"
    if speculative.high <= baseline.low:
        return f"{label} lowers capacity at {at} from {base:.3g} to {spec:.3g} req/s ({ratio:.2f}x)"
    return (f"{label} leaves capacity at {at} where the baseline's is, within the search's resolution "
            f"({speculative.text()} against {baseline.text()})")


def as_json(label: str, found: Capacity) -> dict[str, Any]:
    """A search's result as capacity.json records it (infinite bounds as null)."""
    def finite(v: float) -> float | None:
        return v if math.isfinite(v) else None

    return {
        "configuration": label, "capacity_req_s": found.capacity, "interval_req_s": [found.low, finite(found.high)],
        "probes": len(found.probes), "search_s": round(found.duration_s, 2),
        "probe_results": [{"rate": p.rate, "passed": p.passed, "failed": p.failed, "figures_ms": dict(p.figures_ms),
                           "saturated": p.saturated, "achieved_rate": p.achieved_rate,
                           "other_cpu_share": p.other_cpu_share,
                           "duration_s": round(p.duration_s, 2)} for p in found.probes],
    }


def table(found: Sequence[tuple[str, Capacity]], targets: Mapping[str, float]) -> str:
    """The searches as a short text table: configuration, capacity and interval, probes, seconds, and what the
    failed probes missed (:meth:`Capacity.limited_by`)."""
    width = max([len("configuration"), *(len(label) for label, _ in found)])
    lines = [f"{'configuration':<{width}}  {'capacity':<28} {'probes':>6} {'time':>7}  limited by"]
    lines += [f"{label:<{width}}  {c.text():<28} {len(c.probes):>6} {c.duration_s:>6.0f}s  "
              f"{c.limited_by(targets) or '-'}" for label, c in found]
    return "\n".join(lines)
