"""The configured Lightning Trainer, and the closing report of a training job (the best checkpoint, rescored)."""

from __future__ import annotations

import warnings
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig

from sentemb.encoders.build import load_checkpoint_encoder
from sentemb.eval.sts import STSBenchmark
from sentemb.training.callbacks import STSBDevEvaluation


def build_trainer(cfg: DictConfig, extra_callbacks: list[L.Callback] = (), **overrides: Any) -> L.Trainer:
    """The configured Trainer with the configured callbacks and loggers (plus `extra_callbacks`)."""
    callbacks = [*extra_callbacks, *(instantiate(c) for c in (cfg.get("callbacks") or {}).values())]
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, **overrides)
    visible = torch.cuda.device_count()
    if visible > 1 and trainer.world_size == 1:
        warnings.warn(
            f"{visible} GPUs are visible but the trainer uses one: pass trainer=ddp trainer.devices={visible} "
            "to train on all of them (negatives are then gathered across GPUs)",
            stacklevel=1,
        )
    # deterministic=True also makes torch NaN-fill every new tensor, a debugging aid that costs ~2% of a
    # CPU step; the algorithms stay the deterministic ones without it
    torch.utils.deterministic.fill_uninitialized_memory = False
    return trainer


def report_best(trainer: L.Trainer, dev_eval: STSBDevEvaluation, test_split: STSBenchmark) -> dict[str, Any]:
    """Reload the best checkpoint, score STS-B dev and test with it, log and print them.

    Dev is scored by the callback's own `dev_spearman` (same sentences, batches, batch size and
    device), so on the same machine it is the logged best to the last bit; a resumed run whose
    best was logged elsewhere may differ in the last bits, and a warning says so.
    """
    checkpoint = next((c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)), None)
    best_path = checkpoint.best_model_path if checkpoint else ""
    if not best_path or dev_eval.best is None:
        raise RuntimeError("training ended without a checkpoint: is the ModelCheckpoint callback configured?")
    best, _ = load_checkpoint_encoder(best_path, trainer.strategy.root_device)
    dev = dev_eval.dev_spearman(best)
    test = test_split.evaluate(best, batch_size=dev_eval.batch_size)["test"]
    best_step, logged_dev = dev_eval.best
    kept_score = checkpoint.best_model_score
    if kept_score is not None and float(kept_score) != logged_dev:
        warnings.warn(
            f"{best_path} was kept for score {float(kept_score)!r}, but the best logged dev score "
            f"is {logged_dev!r} (step {best_step}): the checkpoint and the log disagree",
            stacklevel=1,
        )
    if dev["spearman"] != logged_dev:
        warnings.warn(
            f"the best checkpoint scores STS-B dev {dev['spearman']!r} now but {logged_dev!r} was logged at step "
            f"{best_step}: another device, thread count or torch kernel than the training run's",
            stacklevel=1,
        )
    metrics = {
        "stsb/best_dev_spearman": dev["spearman"],
        "stsb/test_spearman": test["spearman"],
        "stsb/test_pearson": test["pearson"],
        "stsb/best_step": best_step,
    }
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
        logger.finalize("success")
    if trainer.is_global_zero:
        print(final_report(best_step, dev["spearman"], logged_dev, test["spearman"], best_path))
    return {**metrics, "best_checkpoint": best_path, "stsb/dev_spearman_best": logged_dev}


def final_report(best_step: int, dev: float, logged_dev: float, test: float, best_path: str) -> str:
    """The closing lines of a training job; 4 decimals, where batch-neighbour differences would show (~1e-4)."""
    return (
        f"\nSTS-B dev Spearman (best, step {best_step}): {dev:.4f}   [logged during training: {logged_dev:.4f}]"
        f"\nSTS-B test Spearman (best checkpoint):    {test:.4f}"
        f"\nbest checkpoint: {best_path}\n"
    )
