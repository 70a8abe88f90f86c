"""The STS test tasks a training job scores its kept weights on after training (`eval.test_tasks`), with the
bootstrap interval of each score; read when the job starts, so a missing file fails before the model loads.

STS-B test is always scored (it is the job's `stsb/test/spearman`); STS12–16 and SICK-R test are added when
named (`eval.test_tasks=sts`: all seven), recorded as `sts/<task>/spearman`. Each task is encoded on its own
sentences (as `STSBenchmark` encodes each split), so STS-B test is the very number it was before other tasks
were added.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import TEST_ALIGNMENT, TEST_PEARSON, TEST_UNIFORMITY, interval_names, sts_test_metric
from sentemb.eval.bootstrap import Resampling
from sentemb.eval.cache import EmbeddingCache
from sentemb.eval.geometry import alignment_uniformity, check_geometry_pairs
from sentemb.eval.sts import (
    STS_TASKS,
    SentencePairs,
    load_sts_task,
    pooled_sizes,
    read_stsb_split,
    score_similarities,
    sts_intervals,
    sts_similarities,
    table_figure,
    table_score,
)


def checked_test_tasks(tasks: str | Sequence[str]) -> list[str]:
    """`eval.test_tasks`: `sts` (all seven) or STS task names; STS-B always first."""
    names = [tasks] if isinstance(tasks, str) else [str(task) for task in tasks]
    names = [name for text in names for name in str(text).split(",") if name.strip()]
    expanded = [task for name in names for task in (STS_TASKS if name.strip() == "sts" else (name.strip(),))]
    unknown = [task for task in expanded if task not in STS_TASKS]
    if unknown:
        raise SentembConfigError(
            f"eval.test_tasks: unknown STS task(s) {unknown}. Fix: eval.test_tasks=sts (all seven) or a list of "
            f"{', '.join(STS_TASKS)}, e.g. eval.test_tasks=[STSBenchmark,SICKRelatedness]"
        )
    return list(dict.fromkeys(["STSBenchmark", *expanded]))


class HeldOutTasks:
    """`score(encoder)`: the test scores and intervals of the tasks, and the cosines they were computed from."""

    def __init__(self, stsb_dir: Path, senteval_dir: Path, tasks: str | Sequence[str], resampling: Resampling) -> None:
        self.resampling = resampling
        self.data: dict[str, dict[str, SentencePairs]] = {
            task: {"test": read_stsb_split(Path(stsb_dir) / "sts-test.csv")}
            if task == "STSBenchmark"
            else load_sts_task(Path(senteval_dir), task, ("test",))
            for task in checked_test_tasks(tasks)
        }
        # STS-B test's alignment and uniformity are recorded too: refused now where they could not be computed
        check_geometry_pairs(self.data["STSBenchmark"]["test"], "Fix: restore the file from the SentEval download")

    def largest_task(self) -> int:
        """The most pairs one of these tasks' bootstraps resamples (its subsets pooled)."""
        return max(pooled_sizes(self.data), default=0)

    def score(self, encoder: Any, batch_size: int) -> tuple[dict[str, float], dict[str, dict[str, np.ndarray]]]:
        """({metric: value} with each score's interval bounds, STS-B's Pearson, alignment and uniformity, {task:
        {subset: cosines}}). Alignment and uniformity read the embeddings the score computed (no second encode)."""
        metrics: dict[str, float] = {}
        similarities = {}
        for task, subsets in self.data.items():
            cache = EmbeddingCache(encoder, batch_size=batch_size, show_progress=False)
            cache.prefetch(s for pairs in subsets.values() for s in pairs.first + pairs.second)  # this task's only
            similarities[task] = sts_similarities(subsets, cache)
            result = score_similarities(subsets, similarities[task])
            interval = sts_intervals(task, subsets, similarities[task], result, self.resampling)[table_figure(task)]
            name = sts_test_metric(task)
            metrics[name] = table_score(task, result)
            metrics |= dict(zip(interval_names(name), (interval.low, interval.high), strict=True))
            if task == "STSBenchmark":
                metrics[TEST_PEARSON] = result["subsets"]["test"]["pearson"]
                geometry = alignment_uniformity(subsets["test"], cache)
                metrics[TEST_ALIGNMENT], metrics[TEST_UNIFORMITY] = geometry["alignment"], geometry["uniformity"]
        return metrics, similarities
