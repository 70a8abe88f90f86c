"""Tests across seeds: the paired t-test over the seeds two configurations share, Holm's correction over tasks,
and the t-interval of a mean (over seeds, or over SentEval's folds). Procedures: docs/evaluation.md#tests."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t
from scipy.stats import ttest_rel

from sentemb.eval.bootstrap import LEVEL, Interval

ALPHA = 0.05


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The mean with its Student-t interval (mean ± t_{k−1} · s / √k); one value: no interval (nan bounds)."""
    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return Interval(mean, math.nan, math.nan)
    half = float(student_t.ppf(0.5 + level / 2.0, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    return Interval(mean, mean - half, mean + half)


@dataclass(frozen=True)
class SeedTest:
    """A configuration against a reference over the seeds both ran: mean difference, t statistic and p-value."""

    seeds: tuple[int, ...]
    difference: float
    statistic: float
    p_value: float


def paired_t_test(scores: Mapping[int, float], reference: Mapping[int, float]) -> SeedTest:
    """`scipy.stats.ttest_rel` over the seeds both mappings hold (Focal-InfoNCE's protocol, §5); fewer than two
    shared seeds: no test (nan). Equal scores on every shared seed: no difference, p = 1. The same non-zero
    difference on every seed: no seed variance to test against, so no test (nan; ttest_rel would say t = ±inf)."""
    seeds = tuple(sorted(set(scores) & set(reference)))
    a = np.asarray([scores[s] for s in seeds], dtype=np.float64)
    b = np.asarray([reference[s] for s in seeds], dtype=np.float64)
    difference = float((a - b).mean()) if seeds else math.nan
    if len(seeds) < 2:
        return SeedTest(seeds, difference, math.nan, math.nan)
    if np.array_equal(a, b):  # ttest_rel's 0/0: the same numbers are no evidence of a difference
        return SeedTest(seeds, 0.0, 0.0, 1.0)
    if np.ptp(a - b) == 0:  # a constant offset: the seeds measured no noise, and t = d / 0 tests nothing
        return SeedTest(seeds, difference, math.nan, math.nan)
    result = ttest_rel(a, b)
    return SeedTest(seeds, difference, float(result.statistic), float(result.pvalue))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values over one family of tests (statsmodels' `multipletests`); an
    undefined p (nan) stays nan and is not counted in the family."""
    # imported here: statsmodels costs ~0.2 s to import, and only the reports that test call this
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p_values, dtype=np.float64)
    adjusted = np.full(len(p), math.nan)
    defined = ~np.isnan(p)
    if defined.any():
        adjusted[defined] = multipletests(p[defined], alpha=ALPHA, method="holm")[1]
    return [float(x) for x in adjusted]


def separable(adjusted_p: float, alpha: float = ALPHA) -> bool | None:
    """Whether a difference is significant at `alpha` after correction; None when there was no test."""
    return None if math.isnan(adjusted_p) else bool(adjusted_p < alpha)
