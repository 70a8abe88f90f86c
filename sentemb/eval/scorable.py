"""The one rule for a score that cannot be computed: refused, with the reason and the fix, never recorded as NaN.

A Spearman or Pearson correlation needs two pairs at least and variance on both sides (scipy returns NaN
otherwise), a bootstrap interval of it a resample where it is defined, an accuracy examples to count and, for the
classifier behind it, two classes to fit. So:

- input that leaves a score undefined is refused when it is read, before any model is built: gold scores of fewer
  than two pairs or all equal (`check_gold`, called by every STS reader, so a training job's dev sets are refused
  before its model loads), labels without examples, with one class, or too few for the folds (`check_labels`);
- a model output that leaves it undefined (every pair given the same similarity: embeddings collapsed, zero or not
  finite) is only known once encoded: `check_similarities` stops the command there, naming the task and why (a
  training job is then recorded as `failed` with that message, never `ok`), so nothing scores, selects or writes a NaN;
- `finite_record` is the last guard of a record about to be written (results.json): a non-finite number in it is
  refused naming its key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sentemb.common.errors import SentembConfigError

MIN_PAIRS = 2  # a correlation of fewer pairs is undefined
COLLAPSED_FIX = (
    "Fix: score a model whose embeddings tell the sentences apart (another checkpoint; a training run whose "
    "embeddings collapsed needs e.g. a lower optim.lr or a larger loss.tau)"
)


class UndefinedScore(SentembConfigError):
    """A score that cannot be computed from its input; the message names the input, why, and the fix."""


def check_gold(gold: np.ndarray, source: str, fix: str) -> None:
    """Gold scores a correlation can be computed against (`source`: the file they were read from): at least
    `MIN_PAIRS`, not all equal."""
    gold = np.asarray(gold, dtype=np.float64)
    if len(gold) < MIN_PAIRS:
        raise UndefinedScore(
            f"{source}: {len(gold)} scored sentence pair(s); a correlation needs at least {MIN_PAIRS}. {fix}"
        )
    if np.ptp(gold) == 0:
        raise UndefinedScore(
            f"{source}: every one of its {len(gold)} gold scores is {gold[0]:g}, and a correlation with a constant is "
            f"undefined (no order to compare the model's similarities with). {fix}"
        )


def check_similarities(similarities: np.ndarray, where: str) -> None:
    """A model's similarities of the pairs `where` names (a task's file or split) that a correlation can be computed
    from: finite, and not all equal."""
    values = np.asarray(similarities, dtype=np.float64)
    if not np.isfinite(values).all():
        raise UndefinedScore(
            f"{where}: {int((~np.isfinite(values)).sum())} of the model's {len(values)} similarities are not finite, "
            f"and a correlation of them is undefined. {COLLAPSED_FIX}"
        )
    if len(values) and np.ptp(values) == 0:
        raise UndefinedScore(
            f"{where}: the model gives every one of its {len(values)} pairs the same similarity ({values[0]:g}), so "
            "its Spearman and Pearson correlations are undefined: the embeddings have collapsed to one direction, or "
            f"are zero or not finite (a cosine of those scores 0, as SentEval's). {COLLAPSED_FIX}"
        )


def defined(value: float, where: str) -> float:
    """`value` itself if finite: the guard after a computation whose inputs passed the checks above."""
    if not math.isfinite(value):
        raise UndefinedScore(f"{where}: came out as {value} though its inputs passed the checks. {COLLAPSED_FIX}")
    return value


def check_labels(labels: np.ndarray, source: str, per_class: int = 0) -> None:
    """Labels an accuracy can be computed on (`source`: the file(s) read): some examples and, where a classifier is
    fitted on them (`per_class` > 0), at least two classes with `per_class` examples each (a stratified k-fold puts
    each class in every fold)."""
    fix = "Fix: restore the file(s) from the SentEval download"
    if not len(labels):
        raise UndefinedScore(f"{source}: no example in it, so no accuracy to compute. {fix}")
    if not per_class:
        return
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise UndefinedScore(
            f"{source}: every example has label {classes[0]}: a classifier needs two classes to fit. {fix}"
        )
    if counts.min() < per_class:
        raise UndefinedScore(
            f"{source}: label {classes[counts.argmin()]} has {counts.min()} example(s), and its folds need at least "
            f"{per_class} of each class. {fix}"
        )


def finite_record(record: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """`record` (about to be written as `name`), refused if any number in it is not finite, naming its key."""
    for key, value in _numbers(record, ""):
        if not math.isfinite(value):
            raise UndefinedScore(
                f"{name}: {key} = {value}, a score that could not be computed; nothing was written. Fix: report this "
                "as a bug of sentemb: every such score should have been refused with its reason before"
            )
    return record


def _numbers(value: Any, key: str) -> Sequence[tuple[str, float]]:
    """(dotted key, value) of every float in nested dicts and lists."""
    if isinstance(value, Mapping):
        return [item for k, v in value.items() for item in _numbers(v, f"{key}.{k}" if key else str(k))]
    if isinstance(value, list | tuple):
        return [item for i, v in enumerate(value) for item in _numbers(v, f"{key}[{i}]")]
    if isinstance(value, float | np.floating):
        return [(key, float(value))]
    return []
