"""STS-B dev evaluation during training: every `every_n_steps`, and on the last batch.

It puts `stsb/dev/spearman` into the trainer's callback metrics, where ModelCheckpoint
(monitor=stsb/dev/spearman, mode=max, checked every step) keeps the best checkpoint, as
SimCSE does (evaluate every 125 steps, keep the best). Everything runs in
`on_train_batch_end`, before ModelCheckpoint's hook (Lightning calls checkpoint callbacks last).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import DEV_PEARSON, DEV_SPEARMAN, DEV_SPEARMAN_BEST_LOGGED, DEV_SPEARMAN_INITIAL
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.eval.bootstrap import Resampling
from sentemb.eval.held_out import HeldOutTasks
from sentemb.eval.sts import STSBenchmark, correlations

log = logging.getLogger(__name__)


def check_every_n_steps(every_n_steps: int) -> None:
    """eval.every_n_steps: the dev evaluation's interval, >= 1."""
    if every_n_steps < 1:
        raise SentembConfigError(f"eval.every_n_steps={every_n_steps} must be >= 1, e.g. eval.every_n_steps=125")


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
    ) -> None:
        """`test_tasks` (STS-B test and any other STS task's) and `intervals` (their bootstrap, and the dev score's)
        are scored after training (`sentemb.training.trainer.report_best`); every file is read now."""
        super().__init__()
        check_every_n_steps(every_n_steps)
        self.benchmark = STSBenchmark(Path(stsb_dir), splits=("dev",))
        self.resampling = Resampling.from_settings(intervals, "eval.intervals")
        senteval_dir = Path(senteval_dir) if senteval_dir else Path(stsb_dir).parent.parent  # <root>/STS/STSBenchmark
        self.held_out = HeldOutTasks(Path(stsb_dir), senteval_dir, test_tasks, self.resampling)
        self.every_n_steps = every_n_steps
        self.batch_size = batch_size
        self.at_start = at_start
        self.history: list[tuple[int, float]] = []

    @property
    def best(self) -> tuple[int, float] | None:
        """(step, Spearman) of the best evaluation so far."""
        return max(self.history, key=lambda item: item[1], default=None)

    def dev_similarities(self, encoder: SentenceEncoder) -> np.ndarray:
        """The cosine of each STS-B dev pair under `encoder`."""
        return self.benchmark.similarities(encoder, batch_size=self.batch_size, show_progress=True)["dev"]

    def dev_spearman(self, encoder: SentenceEncoder, similarities: np.ndarray | None = None) -> dict[str, float]:
        """STS-B dev of `encoder` (of its `similarities`, if computed already); `report_best` calls this too, so both
        numbers are one computation."""
        similarities = self.dev_similarities(encoder) if similarities is None else similarities
        return correlations(similarities, self.benchmark.pairs["dev"].gold)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_start and trainer.global_step == 0:
            # the pre-training score, for the record; not a checkpoint candidate
            initial = self.dev_spearman(pl_module.encoder)["spearman"]
            for logger in trainer.loggers:
                logger.log_metrics({DEV_SPEARMAN_INITIAL: initial}, step=0)
            log.info("before training: STS-B dev Spearman %.2f", initial)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        at_cadence = step % self.every_n_steps == 0
        at_end = trainer.is_last_batch or (trainer.max_steps > 0 and step >= trainer.max_steps)
        if not (at_cadence or at_end) or (self.history and self.history[-1][0] == step):
            return
        scores = self.dev_spearman(pl_module.encoder)
        self.history.append((step, scores["spearman"]))
        metrics = {
            DEV_SPEARMAN: scores["spearman"],
            DEV_PEARSON: scores["pearson"],
            DEV_SPEARMAN_BEST_LOGGED: self.best[1],
        }
        # float64: ModelCheckpoint compares these tensors, and float32 would tie scores that `best` tells apart
        trainer.callback_metrics.update(
            {name: torch.tensor(value, dtype=torch.float64) for name, value in metrics.items()}
        )
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        log.info("step %d: STS-B dev Spearman %.2f (best %.2f at step %d)", step, scores["spearman"], *self.best[::-1])

    def state_dict(self) -> dict:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = [tuple(item) for item in state_dict.get("history", [])]
