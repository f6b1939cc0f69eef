"""Capacity: the highest request rate (or concurrency) at which a configuration meets every SLO, with an interval.

An operator asks of speculative decoding "how much more traffic does it let me
serve within my latency targets?", not "how much faster is one request?". The
answer is a *capacity*: the highest offered rate (requests/s) at which a
configuration's requests meet every ``load.slo.*`` target often enough (SLO
attainment at or above ``percentile``/100: 90% of requests, TPOT p90 <= 100 ms,
say) and its engine keeps up with the load (not saturated:
:func:`specbench.results.serving.saturation`).

A probe serves one arrival draw at one rate (:func:`probe_of` reads it). A rate
is *passed* when the Wilson lower bound of its SLO attainment, over the
requests of every probe at that rate pooled, is at or above the target;
*failed* when the upper bound is below it, or most of its probes saturated;
otherwise it is lengthened, another probe with a fresh arrival draw, up to
``max_extensions`` times (GuideLLM's goodput search resolves a probe only when
the interval lies wholly on one side of the target). The search
(:func:`search`) bisects on a log scale: the lowest rate, the highest, then
geometric midpoints of the highest rate passed and the lowest not passed. Its
bracket's ends are then measured again, ``confirmations`` times each with fresh
arrival draws (and fresh engines, where the probe function starts them), as
vLLM's sweeps run each level several times, and judged again with every probe
at the rate. The capacity is the highest rate passed below the lowest failed,
reported with the interval ``[passed, failed)``: the true capacity lies in it
unless a pass or a fail was wrong, which each interval bounds at 2.5%.

The same search runs along another axis (:class:`Axis`): the concurrency cap of a closed loop
(``load.max_concurrency`` with every request ready at once), where the capacity is the most requests a
configuration keeps in flight within the SLOs. Its values are whole numbers, so bisection takes the
rounded geometric midpoint and stops when no whole number lies between the ends.

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

from specbench.load import ServingMeasurement
from specbench.results import serving


# load.slo.<key> -> the per-request latency it bounds, and how the verdict names it.
SLO_METRICS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}


class CapacityError(ValueError):
    """A capacity search that cannot be run as configured (one line, naming the keys)."""


@dataclass(frozen=True)
class Axis:
    """What a search varies: the offered request rate of an open loop, or the concurrency cap of a closed
    loop. ``load_key`` is the ``load.*`` key a probe sets, ``unit`` how a value is named, ``json_key`` how
    capacity.json names the capacity and its interval, and ``integer`` whether its values are whole."""

    name: str
    load_key: str
    unit: str
    json_key: str
    integer: bool = False

    def text(self, value: float) -> str:
        """``"2.38 req/s"``, ``"12 concurrent requests"``."""
        return f"{value:.3g} {self.unit}"

    def midpoint(self, low: float, high: float) -> float | None:
        """The next value bisection probes between ``low`` and ``high``: their geometric mean, rounded for a
        whole-number axis and kept strictly inside; None where no whole number lies between them."""
        middle = math.sqrt(low * high)
        if not self.integer:
            return middle
        if high - low < 2:
            return None
        return float(min(max(round(middle), math.floor(low) + 1), math.ceil(high) - 1))


RATE = Axis("rate", "request_rate", "req/s", "req_s")
CONCURRENCY = Axis("concurrency", "max_concurrency", "concurrent requests", "concurrency", integer=True)
AXES = {axis.name: axis for axis in (RATE, CONCURRENCY)}


@dataclass
class CapacitySchema:
    """Types of ``capacity.*`` (conf/config.yaml holds the defaults and what each means)."""

    min_rate: float = 0.5
    max_rate: float = 8.0
    max_probes: int = 6
    requests_per_probe: int = 100
    min_probe_s: float = 30.0
    warmup: int = 4
    percentile: float = 90.0
    tolerance: float = 0.1
    max_extensions: int = 3
    confirmations: int = 3
    axis: str = "rate"
    min_concurrency: int = 1
    max_concurrency: int = 64


# What a rate's probes say of it (:func:`outcome`).
PASSED, FAILED, OPEN = "passed", "failed", "unresolved"


@dataclass(frozen=True)
class Settings:
    """How one search runs: the rates it spans, its probes' length, the share of requests the SLOs must hold
    for (``percentile`` / 100), how often an unresolved rate is lengthened and the bracket's ends measured again."""

    min_rate: float
    max_rate: float
    max_probes: int
    percentile: float = 90.0
    tolerance: float = 0.1
    requests_per_probe: int = 100
    warmup: int = 4
    min_probe_s: float = 30.0
    max_extensions: int = 3
    confirmations: int = 3
    axis: Axis = RATE
    min_concurrency: int = 1
    max_concurrency: int = 64

    @property
    def span(self) -> tuple[float, float]:
        """The lowest and the highest value searched along the axis (rates, or concurrency caps)."""
        if self.axis == CONCURRENCY:
            return float(self.min_concurrency), float(self.max_concurrency)
        return self.min_rate, self.max_rate

    @property
    def target(self) -> float:
        """The SLO attainment a rate must show: the share of requests meeting every target."""
        return self.percentile / 100.0

    def requests(self, rate: float) -> int:
        """How many requests a probe at ``rate`` sends, warm-up included: ``requests_per_probe`` measured,
        or as many as ``min_probe_s`` seconds of the rate, whichever is more (a trend needs a duration).

        Along the concurrency axis ``rate`` is the cap, and a probe is ``requests_per_probe`` measured
        requests: a closed loop has no rate to turn seconds into requests before it runs."""
        if self.axis == CONCURRENCY:
            return self.warmup + self.requests_per_probe
        return self.warmup + max(self.requests_per_probe, math.ceil(self.min_probe_s * rate))

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
        warmup, per_probe = capacity.get("warmup"), capacity.get("requests_per_probe")
        if not (isinstance(warmup, int) and warmup >= 0):
            errors.append(f"capacity.warmup={warmup!r} must be an integer >= 0")
        if not (isinstance(per_probe, int) and per_probe >= 2):
            errors.append(f"capacity.requests_per_probe={per_probe!r} must be an integer >= 2 (measured requests)")
        percentile = capacity.get("percentile")
        if not (isinstance(percentile, (int, float)) and 0 < percentile < 100):
            errors.append(f"capacity.percentile={percentile!r} must be in (0, 100): the share of "
                          "requests that must meet the SLOs")
        if not (isinstance(capacity.get("tolerance"), (int, float)) and capacity["tolerance"] > 0):
            errors.append(f"capacity.tolerance={capacity.get('tolerance')!r} must be > 0 (relative width)")
        seconds = capacity.get("min_probe_s", cls.min_probe_s)
        if not (isinstance(seconds, (int, float)) and 0 <= seconds < math.inf):
            errors.append(f"capacity.min_probe_s={seconds!r} must be a finite number of seconds >= 0")
        for key in ("max_extensions", "confirmations"):
            value = capacity.get(key, getattr(cls, key))
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                errors.append(f"capacity.{key}={value!r} must be an integer >= 0")
        axis = capacity.get("axis", RATE.name)
        if axis not in AXES:
            errors.append(f"capacity.axis={axis!r} must be rate or concurrency (rate: the offered request rate, an "
                          "open loop; concurrency: load.max_concurrency of a closed loop, every request ready at once)")
        fewest, most = (capacity.get(k, getattr(cls, k)) for k in ("min_concurrency", "max_concurrency"))
        if not (isinstance(fewest, int) and not isinstance(fewest, bool) and fewest >= 1):
            errors.append(f"capacity.min_concurrency={fewest!r} must be an integer >= 1 (requests in flight)")
        elif not (isinstance(most, int) and not isinstance(most, bool) and most > fewest):
            errors.append(f"capacity.max_concurrency={most!r} must be an integer above "
                          f"capacity.min_concurrency={fewest!r}")
        extensions = capacity.get("max_extensions", cls.max_extensions)
        if not errors and not _can_pass(per_probe * (1 + extensions), percentile / 100.0):
            least = next(n for n in range(per_probe, 100_000) if _can_pass(n * (1 + extensions), percentile / 100.0))
            errors.append(f"capacity.requests_per_probe={per_probe} is too few for capacity.percentile={percentile:g}: "
                          f"{1 + extensions} probes of a rate (capacity.max_extensions={extensions}), every request "
                          f"within the SLOs, would not show {percentile:g}% attainment by Wilson's lower bound; "
                          f"at least {least}")
        if errors:
            raise CapacityError("; ".join(errors))
        return cls(float(low), float(high), int(capacity["max_probes"]), float(capacity["percentile"]),
                   float(capacity["tolerance"]), int(capacity["requests_per_probe"]), int(capacity["warmup"]),
                   float(seconds), int(capacity.get("max_extensions", cls.max_extensions)),
                   int(capacity.get("confirmations", cls.confirmations)), AXES[axis], int(fewest), int(most))


def _can_pass(requests: int, target: float) -> bool:
    """Whether ``requests`` requests, all within the SLOs, show an attainment of ``target`` by Wilson's lower bound."""
    low, _ = serving.wilson(requests, requests)
    return low is not None and low >= target


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
    """One probe: the rate served (along the concurrency axis: the cap), each SLO metric at the percentile
    (ms), what it missed (None: nothing), the measured requests and how many met every target, and, apart,
    why its engine fell behind the load (None: it kept up)."""

    rate: float
    figures_ms: Mapping[str, float | None]
    failed: str | None
    duration_s: float = 0.0
    achieved_rate: float | None = None
    saturated: str | None = None
    # Share of the machine's cores other processes kept busy while it ran (None: not read): a probe
    # disturbed by them may fail a rate its configuration serves on a quiet machine.
    other_cpu_share: float | None = None
    met: int = 0
    requests: int = 0
    # Which arrival draw it served (each probe of a search draws its own).
    draw: int = 0

    @property
    def passed(self) -> bool:
        """Whether the probe met every SLO at the percentile and its engine kept up."""
        return self.failed is None


def outcome(probes: Sequence[Probe], target: float) -> str:
    """What the probes of one rate say of it, their requests pooled: :data:`PASSED` when the Wilson lower
    bound of the SLO attainment is at or above ``target`` and fewer than half of them saturated;
    :data:`FAILED` when its upper bound is below ``target``, or more than half of two or more saturated;
    else :data:`OPEN` (lengthen it: one saturated probe may be the test's 5% of false alarms)."""
    met, requests = sum(p.met for p in probes), sum(p.requests for p in probes)
    saturated = sum(1 for p in probes if p.saturated)
    low, high = serving.wilson(met, requests)
    if low is None or high is None:
        return OPEN
    if high < target or (len(probes) >= 2 and 2 * saturated > len(probes)):
        return FAILED
    if low >= target and 2 * saturated < len(probes):
        return PASSED
    return OPEN


def judge(figures_ms: Mapping[str, float | None], targets: Mapping[str, float], percentile: float,
          saturated: str | None = None) -> str | None:
    """What a probe missed, in words (every target over at the percentile, and saturation); None when it
    meets them all. A metric that no request reported (a TPOT where every request produced one token)
    cannot miss.
    """
    reasons = [f"{SLO_METRICS[k]} p{percentile:g} {figures_ms[k]:.1f} ms > {v:g} ms"
               for k, v in sorted(targets.items()) if figures_ms.get(k) is not None and figures_ms[k] > v]
    if saturated:
        reasons.append(f"saturated: {saturated}")
    return "; ".join(reasons) or None


def probe_of(m: ServingMeasurement, load: Mapping[str, Any], targets: Mapping[str, float], percentile: float,
             duration_s: float = 0.0, draw: int = 0, axis: Axis = RATE) -> Probe:
    """A probe read from a served measurement at ``load`` (its ``axis.load_key``, the request rate or the
    concurrency cap, the probe's value): each SLO metric at the percentile over the measured requests, how
    many met every target, and the saturation test of a serving cell."""
    measured = m.requests[m.warmup_requests:]
    latencies = [serving.request_latencies(r) for r in measured]
    per_metric = {"ttft_ms": [t for t, _, _, _ in latencies], "tpot_ms": [t for _, t, _, _ in latencies],
                  "e2e_ms": [e for _, _, e, _ in latencies]}
    figures = {}
    for key in targets:
        known = [v for v in per_metric[key] if v is not None]
        figures[key] = float(np.percentile(known, percentile)) * 1000.0 if known else None
    columns = serving.cell_columns(m, dict(load, slo={}))
    saturated = columns["saturation_reason"]
    return Probe(float(load[axis.load_key]), figures, judge(figures, targets, percentile, saturated),
                 duration_s, columns["achieved_request_rate"], saturated,
                 met=sum(serving.meets_slo(r, targets) for r in measured), requests=len(measured), draw=draw)


@dataclass(frozen=True)
class Capacity:
    """What a search found: the highest rate passed below the lowest failed (None: none), the interval the
    probes pinned it to (``low`` passed, ``high`` failed; inf: no rate searched failed), and every probe;
    ``axis`` says what was searched (rates, or concurrency caps)."""

    capacity: float | None
    low: float
    high: float
    probes: tuple[Probe, ...] = field(default_factory=tuple)
    duration_s: float = 0.0
    axis: Axis = RATE

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

    def covers(self, rate: float) -> bool:
        """Whether ``rate`` lies in the interval the search reports (``[low, high)``)."""
        return self.low <= rate < self.high

    def text(self) -> str:
        """``"2.38 req/s [2.38, 2.83)"``, ``"below 0.25 req/s"``, ``"at least 8 req/s"``;
        ``"12 concurrent requests [12, 14)"`` along the concurrency axis."""
        if self.capacity is None:
            return f"below {self.axis.text(self.high)}"
        if math.isinf(self.high):
            return f"at least {self.axis.text(self.capacity)}"
        return f"{self.axis.text(self.capacity)} [{self.low:.3g}, {self.high:.3g})"


def search(probe: Callable[[float, int], Probe], settings: Settings,
           clock: Callable[[], float] = time.perf_counter, renew: Callable[[], None] | None = None) -> Capacity:
    """Search ``probe`` over the rates of ``settings`` for the highest rate that passes (see the module).

    ``probe(rate, draw)`` serves arrival draw ``draw`` at ``rate``; every call gets a draw of its own.
    Along ``settings.axis`` = :data:`CONCURRENCY`, ``rate`` is a concurrency cap (a whole number) and the
    same decisions, bisection and confirmations apply.
    ``renew`` (where given) starts a fresh engine; it is called before each probe that measures a bracket's
    end again, so that the confirmations hold the engine-to-engine spread as well as the arrivals'.
    Bisection assumes a rate that fails fails at every higher rate (latency grows with load); the interval
    reported is read from every probe at the end, so a probe that broke it widens the interval rather
    than moving it.
    """
    started = clock()
    probes: list[Probe] = []
    by_rate: dict[float, list[Probe]] = {}

    def measure(rate: float) -> None:
        probes.append(probe(rate, len(probes)))
        by_rate.setdefault(rate, []).append(probes[-1])

    def level(rate: float) -> str:
        """A rate's outcome, lengthened (fresh draws) while it is unresolved."""
        measure(rate)
        while outcome(by_rate[rate], settings.target) == OPEN and len(by_rate[rate]) <= settings.max_extensions:
            measure(rate)
        return outcome(by_rate[rate], settings.target)

    lowest, highest = settings.span
    if level(lowest) == PASSED and level(highest) != PASSED:
        low, high = lowest, highest
        while len(by_rate) < settings.max_probes and high / low > 1.0 + settings.tolerance:
            middle = settings.axis.midpoint(low, high)
            if middle is None:
                break
            rate = middle
            if level(rate) == PASSED:
                low = rate
            else:
                high = rate
    confirmed: set[float] = set()
    while True:
        low, high = _bracket(by_rate, settings.target)
        todo = [r for r in (low, high) if r is not None and math.isfinite(r) and r not in confirmed]
        if not todo or not settings.confirmations:
            break
        for rate in todo:
            confirmed.add(rate)
            for _ in range(settings.confirmations):
                if renew is not None:
                    renew()
                measure(rate)
    if low is None:
        # Not even the lowest rate passed: capacity is below the lowest rate that failed, or, where none
        # failed outright, below the lowest searched.
        return Capacity(None, 0.0, min(high, lowest), tuple(probes), clock() - started, settings.axis)
    return Capacity(low, low, high, tuple(probes), clock() - started, settings.axis)


def _bracket(by_rate: Mapping[float, Sequence[Probe]], target: float) -> tuple[float | None, float]:
    """The lowest rate failed (inf: none) and the highest passed below it (None: none), every probe of a
    rate pooled."""
    outcomes = {rate: outcome(found, target) for rate, found in by_rate.items()}
    high = min((r for r, o in outcomes.items() if o == FAILED), default=math.inf)
    low = max((r for r, o in outcomes.items() if o == PASSED and r < high), default=None)
    return low, high


def verdict(label: str, baseline: Capacity, speculative: Capacity, targets: Mapping[str, float],
            percentile: float) -> str:
    """One sentence: how a configuration moves capacity at the SLOs against the baseline's.

    It *raises* (or *lowers*) capacity only where the two intervals do not overlap: the one configuration
    passed a rate the other failed, each judged on its own Wilson intervals and measured again at its
    bracket's ends. The factor is then given as the least the intervals allow. Otherwise the sentence
    says the searches cannot tell the two apart.
    """
    at = slo_text(targets, percentile)
    base, spec = baseline.capacity, speculative.capacity
    axis = baseline.axis
    if base is None and spec is None:
        lowest = "rate" if axis == RATE else "concurrency"
        return (f"{label}: neither it nor the baseline meets {at} at {axis.text(baseline.high)}, "
                f"the lowest {lowest} searched")
    if base is None and speculative.low >= baseline.high:
        return f"{label} raises capacity at {at} from below {baseline.high:.3g} to {speculative.text()}"
    if spec is None and baseline.low >= speculative.high:
        return f"{label} lowers capacity at {at} from {baseline.text()} to below {axis.text(speculative.high)}"
    if base is not None and spec is not None and speculative.low >= baseline.high:
        return (f"{label} raises capacity at {at} from {baseline.text()} to {speculative.text()} "
                f"(at least {speculative.low / baseline.high:.2f}x)")
    if base is not None and spec is not None and speculative.high <= baseline.low:
        return (f"{label} lowers capacity at {at} from {baseline.text()} to {speculative.text()} "
                f"(at most {speculative.high / baseline.low:.2f}x)")
    return (f"{label} leaves capacity at {at} where the baseline's is, as far as the intervals tell "
            f"({speculative.text()} against {baseline.text()})")


def as_json(label: str, found: Capacity) -> dict[str, Any]:
    """A search's result as capacity.json records it (infinite bounds as null)."""
    def finite(v: float) -> float | None:
        return v if math.isfinite(v) else None

    key = found.axis.json_key
    # A probe names its value by the load.* key it set: "rate" (as before the axis existed) or "max_concurrency".
    value = "rate" if found.axis == RATE else found.axis.load_key
    return {
        "configuration": label, "axis": found.axis.name, f"capacity_{key}": found.capacity,
        f"interval_{key}": [found.low, finite(found.high)],
        "probes": len(found.probes), "search_s": round(found.duration_s, 2),
        "probe_results": [{value: p.rate, "draw": p.draw, "met": p.met, "requests": p.requests,
                           "passed": p.passed, "failed": p.failed, "figures_ms": dict(p.figures_ms),
                           "saturated": p.saturated, "achieved_rate": p.achieved_rate,
                           "other_cpu_share": p.other_cpu_share,
                           "duration_s": round(p.duration_s, 2)} for p in found.probes],
    }


def table(found: Sequence[tuple[str, Capacity]], targets: Mapping[str, float]) -> str:
    """The searches as a short text table: configuration, capacity and interval, probes, seconds, and what the
    failed probes missed (:meth:`Capacity.limited_by`)."""
    width = max([len("configuration"), *(len(label) for label, _ in found)])
    lines = [f"{'configuration':<{width}}  {'capacity':<32} {'probes':>6} {'time':>7}  limited by"]
    lines += [f"{label:<{width}}  {c.text():<32} {len(c.probes):>6} {c.duration_s:>6.0f}s  "
              f"{c.limited_by(targets) or '-'}" for label, c in found]
    return "\n".join(lines)
