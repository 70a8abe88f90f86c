"""Bootstrap intervals of Spearman correlations and accuracies, and the paired bootstrap test, vectorised.

Procedure (docs/evaluation.md#intervals): resample a task's scored pairs with replacement `resamples`
times from a fixed seed (STS12–16's pooled 'all' score: within each subset, so every resample keeps the
subsets' sizes), recompute the statistic on each resample, and report the percentile interval
(Efron & Tibshirani 1993, §13.3). The paired bootstrap (Koehn 2004) draws one set of resamples for two
models scored on the same pairs and reads the interval and the two-sided p-value of their difference.

Vectorised: a resample is a row of counts over the original pairs. The Spearman correlation of a
resample (copies of one pair tie with each other, tied values share their average rank, as
`scipy.stats.spearmanr` ranks them) is the count-weighted Pearson correlation of average ranks, and a
value's average rank follows from the counts of the values sorted once: O(resamples · pairs), no sort
per resample. `tests/test_bootstrap.py` checks it against a loop over `scipy.stats.spearmanr`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from sentemb.common.errors import SentembConfigError
from sentemb.common.memory import allowed_bytes, in_gib
from sentemb.eval.scorable import UndefinedScore, check_gold, check_similarities

RESAMPLES = 1000
SEED = 1234
LEVEL = 0.95
# resamples per block of the vectorised computation: bounds its memory (~40 MB per block at 5,000 pairs)
BLOCK = 200


@dataclass(frozen=True)
class Interval:
    """A statistic with its percentile bootstrap (or t) interval, in the statistic's unit."""

    estimate: float
    low: float
    high: float

    def as_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class PairedDifference:
    """Model A minus model B on the same pairs: the difference, its paired bootstrap interval and p-value."""

    difference: Interval
    p_value: float


@dataclass(frozen=True)
class Resampling:
    """How intervals are drawn: `resamples` percentile-bootstrap resamples from `seed`, at confidence `level`."""

    resamples: int = RESAMPLES
    seed: int = SEED
    level: float = LEVEL

    def __post_init__(self) -> None:
        if isinstance(self.resamples, bool) or not isinstance(self.resamples, int) or self.resamples < 1:
            raise ValueError(f"resamples={self.resamples!r}: a positive whole number (e.g. 1000)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r}: a whole number (e.g. {SEED})")
        if isinstance(self.level, bool) or not isinstance(self.level, int | float) or not 0.0 < self.level < 1.0:
            raise ValueError(f"level={self.level!r}: a confidence level in (0, 1) (e.g. 0.95)")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any] | None, key: str) -> Resampling:
        """The config node `key` (`intervals`, `eval.intervals`): resamples, seed, level; a clear SentembConfigError
        naming the key otherwise."""
        settings = dict(settings or {})
        fix = f"Fix: {key}.resamples={RESAMPLES} {key}.seed={SEED} {key}.level={LEVEL} (the defaults)"
        unknown = sorted(set(settings) - {"resamples", "seed", "level"})
        if unknown:
            raise SentembConfigError(f"{key}: unknown key(s) {unknown}; valid: resamples, seed, level. {fix}")
        try:
            return cls(**settings)
        except ValueError as err:
            raise SentembConfigError(f"{key}.{err}. {fix}") from None

    def check_fits(self, pairs: int, key: str) -> None:
        """`resamples` bounded by this machine's memory before the bootstrap of `pairs` pairs allocates anything
        (`key`: the setting that chose it): each resample draws an int64 index per pair (twice that at the peak, when
        the subsets' blocks are concatenated) and keeps a few float64 statistics."""
        per_resample = 2 * 8 * pairs + 4 * 8
        allowed = allowed_bytes()
        if self.resamples * per_resample > allowed:
            raise SentembConfigError(
                f"{key}={self.resamples}: the bootstrap of {pairs} pairs would need "
                f"{in_gib(self.resamples * per_resample)}, more than the {in_gib(allowed)} this machine can give it "
                f"now (half of its available memory); nothing was allocated. Fix: {key}={RESAMPLES} (the default), at "
                f"most {allowed // per_resample} here"
            )

    def as_dict(self) -> dict[str, Any]:
        """The procedure, as results.json records it beside the intervals."""
        return {"resamples": self.resamples, "seed": self.seed, "level": self.level, "interval": "percentile"}

    def spearman(
        self, predicted: np.ndarray, gold: np.ndarray, sizes: Sequence[int] | None = None, estimate: float | None = None
    ) -> Interval:
        return spearman_interval(predicted, gold, sizes, self.resamples, self.seed, self.level, estimate)

    def paired(
        self, predicted_a: np.ndarray, predicted_b: np.ndarray, gold: np.ndarray, estimate: float,
        sizes: Sequence[int] | None = None,
    ) -> PairedDifference:  # fmt: skip
        return paired_spearman_difference(
            predicted_a, predicted_b, gold, estimate, sizes, self.resamples, self.seed, self.level
        )

    def accuracy(self, correct: np.ndarray) -> Interval:
        return accuracy_interval(correct, self.resamples, self.seed, self.level)


def resample_indices(sizes: Sequence[int], resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(resamples, Σ sizes) indices into the concatenated blocks, each block resampled with replacement within
    itself: one block per subset of a pooled score, one block otherwise. The same seed gives the same rows."""
    rng = np.random.default_rng(seed)
    blocks, offset = [], 0
    for size in sizes:
        if size < 1:
            raise ValueError(f"cannot resample an empty subset (sizes {list(sizes)})")
        blocks.append(rng.integers(0, size, size=(resamples, size)) + offset)
        offset += size
    return np.concatenate(blocks, axis=1)


def _counts(indices: np.ndarray, n: int) -> np.ndarray:
    """How often each of the n pairs occurs in each resample (a row per resample)."""
    rows = indices.shape[0]
    flat = (indices + n * np.arange(rows)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(np.float64)


@dataclass(frozen=True)
class _TieGroups:
    """The values sorted once: `order` sorts them, `starts` are the first sorted positions of each run of equal
    values, `group` is each original value's run."""

    order: np.ndarray
    starts: np.ndarray
    group: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray) -> _TieGroups:
        order = np.argsort(values, kind="stable")
        ordered = values[order]
        first = np.r_[True, ordered[1:] != ordered[:-1]]
        group = np.empty(len(values), dtype=np.int64)
        group[order] = np.cumsum(first) - 1
        return cls(order, np.flatnonzero(first), group)

    def centred_ranks(self, counts: np.ndarray) -> np.ndarray:
        """Each pair's average rank in each resample minus the mean rank (N + 1) / 2, N = the resample's size."""
        in_group = np.add.reduceat(counts[:, self.order], self.starts, axis=1)
        through = np.cumsum(in_group, axis=1)
        average = through - (in_group - 1.0) / 2.0  # ranks through−in_group+1 … through share their mean
        total = through[:, -1:]
        return average[:, self.group] - (total + 1.0) / 2.0


def _spearman_rows(counts: np.ndarray, predicted: _TieGroups, gold_ranks: np.ndarray) -> np.ndarray:
    """Spearman ×100 of each resample: the count-weighted Pearson correlation of the centred average ranks."""
    ranks = predicted.centred_ranks(counts)
    covariance = (counts * ranks * gold_ranks).sum(axis=1)
    spread = np.sqrt((counts * ranks**2).sum(axis=1) * (counts * gold_ranks**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample of all-equal values: nan, as spearmanr gives
        return 100.0 * covariance / spread


def resampled_spearman(predicted: Sequence[np.ndarray], gold: np.ndarray, indices: np.ndarray) -> list[np.ndarray]:
    """Spearman ×100 of each row of `indices` for each array of `predicted` (scored on the same pairs as `gold`)."""
    gold = np.asarray(gold, dtype=np.float64)
    gold_groups = _TieGroups.of(gold)
    groups = [_TieGroups.of(np.asarray(p, dtype=np.float64)) for p in predicted]
    out: list[list[np.ndarray]] = [[] for _ in groups]
    for start in range(0, len(indices), BLOCK):
        counts = _counts(indices[start : start + BLOCK], len(gold))
        gold_ranks = gold_groups.centred_ranks(counts)
        for rows, group in zip(out, groups, strict=True):
            rows.append(_spearman_rows(counts, group, gold_ranks))
    return [np.concatenate(rows) for rows in out]


def percentile_interval(estimate: float, resampled: np.ndarray, level: float = LEVEL) -> Interval:
    """The percentile interval of the resampled statistic (resamples where it is undefined left out; refused if that
    is every one: no interval, never a NaN one)."""
    if np.isnan(resampled).all():
        raise UndefinedScore(
            f"none of the {len(resampled)} bootstrap resamples has a defined statistic (each drew only tied values): "
            "no interval can be computed. Fix: more resamples (intervals.resamples, e.g. 1000)"
        )
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.nanpercentile(resampled, [tail, 100.0 - tail])
    return Interval(float(estimate), float(low), float(high))


def spearman_interval(
    predicted: np.ndarray,
    gold: np.ndarray,
    sizes: Sequence[int] | None = None,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
    estimate: float | None = None,
) -> Interval:
    """Spearman ×100 of (predicted, gold) with its percentile bootstrap interval. `sizes`: the subsets the pairs
    are the concatenation of (resampled within each); `estimate`: the point score as already computed."""
    check_spearman_input(gold, predicted)
    sizes = [len(gold)] if sizes is None else list(sizes)
    indices = resample_indices(sizes, resamples, seed)
    (resampled,) = resampled_spearman([predicted], gold, indices)
    if estimate is None:
        estimate = 100.0 * float(spearmanr(predicted, gold)[0])
    return percentile_interval(estimate, resampled, level)


def check_spearman_input(gold: np.ndarray, *predicted: np.ndarray) -> None:
    """The pairs an interval resamples, refused where Spearman itself is undefined (sentemb.eval.scorable)."""
    check_gold(gold, "the resampled pairs", "Fix: resample pairs scored with at least 2 different gold scores")
    for similarities in predicted:
        check_similarities(similarities, "the resampled pairs")


def paired_spearman_difference(
    predicted_a: np.ndarray,
    predicted_b: np.ndarray,
    gold: np.ndarray,
    estimate: float,
    sizes: Sequence[int] | None = None,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> PairedDifference:
    """A's Spearman minus B's on the same pairs (`estimate`: that difference on all pairs), with the interval of
    the difference over shared resamples and the two-sided p-value of "no difference" (docs/evaluation.md)."""
    check_spearman_input(gold, predicted_a, predicted_b)
    sizes = [len(gold)] if sizes is None else list(sizes)
    indices = resample_indices(sizes, resamples, seed)
    a, b = resampled_spearman([predicted_a, predicted_b], gold, indices)
    return PairedDifference(percentile_interval(estimate, a - b, level), two_sided_p(a - b))


def two_sided_p(differences: np.ndarray) -> float:
    """Two-sided bootstrap p-value of a zero difference, by inverting the percentile interval: twice the smaller share
    of resampled differences on either side of 0, each share counted with the observed sample ((k + 1) / (B + 1),
    as Davison & Hinkley 1997, §4.4, count Monte Carlo p-values, so no p is 0), at most 1."""
    kept = differences[~np.isnan(differences)]
    if not len(kept):  # every resample undefined (all values tied): no test
        return math.nan
    below = (np.count_nonzero(kept <= 0) + 1) / (len(kept) + 1)
    above = (np.count_nonzero(kept >= 0) + 1) / (len(kept) + 1)
    return float(min(1.0, 2.0 * min(below, above)))


def accuracy_interval(
    correct: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL
) -> Interval:
    """Accuracy ×100 of 0/1 outcomes on a test set with its percentile bootstrap interval over the test examples."""
    correct = np.asarray(correct, dtype=np.float64)
    if not len(correct):
        raise UndefinedScore("no test example to count: an accuracy (and its interval) is undefined")
    indices = resample_indices([len(correct)], resamples, seed)
    resampled = 100.0 * correct[indices].mean(axis=1)
    return percentile_interval(100.0 * float(correct.mean()), resampled, level)
