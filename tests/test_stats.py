"""popkit.model.stats against values worked out by hand (and published t-table quantiles)."""

from __future__ import annotations

import math
import random

import pytest

from popkit.model import stats

# Student's t, 97.5th percentile, from printed tables.
T975 = {1: 12.706204736174698, 4: 2.7764451051977987, 8: 2.3060041352041662, 9: 2.2621571627409915,
        30: 2.0422724563012373}


def test_mean_std_err_median():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.mean(xs) == 3.0
    assert stats.std(xs) == pytest.approx(math.sqrt(2.5))  # squares 4+1+0+1+4 = 10, over n-1 = 4
    assert stats.err(xs) == pytest.approx(math.sqrt(2.5) / math.sqrt(5))
    assert stats.median(xs) == 3.0
    assert stats.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_std_of_one_sample_is_zero_and_empty_raises():
    assert stats.std([7.0]) == 0.0
    with pytest.raises(ValueError):
        stats.mean([])
    with pytest.raises(ValueError):
        stats.median([])


@pytest.mark.parametrize("df", sorted(T975))
def test_t_quantile_matches_tables(df):
    assert stats.t_quantile(0.975, df) == pytest.approx(T975[df], rel=1e-9)
    assert stats.t_quantile(0.025, df) == pytest.approx(-T975[df], rel=1e-9)


def test_mean_ci95_is_t_based():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    half = T975[4] * math.sqrt(2.5) / math.sqrt(5)
    ci = stats.mean_ci95(xs)
    assert ci.estimate == 3.0
    assert ci.low == pytest.approx(3.0 - half)
    assert ci.high == pytest.approx(3.0 + half)
    assert ci.contains(3.0) and not ci.contains(5.0)
    low, high = ci
    assert (low, high) == (ci.low, ci.high)


def test_mean_ci95_of_one_sample_is_undefined():
    ci = stats.mean_ci95([5.0])
    assert (ci.estimate, ci.low, ci.high, ci.defined) == (5.0, None, None, False)
    assert ci.contains(1e9)  # nothing is known, so nothing is excluded


def test_ratio_ci95_log_ratio_interval():
    a = [9.0, 10.0, 11.0]  # mean 10, std 1: var(log mean) = 1/(3*100) = 1/300
    b = [18.0, 20.0, 22.0]  # mean 20, std 2: var(log mean) = 4/(3*400) = 1/300
    # var = 2/300; Welch df = (2/300)^2 / (2 * (1/300)^2 / 2) = 4
    half = T975[4] * math.sqrt(2 / 300)
    ci = stats.ratio_ci95(a, b)
    assert ci.estimate == pytest.approx(0.5)
    assert ci.low == pytest.approx(0.5 * math.exp(-half))
    assert ci.high == pytest.approx(0.5 * math.exp(half))
    assert not ci.contains(1.0)


def test_ratio_ci95_spans_one_when_noisy():
    ci = stats.ratio_ci95([9.0, 10.0, 11.0], [8.0, 10.0, 12.0])
    assert ci.estimate == pytest.approx(1.0)
    assert ci.contains(1.0)


def test_ratio_ci95_from_summaries_matches_samples():
    a = stats.Summary(n=3, mean=10.0, std=1.0)
    b = stats.Summary(n=3, mean=20.0, std=2.0)
    assert stats.ratio_ci95_summary(a, b) == stats.ratio_ci95([9.0, 10.0, 11.0], [18.0, 20.0, 22.0])


def test_ratio_of_constant_samples_is_exact():
    ci = stats.ratio_ci95([4.0, 4.0], [2.0, 2.0])
    assert (ci.estimate, ci.low, ci.high) == (2.0, 2.0, 2.0)


def test_ratio_needs_two_samples_each_for_an_interval():
    ci = stats.ratio_ci95([4.0], [2.0, 2.5])
    assert ci.estimate == pytest.approx(4.0 / 2.25)
    assert not ci.defined


def test_geomean_ratio_ci95_combines_shapes():
    a, b = stats.Summary(3, 10.0, 1.0), stats.Summary(3, 20.0, 2.0)
    # two identical shapes: log value log(0.5); var = (2/300 + 2/300) / 4 = 1/300;
    # df = (1/300)^2 / (2 * (2/300/4)^2 / 4) = 8
    half = T975[8] * math.sqrt(1 / 300)
    ci = stats.geomean_ratio_ci95([(a, b), (a, b)])
    assert ci.estimate == pytest.approx(0.5)
    assert ci.low == pytest.approx(0.5 * math.exp(-half))
    assert ci.high == pytest.approx(0.5 * math.exp(half))


def test_geomean_of_ratios_estimate():
    one = stats.Summary(1, 2.0, 0.0)
    ci = stats.geomean_ratio_ci95([(one, stats.Summary(1, 1.0, 0.0)), (one, stats.Summary(1, 8.0, 0.0))])
    assert ci.estimate == pytest.approx(math.sqrt(2.0 * 0.25))  # geomean of 2 and 1/4
    assert not ci.defined


def test_interval_round_trip():
    ci = stats.Interval(1.5, 1.2, 1.8)
    assert stats.Interval.from_json(ci.to_json()) == ci
    undefined = stats.Interval(1.5, None, None)
    assert stats.Interval.from_json(undefined.to_json()) == undefined


def test_pooled_summary_equals_concatenated_samples():
    left = stats.Summary.of([0.5, 1.5])  # mean 1, std sqrt(0.5)
    right = stats.Summary.of([2.5, 3.5])  # mean 3, std sqrt(0.5)
    pooled = stats.pooled_summary([left, right])
    # all four: mean 2, squares 2.25 + 0.25 + 0.25 + 2.25 = 5 over n-1 = 3
    assert pooled.n == 4 and pooled.mean == pytest.approx(2.0)
    assert pooled.std == pytest.approx(math.sqrt(5 / 3))
    assert stats.pooled_summary([stats.Summary(1, 7.0, 0.0)]) == stats.Summary(1, 7.0, 0.0)


def test_paired_ratio_interval_is_student_t_on_log_ratios():
    logs = [0.1, -0.1, 0.3, -0.3]  # mean 0, sd sqrt(0.2/3), 3 degrees of freedom
    ci = stats.paired_ratio_interval([math.exp(x) for x in logs])
    half = stats.t_quantile(0.975, 3) * math.sqrt(0.2 / 3) / 2
    assert ci.estimate == pytest.approx(1.0)
    assert (ci.low, ci.high) == (pytest.approx(math.exp(-half)), pytest.approx(math.exp(half)))
    wider = stats.paired_ratio_interval([math.exp(x) for x in logs], confidence=0.99)
    assert wider.low < ci.low and wider.high > ci.high
    assert not stats.paired_ratio_interval([1.2]).defined
    with pytest.raises(ValueError):
        stats.paired_ratio_interval([1.0, 0.0])


def _rounds(rng, n, ratio, between, within):
    """n rounds of B / A: each eval's time has its own process effect (sd `between`) and call noise (`within`)."""
    return [ratio * math.exp(rng.gauss(0, between) - rng.gauss(0, between) + rng.gauss(0, within))
            for _ in range(n)]


def test_paired_ratio_interval_covers_one_for_identical_candidates():
    # Identical distributions, the spread between processes 20x the spread between calls.
    rng = random.Random(11)
    trials = 4000
    covered = sum(stats.paired_ratio_interval(_rounds(rng, 6, 1.0, 0.02, 0.001)).contains(1.0)
                  for _ in range(trials))
    assert covered / trials >= 0.94, covered  # 95% expected; 0.94 is 4 standard errors below


def test_paired_ratio_interval_detects_a_three_percent_shift():
    rng = random.Random(12)
    trials = 1000
    named = sum(stats.paired_ratio_interval(_rounds(rng, 6, 1.03, 0.003, 0.001)).low > 1.0 for _ in range(trials))
    assert named / trials >= 0.95, named


def test_positive_mean_interval_never_goes_below_zero():
    # The CPU case that printed `95% CI [-85489.25 ns, 690 µs]`: a few huge calls among small ones.
    samples = [20_000.0] * 8 + [2_000_000.0]
    plain = stats.mean_ci95(samples)
    assert plain.low < 0  # the symmetric interval is nonsense for a time here
    ci = stats.positive_mean_ci95(samples)
    assert 0 < ci.low < ci.estimate < ci.high
    assert ci.low * ci.high == pytest.approx(ci.estimate ** 2)  # symmetric on the log scale
    tight = stats.positive_mean_interval(1000.0, 1.0, 30)
    assert tight.low == pytest.approx(1000.0 - stats.t_quantile(0.975, 29), rel=1e-5)
    assert not stats.positive_mean_interval(5.0, 1.0, 1).defined
