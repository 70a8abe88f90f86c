"""Two contenders per STS task: one model each (the paired bootstrap over the same test pairs), or several runs
each (the paired t-test over the seeds both ran); Holm-corrected over the tasks. Used by `sentemb.compare`.

Each row: the task, both scores with their intervals, the difference A − B with its interval, the p-value, the
Holm-adjusted p over the tasks of this comparison, and `separable` (adjusted p < 0.05).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from sentemb.eval.bootstrap import LEVEL, Resampling
from sentemb.eval.significance import holm, paired_t_test, separable, t_interval
from sentemb.eval.sts import SentencePairs, correlations, figure_pairs, table_figure


def compare_models(
    data: dict[str, dict[str, SentencePairs]],
    a: Mapping[str, dict[str, np.ndarray]],
    b: Mapping[str, dict[str, np.ndarray]],
    resampling: Resampling,
) -> list[dict[str, Any]]:
    """Per task: A's and B's Spearman ×100 with their bootstrap intervals, and the paired bootstrap of A − B."""
    rows = []
    for task, subsets in data.items():
        predicted_a, gold, sizes = figure_pairs(task, subsets, a[task], table_figure(task))
        predicted_b, _, _ = figure_pairs(task, subsets, b[task], table_figure(task))
        score_a = correlations(predicted_a, gold)["spearman"]
        score_b = correlations(predicted_b, gold)["spearman"]
        paired = resampling.paired(predicted_a, predicted_b, gold, score_a - score_b, sizes)
        rows.append({
            "task": task, "test": "paired bootstrap", "n": len(gold),
            "a": resampling.spearman(predicted_a, gold, sizes, score_a).as_dict(),
            "b": resampling.spearman(predicted_b, gold, sizes, score_b).as_dict(),
            "difference": paired.difference.as_dict(), "p": paired.p_value,
        })  # fmt: skip
    return corrected(rows)


def compare_seeds(
    a: Mapping[str, Mapping[int, float]], b: Mapping[str, Mapping[int, float]], level: float = LEVEL
) -> list[dict[str, Any]]:
    """Per task both contenders hold: mean and t-interval over each one's seeds, and the paired t-test of A − B over
    the seeds both ran (its mean difference with the t-interval of the paired differences)."""
    rows = []
    for task in [task for task in a if task in b]:
        test = paired_t_test(a[task], b[task])
        differences = [a[task][seed] - b[task][seed] for seed in test.seeds]
        difference = t_interval(differences, level) if differences else None
        rows.append({
            "task": task, "test": "paired t over seeds", "n": len(test.seeds),
            "seeds": list(test.seeds),
            "a": t_interval(list(a[task].values()), level).as_dict(),
            "b": t_interval(list(b[task].values()), level).as_dict(),
            "difference": difference.as_dict() if difference else {"estimate": math.nan, "low": math.nan,
                                                                      "high": math.nan},
            "t": test.statistic, "p": test.p_value,
        })  # fmt: skip
    return corrected(rows)


def corrected(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Holm's adjusted p over the rows (the tasks of one comparison) and the `separable` flag at α = 0.05."""
    for row, adjusted in zip(rows, holm([row["p"] for row in rows]), strict=True):
        row["p_holm"] = adjusted
        row["separable"] = separable(adjusted)
    return rows
