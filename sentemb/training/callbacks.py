"""Dev evaluation during training: every `every_n_steps`, and on the last batch.

It puts `stsb/dev/spearman` into the trainer's callback metrics, where ModelCheckpoint
(monitor=stsb/dev/spearman, mode=max, checked every step) keeps the best checkpoint, as
SimCSE does (evaluate every 125 steps, keep the best). Everything runs in
`on_train_batch_end`, before ModelCheckpoint's hook (Lightning calls checkpoint callbacks last).

`select=sickr_dev` (eval.select) also scores SICK-R dev (SICK's trial split: cosine Spearman x100,
the same encode path) at every evaluation, logged under `sickr/dev/...`, and ModelCheckpoint then
keeps the best SICK-R dev score instead (conf/callbacks/default.yaml: monitor=${eval.select}); STS-B
dev is still scored and logged.

A dev set whose Spearman could not be computed is refused (sentemb.eval.scorable): fewer than two pairs or gold scores
all equal when the callback reads it (before any model loads), and a model that gives every dev pair the same
similarity at an evaluation stops the job there, recorded as `failed` with the step and the reason: never a NaN
logged, nor a checkpoint kept at -inf.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import DEV_SETS, SICKR_DEV, STSB_DEV, DevMetrics, check_select
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.eval.bootstrap import Resampling
from sentemb.eval.cache import EmbeddingCache
from sentemb.eval.held_out import HeldOutTasks
from sentemb.eval.scorable import UndefinedScore
from sentemb.eval.sts import SICK_FILES, SentencePairs, STSBenchmark, correlations, load_sts_task, pairwise_cosine
from sentemb.eval.truncation import TruncatedEncoder, check_truncate_dim, truncated
from sentemb.training.callback_checks import check_eval_settings, check_every_n_steps  # noqa: F401 - importable here as before

log = logging.getLogger(__name__)

# the STS task each dev set is a split of (its cosines' entry in similarities.npz: `<task>/dev`)
DEV_TASKS = {STSB_DEV: "STSBenchmark", SICKR_DEV: "SICKRelatedness"}


def read_sickr_dev(senteval_dir: Path) -> SentencePairs:
    """SICK-R dev: SICK's trial split (`<senteval_dir>/SICK/SICK_trial.txt`, SentEval's layout), read and checked
    when the callback is built, before any model loads."""
    try:
        return load_sts_task(Path(senteval_dir), "SICKRelatedness", ("dev",))["dev"]
    except SentembConfigError as err:
        raise SentembConfigError(
            f"eval.select=sickr_dev (or eval.score_sickr_dev=true) scores SICK-R dev, "
            f"{Path(senteval_dir) / 'SICK' / SICK_FILES['dev']}: {err} (eval.senteval_dir names the folder holding "
            "SICK/; or eval.select=stsb_dev with eval.score_sickr_dev=false, which reads no SICK file)"
        ) from None


def pair_similarities(
    encoder: SentenceEncoder, pairs: SentencePairs, batch_size: int, show_progress: bool
) -> np.ndarray:
    """The cosine of each pair under `encoder`, encoded on these pairs' sentences alone (as STSBenchmark encodes
    each STS-B split)."""
    cache = EmbeddingCache(encoder, batch_size=batch_size, show_progress=show_progress)
    cache.prefetch(pairs.first + pairs.second)
    return pairwise_cosine(cache(pairs.first), cache(pairs.second))


class STSBDevEvaluation(Callback):
    def __init__(
        self,
        stsb_dir: str | Path,
        every_n_steps: int = 125,
        batch_size: int = 128,
        at_start: bool = True,
        senteval_dir: str | Path | None = None,
        test_tasks: str | Sequence[str] = ("STSBenchmark",),
        intervals: Mapping[str, Any] | None = None,
        select: str = "stsb_dev",
        score_sickr_dev: bool = False,
        truncate_dim: int | None = None,
    ) -> None:
        """`test_tasks` (STS-B test and any other STS task's) and `intervals` (their bootstrap, and the dev score's)
        are scored after training (`sentemb.training.trainer.report_best`); `select` names the dev set whose
        Spearman picks the kept checkpoint (`monitor`); `score_sickr_dev` scores SICK-R dev too without selecting on
        it (HiCL A.4's footnote: the checkpoint picked on STS-B dev, the hyper-parameters on its SICK-R dev score);
        every file is read now. `truncate_dim`: every score of the run (dev during training, dev and test after it)
        takes the first d dimensions of each embedding (its width is checked by `prepare_run`)."""
        super().__init__()
        check_eval_settings(every_n_steps, batch_size, at_start)
        self.truncate_dim = check_truncate_dim(truncate_dim, "eval.truncate_dim", None)
        self.select = check_select(select)
        self.benchmark = STSBenchmark(Path(stsb_dir), splits=("dev",))
        self.resampling = Resampling.from_settings(intervals, "eval.intervals")
        senteval_dir = Path(senteval_dir) if senteval_dir else Path(stsb_dir).parent.parent  # <root>/STS/STSBenchmark
        # SICK-R dev is scored when it selects the checkpoint, or when asked beside STS-B dev
        if not isinstance(score_sickr_dev, bool):
            raise SentembConfigError(f"eval.score_sickr_dev={score_sickr_dev!r} must be true or false")
        scored = self.selected is SICKR_DEV or score_sickr_dev
        self.sickr_dev = read_sickr_dev(senteval_dir) if scored else None
        self.held_out = HeldOutTasks(Path(stsb_dir), senteval_dir, test_tasks, self.resampling)
        resampled = [self.dev_pairs(STSB_DEV), *([self.sickr_dev] if self.sickr_dev else [])]
        largest = max([len(pairs.gold) for pairs in resampled] + [self.held_out.largest_task()])
        self.resampling.check_fits(largest, "eval.intervals.resamples")  # before any model loads
        self.every_n_steps = every_n_steps
        self.batch_size = batch_size
        self.at_start = at_start
        self.history: list[tuple[int, float]] = []  # STS-B dev
        self.sickr_history: list[tuple[int, float]] = []

    @property
    def selected(self) -> DevMetrics:
        """The names of the dev set that selects the kept checkpoint (eval.select)."""
        return DEV_SETS[self.select]

    @property
    def monitor(self) -> str:
        """The metric ModelCheckpoint keeps the best of: the selecting dev set's Spearman."""
        return self.selected.spearman

    @property
    def dev_sets(self) -> tuple[DevMetrics, ...]:
        """The dev sets scored at every evaluation: STS-B dev, and SICK-R dev when it selects."""
        return (STSB_DEV,) if self.sickr_dev is None else (STSB_DEV, SICKR_DEV)

    def history_of(self, dev_set: DevMetrics) -> list[tuple[int, float]]:
        """(step, Spearman) of each evaluation of `dev_set`."""
        return self.sickr_history if dev_set is SICKR_DEV else self.history

    def best_of(self, dev_set: DevMetrics) -> tuple[int, float] | None:
        """(step, Spearman) of the best evaluation of `dev_set` so far."""
        return max(self.history_of(dev_set), key=lambda item: item[1], default=None)

    @property
    def best(self) -> tuple[int, float] | None:
        """(step, Spearman) of the best STS-B dev evaluation so far."""
        return self.best_of(STSB_DEV)

    @property
    def selected_best(self) -> tuple[int, float] | None:
        """(step, Spearman) of the best evaluation of the selecting dev set: the kept checkpoint's."""
        return self.best_of(self.selected)

    def logged_bests(self) -> dict[str, float | None]:
        """{`<dev set>/spearman_best_logged`: the best logged value} of every dev set scored (None: none logged)."""
        return {dev.best_logged: best[1] if (best := self.best_of(dev)) else None for dev in self.dev_sets}

    def dev_pairs(self, dev_set: DevMetrics = STSB_DEV) -> SentencePairs:
        """The scored pairs of `dev_set`."""
        return self.sickr_dev if dev_set is SICKR_DEV else self.benchmark.pairs["dev"]

    def embedder(self, encoder: SentenceEncoder) -> SentenceEncoder | TruncatedEncoder:
        """What every score of the run encodes with: `encoder`, cut to eval.truncate_dim where it is set."""
        return truncated(encoder, self.truncate_dim)

    def dev_similarities(self, encoder: SentenceEncoder, dev_set: DevMetrics = STSB_DEV) -> np.ndarray:
        """The cosine of each pair of `dev_set` (STS-B dev by default) under `encoder` (at eval.truncate_dim), each
        set encoded alone."""
        encoder = self.embedder(encoder)
        if dev_set is SICKR_DEV:
            return pair_similarities(encoder, self.sickr_dev, self.batch_size, show_progress=True)
        return self.benchmark.similarities(encoder, batch_size=self.batch_size, show_progress=True)["dev"]

    def dev_spearman(
        self, encoder: SentenceEncoder, similarities: np.ndarray | None = None, dev_set: DevMetrics = STSB_DEV
    ) -> dict[str, float]:
        """`dev_set`'s correlations under `encoder` (of its `similarities`, if computed already); `report_best` calls
        this too, so both numbers are one computation."""
        similarities = self.dev_similarities(encoder, dev_set) if similarities is None else similarities
        pairs = self.dev_pairs(dev_set)
        return correlations(similarities, pairs.gold, f"{dev_set.label} ({pairs.source})")

    def scores_at(self, encoder: SentenceEncoder, dev_set: DevMetrics, step: int) -> dict[str, float]:
        """`dev_spearman` at an evaluation during training; a score the model's output leaves undefined stops the job,
        naming the step."""
        try:
            return self.dev_spearman(encoder, dev_set=dev_set)
        except UndefinedScore as err:
            raise UndefinedScore(f"the dev evaluation at step {step}: {err}") from None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_start and trainer.global_step == 0:
            # the pre-training score, for the record; not a checkpoint candidate
            for dev_set in self.dev_sets:
                initial = self.scores_at(pl_module.encoder, dev_set, 0)["spearman"]
                for logger in trainer.loggers:
                    logger.log_metrics({dev_set.initial: initial}, step=0)
                log.info("before training: %s Spearman %.2f", dev_set.label, initial)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        at_cadence = step % self.every_n_steps == 0
        at_end = trainer.is_last_batch or (trainer.max_steps > 0 and step >= trainer.max_steps)
        if not (at_cadence or at_end) or (self.history and self.history[-1][0] == step):
            return
        metrics, lines = {}, []
        for dev_set in self.dev_sets:
            scores = self.scores_at(pl_module.encoder, dev_set, step)
            self.history_of(dev_set).append((step, scores["spearman"]))
            best_step, best = self.best_of(dev_set)
            metrics |= {
                dev_set.spearman: scores["spearman"],
                dev_set.pearson: scores["pearson"],
                dev_set.best_logged: best,
            }
            selects = " selects the checkpoint" if len(self.dev_sets) > 1 and dev_set is self.selected else ""
            lines.append(
                f"{dev_set.label} Spearman {scores['spearman']:.2f} (best {best:.2f} at step {best_step}){selects}"
            )
        # float64: ModelCheckpoint compares these tensors, and float32 would tie scores that `best` tells apart
        trainer.callback_metrics.update(
            {name: torch.tensor(value, dtype=torch.float64) for name, value in metrics.items()}
        )
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        log.info("step %d: %s", step, "; ".join(lines))

    def state_dict(self) -> dict:
        return {"history": self.history, "sickr_history": self.sickr_history}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = checked_history(state_dict.get("history", []), "history")
        self.sickr_history = checked_history(state_dict.get("sickr_history", []), "sickr_history")


def checked_history(items: Any, key: str) -> list[tuple[int, float]]:
    """A resumed checkpoint's dev history: (step, Spearman) pairs, a whole step >= 0 and a finite score each (a NaN
    would be taken for the best score, and select its step)."""
    if isinstance(items, list | tuple) and all(
        isinstance(item, list | tuple)
        and len(item) == 2
        and isinstance(item[0], int)
        and not isinstance(item[0], bool)
        and item[0] >= 0
        and isinstance(item[1], float | int)
        and not isinstance(item[1], bool)
        and math.isfinite(item[1])
        for item in items
    ):
        return [(int(step), float(score)) for step, score in items]
    raise SentembConfigError(
        f"the resumed checkpoint's dev evaluation state ({STSBDevEvaluation.__name__}.{key}) is not a list of "
        "(step, finite Spearman) pairs: the checkpoint was not written by this training. Fix: resume from a "
        "checkpoint this run wrote, or start afresh without ckpt_path="
    )
