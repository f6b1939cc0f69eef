"""Quantiles of the distributions the intervals and tests stand on (Student's t, chi-square), computed exactly
so that nothing here needs scipy, and how much less a median of normal values pins down than their mean."""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np


def _student_t_two_sided(t: float, df: int) -> float:
    """Return P(|T| < t) for T ~ Student t with integer df >= 1 and t >= 0.

    Exact finite series (Abramowitz and Stegun 26.7.3 and 26.7.4) in
    theta = atan(t / sqrt(df)); no numerical integration, so no error beyond
    float rounding.
    """
    theta = math.atan(t / math.sqrt(df))
    sin_theta, cos_theta = math.sin(theta), math.cos(theta)
    cos_sq = cos_theta * cos_theta
    if df % 2 == 1:
        # Odd df: (2/pi) [theta + sin cos (1 + 2/3 cos^2 + 2.4/(3.5) cos^4 + ...)],
        # the series running to cos^(df-2); it is empty for df = 1 (Cauchy).
        series = 0.0
        if df > 1:
            term = cos_theta
            series = term
            for k in range(3, df - 1, 2):
                term *= cos_sq * (k - 1) / k
                series += term
        return 2.0 / math.pi * (theta + sin_theta * series)
    # Even df: sin (1 + 1/2 cos^2 + 1.3/(2.4) cos^4 + ...), up to cos^(df-2).
    term = 1.0
    series = 1.0
    for k in range(2, df - 1, 2):
        term *= cos_sq * (k - 1) / k
        series += term
    return sin_theta * series


def student_t_quantile(p: float, df: int) -> float:
    """Return the p-quantile of Student's t distribution with df degrees of freedom.

    Inverts the exact CDF (see ``_student_t_two_sided``) by bisection to a
    relative tolerance of about 1e-13, using the symmetry t_p = -t_(1-p).
    Examples at p = 0.975: df=1 -> 12.7062, df=2 -> 4.3027, df=4 -> 2.7764,
    df=9 -> 2.2622, df=30 -> 2.0423. Cost grows linearly in df, which is fine
    for the handful of engine runs a benchmark makes.

    Raises:
        ValueError: if p is not strictly between 0 and 1 or df is not an
            integer >= 1.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
    if isinstance(df, bool) or not isinstance(df, (int, np.integer)) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    df = int(df)
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    target = 2.0 * p - 1.0
    low, high = 0.0, 1.0
    while _student_t_two_sided(high, df) < target:
        low, high = high, 2.0 * high
    while high - low > 1e-13 * high:
        middle = 0.5 * (low + high)
        if _student_t_two_sided(middle, df) < target:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def student_t_quantile_real(p: float, df: float) -> float:
    """The p-quantile of Student's t for real df >= 1 (Satterthwaite's degrees of freedom are not integers).

    Exact (:func:`student_t_quantile`) at integer df; between two integers,
    interpolated linearly in 1/df, the classical rule for t tables. The
    quantile is convex in 1/df, so this errs wide: t(0.975, 1.5) = 7.10
    against an exact 6.02, t(0.975, 1.81) = 5.19 against 4.77, t(0.975, 2.5)
    = 3.63 against 3.58 (still far from flooring to 1 df, 12.7).

    Raises:
        ValueError: if p is not strictly between 0 and 1 or df is not a finite number >= 1.
    """
    if isinstance(df, bool) or not isinstance(df, numbers.Real) or not math.isfinite(df) or df < 1:
        raise ValueError(f"df must be a finite number >= 1, got {df!r}")
    low = math.floor(df)
    if df == low:
        return student_t_quantile(p, int(low))
    weight = (1.0 / df - 1.0 / (low + 1)) / (1.0 / low - 1.0 / (low + 1))
    return weight * student_t_quantile(p, low) + (1.0 - weight) * student_t_quantile(p, low + 1)


def _chi_square_cdf(x: float, df: int) -> float:
    """P(X <= x) for X ~ chi-square with integer df >= 1: the finite series of the regularized gamma function."""
    if x <= 0.0:
        return 0.0
    half = x / 2.0
    if df % 2 == 0:
        term, series = 1.0, 1.0
        for k in range(1, df // 2):
            term *= half / k
            series += term
        return 1.0 - math.exp(-half) * series
    # Odd df: erf(sqrt(x/2)) less exp(-x/2) sum_{k=1}^{(df-1)/2} (x/2)^(k-1/2) / Gamma(k+1/2).
    term = math.sqrt(half) / math.gamma(1.5)
    series = 0.0
    for k in range(1, (df + 1) // 2):
        series += term
        term *= half / (k + 0.5)
    return math.erf(math.sqrt(half)) - math.exp(-half) * series


@functools.lru_cache(maxsize=None)
def chi_square_quantile(p: float, df: int) -> float:
    """The p-quantile of the chi-square distribution with integer df >= 1, by bisection on its exact CDF.

    Examples: p=0.5, df=1 -> 0.4549; p=0.3, df=1 -> 0.1485; p=0.3, df=2 -> 0.7133.

    Raises:
        ValueError: if p is not strictly between 0 and 1 or df is not an integer >= 1.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
    if isinstance(df, bool) or not isinstance(df, (int, np.integer)) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    low, high = 0.0, float(df) + 1.0
    while _chi_square_cdf(high, int(df)) < p:
        low, high = high, 2.0 * high
    while high - low > 1e-12 * high:
        middle = 0.5 * (low + high)
        if _chi_square_cdf(middle, int(df)) < p:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


@functools.lru_cache(maxsize=None)
def median_variance_factor(n: int) -> float:
    """Var(median of n) / Var(mean of n) for independent normal values: how much less a median pins down.

    1 for n <= 2 (the median of two is their mean); 1.3475 for n = 3 (the
    median of three normals varies by 0.4487, the mean by 1/3); towards pi/2
    as n grows. Integrated numerically from the order statistics' densities
    (the middle one for odd n, the middle two's joint density for even n) on
    a grid over +-8 standard deviations, to about 1e-3.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if n <= 2:
        return 1.0
    x = np.linspace(-8.0, 8.0, 1601 if n % 2 else 1201)
    step = float(x[1] - x[0])
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    k = (n + 1) // 2
    if n % 2:
        density = math.comb(n, k) * k * cdf ** (k - 1) * (1.0 - cdf) ** (n - k) * pdf
        variance = float(np.sum(x * x * density) * step)
    else:
        # (X_(k), X_(k+1)), k = n/2: n! / ((k-1)! (k-1)!) F(a)^(k-1) (1-F(b))^(k-1) f(a) f(b), a < b.
        scale = math.factorial(n) / math.factorial(k - 1) ** 2
        # The diagonal a = b is the region's edge: half its cells lie inside.
        above = np.triu(np.ones((x.size,) * 2)) - 0.5 * np.eye(x.size)
        joint = scale * np.outer(cdf ** (k - 1) * pdf, (1.0 - cdf) ** (k - 1) * pdf) * above
        middle = (x[:, None] + x[None, :]) / 2.0
        variance = float(np.sum(middle * middle * joint) * step * step)
    return variance * n
