"""Bootstrap intervals, the paired bootstrap and the tests across seeds against their definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr, ttest_rel

from sentemb.eval.bootstrap import (
    accuracy_interval,
    paired_spearman_difference,
    percentile_interval,
    resample_indices,
    resampled_spearman,
    spearman_interval,
    two_sided_p,
)
from sentemb.eval.significance import holm, paired_t_test, separable, t_interval


def scored_pairs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Cosines with repeated values (duplicated sentences) and gold scores on SentEval's coarse 0–5 grid (ties)."""
    rng = np.random.default_rng(seed)
    gold = np.round(rng.uniform(0, 5, n) * 5) / 5
    predicted = np.round(gold / 5 + rng.normal(0, 0.2, n), 2)
    return predicted, gold


@pytest.mark.parametrize("sizes", [[300], [120, 45, 200]], ids=["one set", "pooled subsets"])
def test_vectorised_bootstrap_equals_a_naive_loop(sizes):
    predicted, gold = scored_pairs(sum(sizes), seed=3)
    indices = resample_indices(sizes, resamples=1000, seed=7)
    (fast,) = resampled_spearman([predicted], gold, indices)
    naive = np.array([100 * spearmanr(predicted[row], gold[row])[0] for row in indices])
    # the same statistic of the same resamples; only the summation order differs
    np.testing.assert_allclose(fast, naive, rtol=0, atol=1e-9)
    interval = spearman_interval(predicted, gold, sizes=sizes, resamples=1000, seed=7)
    low, high = np.percentile(naive, [2.5, 97.5])
    assert interval.low == pytest.approx(low, abs=1e-9) and interval.high == pytest.approx(high, abs=1e-9)
    assert interval.estimate == pytest.approx(100 * spearmanr(predicted, gold)[0], abs=1e-12)
    if len(sizes) > 1:  # within each subset: every resample keeps the subsets' sizes
        bounds = np.cumsum([0, *sizes])
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            block = indices[:, start:stop]
            assert block.min() >= start and block.max() < stop


def test_same_seed_same_interval_other_seed_other_resamples():
    predicted, gold = scored_pairs(200, seed=1)
    assert spearman_interval(predicted, gold, seed=5) == spearman_interval(predicted, gold, seed=5)
    assert not np.array_equal(resample_indices([200], 10, seed=5), resample_indices([200], 10, seed=6))


def test_interval_covers_the_population_spearman_about_95_percent_of_the_time():
    # bivariate normal with Pearson rho: Spearman's rho_s = (6/pi) arcsin(rho/2) (Kendall & Gibbons)
    rho, n, samples = 0.6, 150, 400
    truth = 100 * 6 / math.pi * math.asin(rho / 2)
    rng = np.random.default_rng(2026)
    covered = 0
    for sample in range(samples):
        x, y = rng.multivariate_normal([0, 0], [[1, rho], [rho, 1]], size=n).T
        interval = spearman_interval(x, y, seed=sample)
        covered += interval.low <= truth <= interval.high
    assert 0.91 <= covered / samples <= 0.98, covered / samples


def test_paired_bootstrap_of_a_model_against_itself_is_zero_with_p_one():
    predicted, gold = scored_pairs(250, seed=4)
    result = paired_spearman_difference(predicted, predicted.copy(), gold, estimate=0.0)
    assert result.difference.as_dict() == {"estimate": 0.0, "low": 0.0, "high": 0.0}
    assert result.p_value == 1.0


def test_paired_bootstrap_tells_a_better_model_apart():
    predicted, gold = scored_pairs(400, seed=5)
    noisy = predicted + np.random.default_rng(0).normal(0, 0.3, len(predicted))
    estimate = 100 * (spearmanr(predicted, gold)[0] - spearmanr(noisy, gold)[0])
    result = paired_spearman_difference(predicted, noisy, gold, estimate=estimate, resamples=1000)
    assert result.difference.low > 0 and result.p_value == pytest.approx(2 / 1001)
    # the difference's resamples are A's minus B's over the same resamples
    indices = resample_indices([400], 1000)
    a, b = resampled_spearman([predicted, noisy], gold, indices)
    assert result.difference == percentile_interval(estimate, a - b)


def test_two_sided_p_counts_the_observed_sample():
    assert two_sided_p(np.array([1.0, 2.0, 3.0])) == pytest.approx(2 * 1 / 4)
    assert two_sided_p(np.array([-1.0, 2.0, 3.0, 4.0])) == pytest.approx(2 * 2 / 5)
    assert two_sided_p(np.zeros(9)) == 1.0
    assert math.isnan(two_sided_p(np.full(5, np.nan)))  # every resample undefined: no test


def test_accuracy_interval_equals_a_loop():
    correct = (np.random.default_rng(3).uniform(size=500) < 0.8).astype(float)
    interval = accuracy_interval(correct, resamples=1000, seed=9)
    naive = [100 * correct[row].mean() for row in resample_indices([500], 1000, seed=9)]
    assert (interval.low, interval.high) == pytest.approx(tuple(np.percentile(naive, [2.5, 97.5])), abs=1e-9)
    assert interval.estimate == pytest.approx(100 * correct.mean())


def test_paired_t_test_is_scipys_over_the_shared_seeds():
    a = {1: 80.1, 2: 79.5, 3: 80.9, 4: 81.0}
    b = {1: 79.0, 2: 79.6, 3: 79.8}
    result = paired_t_test(a, b)
    expected = ttest_rel([80.1, 79.5, 80.9], [79.0, 79.6, 79.8])
    assert result.seeds == (1, 2, 3)
    assert (result.statistic, result.p_value) == (expected.statistic, expected.pvalue)
    assert result.difference == pytest.approx((1.1 - 0.1 + 1.1) / 3)
    assert paired_t_test(a, a).p_value == 1.0  # the same numbers: no evidence of a difference
    assert math.isnan(paired_t_test({1: 1.0}, {1: 2.0}).p_value)  # one shared seed: no test
    offset = paired_t_test({1: 2.0, 2: 3.0, 3: 4.0}, {1: 1.0, 2: 2.0, 3: 3.0})  # ttest_rel: t = inf, p = 0
    assert offset.difference == 1.0 and math.isnan(offset.statistic) and math.isnan(offset.p_value)


def test_holm_equals_a_hand_computation():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → running max 0.06
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adjusted = holm([0.2, math.nan, 0.01])  # an untested task is not in the family
    assert adjusted[0] == pytest.approx(0.2) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.02)
    assert [separable(x) for x in adjusted] == [False, None, True]


def test_t_interval():
    values = [80.0, 81.0, 82.5]
    interval = t_interval(values)
    half = 4.302652729911275 * np.std(values, ddof=1) / math.sqrt(3)  # t_{2, 0.975}
    assert (interval.low, interval.high) == pytest.approx((81.1666666 - half, 81.1666666 + half))
    assert math.isnan(t_interval([80.0]).low)
