"""The name of every STS-B (and SICK-R dev) number a training job logs (W&B, CSV) and records (`metrics.json`),
defined once.

Scheme: `stsb/<split>/<correlation>[_<which>]`. The split is a path segment, so loggers put dev and
test side by side; the correlation comes first and then which of its numbers it is, so the two
"best" dev scores say how each was obtained (`_best_logged`: the highest value logged during
training, what sweeps optimise; `_best_rescored`: the kept best checkpoint, scored again after
training). The step of the weights scored after training keeps its short name (`stsb/best_step`,
`stsb/final_step`), whichever dev set selected them.

With `eval.select=sickr_dev` SICK-R dev (SICK's trial split) is scored beside STS-B dev at every evaluation and
selects the kept checkpoint; its numbers follow the same scheme under `sickr/dev/...` (`SICKR_DEV`), and a sweep
then optimises `sickr/dev/spearman_best_logged`. `DEV_SETS` maps each `eval.select` value to its dev set's names.

conf/ writes these names as literals (`python -m sentemb.train --cfg job` shows the real name);
tests/test_metric_names.py checks that every `stsb/...` name in conf/ is one of them.

Records and logs written before this scheme hold the old names (`stsb/best_dev_spearman`,
`stsb/dev_spearman_best`, ...): `read_metric` finds a value under either, and an old name given as
`optimized_metric` still works, with a warning naming the new one (`check_metric_name`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from typing import Any

from sentemb.common.errors import SentembConfigError

log = logging.getLogger(__name__)

# during training, at every dev evaluation (ModelCheckpoint monitors DEV_SPEARMAN under eval.select=stsb_dev)
DEV_SPEARMAN = "stsb/dev/spearman"
DEV_PEARSON = "stsb/dev/pearson"
# before the first step (eval.at_start)
DEV_SPEARMAN_INITIAL = "stsb/dev/spearman_initial"
# the highest DEV_SPEARMAN logged so far: the default optimized_metric
DEV_SPEARMAN_BEST_LOGGED = "stsb/dev/spearman_best_logged"
# after training: the best checkpoint scored again (callbacks=default) ...
DEV_SPEARMAN_BEST_RESCORED = "stsb/dev/spearman_best_rescored"
BEST_STEP = "stsb/best_step"
# ... or, with no best checkpoint kept (callbacks=none), the final weights
DEV_SPEARMAN_FINAL = "stsb/dev/spearman_final"
FINAL_STEP = "stsb/final_step"
# after training, of the weights scored (the best checkpoint, or the final weights)
TEST_SPEARMAN = "stsb/test/spearman"
TEST_PEARSON = "stsb/test/pearson"
# ... and the geometry of its STS-B test embeddings (Wang & Isola 2020, as SimCSE and Focal-InfoNCE's Table 3 report)
TEST_ALIGNMENT = "stsb/test/alignment"
TEST_UNIFORMITY = "stsb/test/uniformity"

# SICK-R dev (SICK's trial split, cosine Spearman x100 as STS-B dev), scored only with eval.select=sickr_dev, at
# every dev evaluation beside STS-B dev (ModelCheckpoint then monitors SICKR_DEV_SPEARMAN) ...
SICKR_DEV_SPEARMAN = "sickr/dev/spearman"
SICKR_DEV_PEARSON = "sickr/dev/pearson"
SICKR_DEV_SPEARMAN_INITIAL = "sickr/dev/spearman_initial"
# ... the highest logged so far: the optimized_metric of a sweep that selects on SICK-R dev ...
SICKR_DEV_SPEARMAN_BEST_LOGGED = "sickr/dev/spearman_best_logged"
# ... and after training, of the kept best checkpoint (step: BEST_STEP) or the final weights (FINAL_STEP)
SICKR_DEV_SPEARMAN_BEST_RESCORED = "sickr/dev/spearman_best_rescored"
SICKR_DEV_SPEARMAN_FINAL = "sickr/dev/spearman_final"

# after training, with eval.test_tasks naming them: STS12–16 ('all' over the test subsets) and SICK-R test of the
# weights scored (STS-B test is TEST_SPEARMAN)
STS_TEST_SPEARMAN = "sts/{task}/spearman"
# each number scored after training has its 95% bootstrap interval beside it: <name>_ci_low, <name>_ci_high
CI_SUFFIXES = ("_ci_low", "_ci_high")
# after training with matryoshka.dims, of the weights scored: STS-B dev and test Spearman at each trained size d (the
# first d dimensions of one encoding of each split), e.g. stsb/test/spearman_dim_96 (sentemb/eval/truncation.py)
SIZED_SPEARMAN = {"dev": DEV_SPEARMAN + "_dim_{size}", "test": TEST_SPEARMAN + "_dim_{size}"}
SIZED_PATTERN = re.compile(r"stsb/(dev|test)/spearman_dim_[1-9][0-9]*")


@dataclass(frozen=True)
class DevMetrics:
    """The names of one dev set's numbers (`eval.select` picks the set whose `spearman` selects the checkpoint)."""

    label: str  # as reports print it
    spearman: str
    pearson: str
    initial: str
    best_logged: str
    best_rescored: str
    final: str


STSB_DEV = DevMetrics(
    "STS-B dev",
    DEV_SPEARMAN,
    DEV_PEARSON,
    DEV_SPEARMAN_INITIAL,
    DEV_SPEARMAN_BEST_LOGGED,
    DEV_SPEARMAN_BEST_RESCORED,
    DEV_SPEARMAN_FINAL,
)
SICKR_DEV = DevMetrics(
    "SICK-R dev",
    SICKR_DEV_SPEARMAN,
    SICKR_DEV_PEARSON,
    SICKR_DEV_SPEARMAN_INITIAL,
    SICKR_DEV_SPEARMAN_BEST_LOGGED,
    SICKR_DEV_SPEARMAN_BEST_RESCORED,
    SICKR_DEV_SPEARMAN_FINAL,
)
# eval.select: which dev set's Spearman ModelCheckpoint monitors (STS-B dev is scored and logged in both)
DEV_SETS = {"stsb_dev": STSB_DEV, "sickr_dev": SICKR_DEV}


def check_select(select: Any) -> str:
    """`eval.select`: one of DEV_SETS' keys."""
    if not isinstance(select, str) or select not in DEV_SETS:
        raise SentembConfigError(
            f"eval.select={select}: not a dev set that can select the kept checkpoint. Fix: eval.select=stsb_dev "
            f"(STS-B dev, the default) or eval.select=sickr_dev (SICK-R dev: SICK's trial split); with sickr_dev a "
            f"sweep optimises {SICKR_DEV_SPEARMAN_BEST_LOGGED}"
        )
    return select


def interval_names(name: str) -> tuple[str, str]:
    """The names of the bounds of `name`'s 95% bootstrap interval."""
    return f"{name}{CI_SUFFIXES[0]}", f"{name}{CI_SUFFIXES[1]}"


def sts_test_metric(task: str) -> str:
    """The metric of an STS task's test score after training (STS-B: TEST_SPEARMAN)."""
    return TEST_SPEARMAN if task == "STSBenchmark" else STS_TEST_SPEARMAN.format(task=task)


SCORED_AFTER_TRAINING = (
    DEV_SPEARMAN_BEST_RESCORED,
    DEV_SPEARMAN_FINAL,
    TEST_SPEARMAN,
    SICKR_DEV_SPEARMAN_BEST_RESCORED,
    SICKR_DEV_SPEARMAN_FINAL,
)

METRIC_NAMES = (
    *(bound for name in SCORED_AFTER_TRAINING for bound in interval_names(name)),
    # every dev set's own names (STS-B dev, SICK-R dev), each written once, in DevMetrics
    *(name for dev in DEV_SETS.values() for name in astuple(dev)[1:]),
    BEST_STEP,
    FINAL_STEP,
    TEST_SPEARMAN,
    TEST_PEARSON,
    TEST_ALIGNMENT,
    TEST_UNIFORMITY,
)

# the names records and logs held before this scheme → today's
OLD_NAMES = {
    "stsb/dev_spearman": DEV_SPEARMAN,
    "stsb/dev_pearson": DEV_PEARSON,
    "stsb/dev_spearman_initial": DEV_SPEARMAN_INITIAL,
    "stsb/dev_spearman_best": DEV_SPEARMAN_BEST_LOGGED,
    "stsb/best_dev_spearman": DEV_SPEARMAN_BEST_RESCORED,
    "stsb/final_dev_spearman": DEV_SPEARMAN_FINAL,
    "stsb/test_spearman": TEST_SPEARMAN,
    "stsb/test_pearson": TEST_PEARSON,
}
_OLD_OF = {new: old for old, new in OLD_NAMES.items()}


def sized_metric(split: str, size: int) -> str:
    """The name of STS-B `split`'s (dev, test) Spearman at Matryoshka size `size` after training."""
    return SIZED_SPEARMAN[split].format(size=size)


def current_name(name: str) -> str | None:
    """Today's name of a metric named by its current or its old name (a size's too); None if it is neither."""
    if name in METRIC_NAMES or SIZED_PATTERN.fullmatch(name):
        return name
    return OLD_NAMES.get(name)


def check_metric_name(name: str, key: str = "optimized_metric") -> str:
    """The metric a config value names (`key=name`), by today's name. An old name is accepted with a warning
    naming the new one (an old sweep's command must still resume); any other name is refused."""
    new = current_name(name)
    if new is None:
        raise SentembConfigError(
            f"{key}={name}: no training job records a metric of that name. "
            f"Fix: one of {', '.join(METRIC_NAMES)} (e.g. {key}={DEV_SPEARMAN_BEST_LOGGED})"
        )
    if new != name:
        log.warning("%s=%s is the old name of %s: pass %s=%s (the old name still works)", key, name, new, key, new)
    return new


def read_metric(metrics: Mapping[str, Any], name: str | None) -> Any:
    """The value of metric `name` (today's or its old name) in `metrics` (a record's, or a log row), found under
    either name, since records written before this scheme hold the old ones; None if absent or `name` is empty.

    Raises SentembConfigError for a name that is no metric's (a typo in `optimized_metric`).
    """
    if not name:
        return None
    new = current_name(name) or check_metric_name(name)  # the check raises for a name that is no metric's
    if new in metrics:
        return metrics[new]
    return metrics.get(_OLD_OF.get(new, new))
