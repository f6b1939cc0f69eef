"""Hand-computed checks for specbench.stats."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specbench.stats import (
    Summary,
    bootstrap_median_ci,
    latency_percentiles,
    percentile,
    ratio_summary,
    student_t_quantile,
    summarize,
    widen_with_within,
)

# Two-sided 95% t quantiles from printed tables.
T_975 = {1: 12.706, 2: 4.303, 4: 2.776, 9: 2.262, 30: 2.042}


class TestPercentile:
    @pytest.mark.parametrize(
        ("q", "expected"),
        [(50, 2.5), (90, 3.7), (99, 3.97), (0, 1.0), (100, 4.0), (25, 1.75)],
    )
    def test_linear_interpolation_between_ranks(self, q: float, expected: float) -> None:
        # Rank q/100 * (n-1): at 90 that is 2.7, so 3 + 0.7 * (4 - 3) = 3.7.
        assert percentile([1, 2, 3, 4], q) == pytest.approx(expected)

    def test_order_of_input_does_not_matter(self) -> None:
        assert percentile([4, 1, 3, 2], 90) == pytest.approx(3.7)

    def test_single_value_is_every_percentile(self) -> None:
        assert percentile([7.5], 0) == 7.5
        assert percentile([7.5], 50) == 7.5
        assert percentile([7.5], 100) == 7.5

    def test_empty_is_none(self) -> None:
        assert percentile([], 50) is None

    @pytest.mark.parametrize("q", [-0.1, 100.1, math.nan])
    def test_q_out_of_range_names_q(self, q: float) -> None:
        with pytest.raises(ValueError, match="q"):
            percentile([1, 2], q)

    def test_non_finite_value_rejected(self) -> None:
        with pytest.raises(ValueError, match="finite"):
            percentile([1.0, math.nan], 50)

    def test_returns_plain_float(self) -> None:
        assert type(percentile([1, 2, 3], 50)) is float


class TestLatencyPercentiles:
    def test_keys_and_values(self) -> None:
        result = latency_percentiles([1, 2, 3, 4], "ttft")
        assert list(result) == ["ttft_p50", "ttft_p90", "ttft_p99"]
        assert result["ttft_p50"] == pytest.approx(2.5)
        assert result["ttft_p90"] == pytest.approx(3.7)
        assert result["ttft_p99"] == pytest.approx(3.97)

    def test_empty_gives_none_values(self) -> None:
        assert latency_percentiles([], "tpot") == {
            "tpot_p50": None,
            "tpot_p90": None,
            "tpot_p99": None,
        }


class TestBootstrapMedianCI:
    def test_contains_median(self) -> None:
        values = [10.2, 10.5, 9.8, 10.1, 11.0, 10.3, 9.9]
        low, high = bootstrap_median_ci(values)
        assert low <= float(np.median(values)) <= high
        assert low < high

    def test_within_sample_range(self) -> None:
        # Bootstrap medians are medians of resampled data, so they cannot
        # leave [min, max].
        values = [3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.6]
        low, high = bootstrap_median_ci(values)
        assert min(values) <= low <= high <= max(values)

    def test_deterministic_for_seed(self) -> None:
        values = [1.0, 2.0, 2.5, 3.0, 8.0, 4.0]
        assert bootstrap_median_ci(values, seed=3) == bootstrap_median_ci(values, seed=3)

    def test_seed_changes_draws(self) -> None:
        values = list(np.random.default_rng(1).normal(10.0, 1.0, size=15))
        assert bootstrap_median_ci(values, seed=0) != bootstrap_median_ci(values, seed=1)

    def test_narrows_as_n_grows(self) -> None:
        rng = np.random.default_rng(42)
        small = rng.normal(100.0, 5.0, size=10)
        large = rng.normal(100.0, 5.0, size=400)
        small_low, small_high = bootstrap_median_ci(small.tolist())
        large_low, large_high = bootstrap_median_ci(large.tolist())
        assert large_high - large_low < (small_high - small_low) / 2

    def test_narrows_as_confidence_drops(self) -> None:
        values = list(np.random.default_rng(5).normal(10.0, 1.0, size=30))
        low95, high95 = bootstrap_median_ci(values, confidence=0.95)
        low50, high50 = bootstrap_median_ci(values, confidence=0.5)
        assert low95 <= low50 <= high50 <= high95

    def test_identical_values_degenerate(self) -> None:
        assert bootstrap_median_ci([3.0, 3.0, 3.0, 3.0]) == (3.0, 3.0)

    def test_single_value(self) -> None:
        assert bootstrap_median_ci([2.5]) == (2.5, 2.5)

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"confidence": 1.0}, "confidence"),
            ({"confidence": 0.0}, "confidence"),
            ({"resamples": 0}, "resamples"),
        ],
    )
    def test_rejects_bad_arguments(self, kwargs: dict[str, float], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            bootstrap_median_ci([1.0, 2.0], **kwargs)  # type: ignore[arg-type]

    def test_empty_rejected(self) -> None:
        with pytest.raises(ValueError, match="empty"):
            bootstrap_median_ci([])


class TestSummarize:
    def test_cv_hand_case(self) -> None:
        # mean 2, sample sd sqrt(((1-2)^2 + 0 + (3-2)^2) / 2) = 1.
        summary = summarize([1, 2, 3])
        assert summary.cv == pytest.approx(0.5)
        assert summary.median == 2.0
        assert summary.n == 3
        assert summary.method == "bootstrap-percentile-95"

    def test_interval_is_the_bootstrap_interval(self) -> None:
        values = [5.0, 5.2, 4.9, 5.1, 6.0]
        summary = summarize(values, seed=7)
        assert (summary.ci_low, summary.ci_high) == bootstrap_median_ci(values, seed=7)

    def test_method_names_confidence(self) -> None:
        assert summarize([1, 2, 3], confidence=0.9).method == "bootstrap-percentile-90"
        assert summarize([1, 2, 3], confidence=0.975).method == "bootstrap-percentile-97.5"

    def test_single_value(self) -> None:
        assert summarize([4.0]) == Summary(
            median=4.0, ci_low=4.0, ci_high=4.0, cv=None, n=1, method="single"
        )

    def test_identical_values(self) -> None:
        summary = summarize([2.0, 2.0, 2.0])
        assert (summary.ci_low, summary.ci_high) == (2.0, 2.0)
        assert summary.cv == 0.0

    def test_empty_rejected(self) -> None:
        with pytest.raises(ValueError, match="empty"):
            summarize([])


class TestStudentTQuantile:
    @pytest.mark.parametrize(("df", "expected"), sorted(T_975.items()))
    def test_table_values_at_975(self, df: int, expected: float) -> None:
        assert round(student_t_quantile(0.975, df), 3) == expected

    @pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995, 0.9995])
    def test_df1_closed_form(self, p: float) -> None:
        # Cauchy: t = tan(pi (p - 1/2)).
        assert student_t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)

    @pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995, 0.9995])
    def test_df2_closed_form(self, p: float) -> None:
        expected = (2 * p - 1) / math.sqrt(2 * p * (1 - p))
        assert student_t_quantile(p, 2) == pytest.approx(expected, rel=1e-10)

    def test_more_table_values(self) -> None:
        # Upper 0.95 and 0.995 points from printed tables.
        assert round(student_t_quantile(0.95, 3), 3) == 2.353
        assert round(student_t_quantile(0.995, 5), 3) == 4.032
        assert round(student_t_quantile(0.995, 10), 3) == 3.169

    def test_approaches_normal_for_large_df(self) -> None:
        assert student_t_quantile(0.975, 10_000) == pytest.approx(1.95996, abs=3e-4)

    def test_symmetry_and_median(self) -> None:
        assert student_t_quantile(0.5, 4) == 0.0
        assert student_t_quantile(0.025, 4) == pytest.approx(-student_t_quantile(0.975, 4))

    @pytest.mark.parametrize(("p", "df"), [(0.0, 3), (1.0, 3), (0.9, 0), (0.9, 2.5), (0.9, True)])
    def test_rejects_bad_arguments(self, p: float, df: int) -> None:
        with pytest.raises(ValueError):
            student_t_quantile(p, df)


class TestRatioSummary:
    def test_identical_ratios_give_zero_width(self) -> None:
        summary = ratio_summary([1.2, 1.2])
        assert summary.median == pytest.approx(1.2)
        assert summary.ci_low == pytest.approx(1.2)
        assert summary.ci_high == pytest.approx(1.2)
        assert summary.n == 2
        assert summary.method == "t-log-95"

    def test_two_ratios_hand_case(self) -> None:
        # ln 1.0 = 0 and ln 1.21 = 2 ln 1.1, so the mean of logs is ln 1.1,
        # the sample sd is |2 ln 1.1| / sqrt(2) = sqrt(2) ln 1.1, and the
        # half-width is t(df=1) * sqrt(2) ln 1.1 / sqrt(2) = t * ln 1.1.
        t1 = math.tan(0.475 * math.pi)  # 12.7062...
        summary = ratio_summary([1.0, 1.21])
        assert summary.median == pytest.approx(1.105)
        assert summary.ci_low == pytest.approx(1.1 ** (1 - t1))
        assert summary.ci_high == pytest.approx(1.1 ** (1 + t1))
        # Numbers for a reader checking by hand: 1.1^-11.706 and 1.1^13.706.
        assert summary.ci_low == pytest.approx(0.32768, abs=1e-5)
        assert summary.ci_high == pytest.approx(3.69264, abs=1e-5)
        # cv of the ratios themselves: sd 0.21 / sqrt(2) over mean 1.105.
        assert summary.cv == pytest.approx(0.21 / math.sqrt(2) / 1.105)

    def test_five_passes_uses_df4(self) -> None:
        ratios = [1.5, 1.6, 1.4, 1.55, 1.45]
        logs = np.log(ratios)
        half = 2.7764451 * logs.std(ddof=1) / math.sqrt(5)
        summary = ratio_summary(ratios)
        assert summary.ci_low == pytest.approx(math.exp(logs.mean() - half), rel=1e-6)
        assert summary.ci_high == pytest.approx(math.exp(logs.mean() + half), rel=1e-6)
        assert summary.median == 1.5

    def test_interval_is_symmetric_in_log(self) -> None:
        # Speedups 2x and 0.5x are mirror images: centre exactly 1.
        summary = ratio_summary([2.0, 0.5])
        assert summary.ci_low * summary.ci_high == pytest.approx(1.0)

    def test_single_ratio(self) -> None:
        assert ratio_summary([1.3]) == Summary(
            median=1.3, ci_low=1.3, ci_high=1.3, cv=None, n=1, method="single"
        )

    @pytest.mark.parametrize("ratios", [[1.2, 0.0], [-1.1, 1.2], [0.0]])
    def test_rejects_non_positive(self, ratios: list[float]) -> None:
        with pytest.raises(ValueError, match="positive"):
            ratio_summary(ratios)

    def test_rejects_empty(self) -> None:
        with pytest.raises(ValueError, match="empty"):
            ratio_summary([])


class TestWidenWithWithin:
    def test_none_is_unchanged(self) -> None:
        summary = ratio_summary([1.0, 1.21])
        assert widen_with_within(summary, None) is summary

    def test_two_pass_hand_case(self) -> None:
        # h = t1 ln 1.1 from the hand case above; the within term is
        # t1 * sqrt(2) * 0.05, so h_new = t1 sqrt(ln(1.1)^2 + 2 * 0.05^2).
        t1 = math.tan(0.475 * math.pi)
        base = ratio_summary([1.0, 1.21])
        widened = widen_with_within(base, 0.05)
        h_new = t1 * math.sqrt(math.log(1.1) ** 2 + 2 * 0.05**2)
        assert widened.ci_low == pytest.approx(1.1 * math.exp(-h_new))
        assert widened.ci_high == pytest.approx(1.1 * math.exp(h_new))
        assert widened.median == base.median
        assert widened.cv == base.cv
        assert widened.n == 2
        assert widened.method == "t-log-95+within"

    def test_identical_passes_get_within_width(self) -> None:
        # h = 0, so only the within term is left: t1 * sqrt(2) * 0.01.
        t1 = math.tan(0.475 * math.pi)
        widened = widen_with_within(ratio_summary([1.2, 1.2]), 0.01)
        h_new = t1 * math.sqrt(2) * 0.01
        assert widened.ci_low == pytest.approx(1.2 * math.exp(-h_new))
        assert widened.ci_high == pytest.approx(1.2 * math.exp(h_new))

    def test_single_pass_uses_normal_quantile(self) -> None:
        # h = z_0.975 * sqrt(2) * 0.02 = 1.959964 * 0.0282843 = 0.055436.
        widened = widen_with_within(ratio_summary([1.5]), 0.02)
        assert widened.ci_low == pytest.approx(1.5 * math.exp(-0.0554362), rel=1e-6)
        assert widened.ci_high == pytest.approx(1.5 * math.exp(0.0554362), rel=1e-6)
        assert widened.method == "single+within"

    def test_never_narrower(self) -> None:
        base = ratio_summary([1.4, 1.5, 1.45])
        widened = widen_with_within(base, 0.03)
        assert widened.ci_low < base.ci_low
        assert widened.ci_high > base.ci_high
        # Centre in log space is kept.
        assert widened.ci_low * widened.ci_high == pytest.approx(base.ci_low * base.ci_high)

    def test_rejects_negative_cv(self) -> None:
        with pytest.raises(ValueError, match="within_cv"):
            widen_with_within(ratio_summary([1.1, 1.2]), -0.01)

    def test_rejects_summary_not_from_ratio_summary(self) -> None:
        with pytest.raises(ValueError, match="method"):
            widen_with_within(summarize([1.0, 2.0, 3.0]), 0.01)

    def test_rejects_confidence_mismatch(self) -> None:
        with pytest.raises(ValueError, match="confidence"):
            widen_with_within(ratio_summary([1.1, 1.2], confidence=0.9), 0.01)
