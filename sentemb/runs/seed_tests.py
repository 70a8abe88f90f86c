"""A sweep's configurations against its best one, over seeds: `sweep_tests.csv` and the `vs best` column of sweep.md.

For every configuration and every score it was scored on (the dev score the sweep ranks by, STS-B test, and each
other STS task of `eval.test_tasks`): its mean, std and 95% t-interval over seeds, its difference to the best
configuration, and the paired t-test over the seeds both ran (`scipy.stats.ttest_rel`, the Focal-InfoNCE paper's
protocol), Holm-adjusted over the STS test tasks (the ranked dev score is a family of its own), and `separable`
(adjusted p < 0.05). A configuration with one seed, or with a seed that ran twice (two jobs of the same values and
seed cannot be paired), gets no test, and says why.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sentemb.common.metric_names import DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN, sts_test_metric
from sentemb.eval.significance import holm, paired_t_test, separable, t_interval

# what the sweep ranks by (the row column, its metric name): tested alone; the STS test tasks are Holm's family
RANKED_BY = ("best_dev", DEV_SPEARMAN_BEST_RESCORED)
TESTS_NAME = "sweep_tests.csv"


def tested_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(row column, metric name) of every score a seed test compares: the ranked dev score, STS-B test and each
    other STS task's test score the jobs were scored on."""
    tasks = [key.removeprefix("test_") for key in (rows[0] if rows else {}) if key.startswith("test_")]
    return [RANKED_BY, ("test", TEST_SPEARMAN), *((f"test_{t}", sts_test_metric(t)) for t in tasks)]


def repeated_seeds(members: list[dict[str, Any]]) -> list[Any]:
    """Seeds two jobs of one configuration both ran."""
    return sorted(seed for seed, count in Counter(m["seed"] for m in members).items() if count > 1)


def seed_tests(rows: list[dict[str, Any]], params: list[str], configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of sweep_tests.csv (module docstring), best configuration first, as `configurations` ranks them."""
    by_config: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if row["status"] == "ok" and row["best_dev"] is not None:
            by_config.setdefault(tuple(row[p] for p in params), []).append(row)
    columns = [(column, name) for column, name in tested_columns(rows) if any(r.get(column) is not None for r in rows)]
    best = by_config[tuple(configs[0][p] for p in params)] if configs else []
    out = []
    for rank, config in enumerate(configs, start=1):
        members = by_config[tuple(config[p] for p in params)]
        repeated = repeated_seeds(members) or (repeated_seeds(best) if rank > 1 else [])
        found = []
        for column, name in columns:
            values = [m[column] for m in members if m.get(column) is not None]
            if not values:
                continue
            scored_seeds = [m["seed"] for m in members if m.get(column) is not None]
            scores = {m["seed"]: m[column] for m in members if m.get(column) is not None}
            reference = {m["seed"]: m[column] for m in best if m.get(column) is not None}
            test = paired_t_test(scores, reference) if rank > 1 and not repeated else None
            interval = t_interval(values)
            found.append({
                "rank": rank, **{p: config[p] for p in params}, "metric": name, "n": len(values),
                "seeds": " ".join(str(seed) for seed in sorted(scored_seeds)),
                "mean": interval.estimate, "std": statistics.stdev(values) if len(values) > 1 else math.nan,
                "ci_low": interval.low, "ci_high": interval.high,
                "difference_to_best": test.difference if test else 0.0 if rank == 1 else math.nan,
                "shared_seeds": len(test.seeds) if test else len(values) if rank == 1 else 0,
                "t": test.statistic if test else math.nan, "p": test.p_value if test else math.nan,
                "note": no_test_reason(rank, len(values), test, repeated),
            })  # fmt: skip
        tasks = [row for row in found if row["metric"] != RANKED_BY[1]]
        for row, adjusted in zip(tasks, holm([row["p"] for row in tasks]), strict=True):
            row["p_holm"] = adjusted
        for row in found:
            row.setdefault("p_holm", row["p"])
            row["separable"] = "best" if rank == 1 else separable(row["p_holm"])
        out += found
    return out


def no_test_reason(rank: int, n: int, test: Any, repeated: list[Any]) -> str:
    """Why a configuration has no paired test against the best ("" when it has one, or is the best)."""
    if rank == 1:
        return ""
    if repeated:
        return f"seed {', '.join(map(str, repeated))} ran twice in one configuration: no paired test"
    if n < 2:
        return "single seed: no test"
    if test is None or len(test.seeds) < 2:
        return f"{0 if test is None else len(test.seeds)} shared seed(s): no test"
    if math.isnan(test.p_value):
        return "the same difference on every seed: no seed variance, no t-test"
    return ""


def versus_best(tests: Sequence[dict[str, Any]], config: dict[str, Any], params: list[str]) -> str:
    """The ranked score's test against the best, as sweep.md's `vs best` column shows it."""
    for row in tests:
        if row["metric"] == RANKED_BY[1] and all(row[p] == config[p] for p in params):
            if row["rank"] == 1:
                return "best"
            if row["note"]:
                return row["note"]
            word = "separable" if row["separable"] else "**not separable**"
            return f"{word} (p {row['p']:.3g})"
    return ""


def tests_note(configs: list[dict[str, Any]], tests: Sequence[dict[str, Any]]) -> list[str]:
    """sweep.md's lines under the table: the test, which configurations cannot be told apart from the best, which
    have a single seed."""
    if len(configs) < 2:
        return []
    ranked = [r for r in tests if r["metric"] == RANKED_BY[1] and r["rank"] > 1]
    tied = [str(r["rank"]) for r in ranked if r["separable"] is False]
    single = [str(rank) for rank, c in enumerate(configs, start=1) if c["n"] < 2]
    lines = [
        "vs best: the paired t-test (scipy.stats.ttest_rel) of each configuration's best dev against the best "
        "configuration's over the seeds both ran, α = 0.05, uncorrected over configurations (the best was chosen "
        f"by these same scores, so a test against it favours separability); per STS test task, Holm-corrected "
        f"over the tasks, in {TESTS_NAME}."
    ]
    if tied:
        lines.append(f"Not separable from the best: rank {', '.join(tied)}.")
    if single:
        lines.append(
            f"Single seed (no test, no seed noise): rank {', '.join(single)}. Fix: rerun with seed=1,2,3 "
            "(docs/sweeps.md#seeds)."
        )
    return [*lines, ""]
