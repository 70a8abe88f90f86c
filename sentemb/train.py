"""`python -m sentemb.train [group=option ...] [key=value ...]`: train, keep the best STS-B dev
checkpoint, report STS-B test of that checkpoint. Returns the optimized metric for sweepers.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from sentemb.callbacks import STSBDevEvaluation
from sentemb.config import apply_sweep_winner, instantiate_checked, prepare_run
from sentemb.errors import SentembConfigError
from sentemb.eval.sts import STSBenchmark
from sentemb.module import SentembModule
from sentemb.paths import PROJECT_ROOT
from sentemb.run_record import (
    TrainingDiverged,
    current_hydra,
    is_multirun,
    job_overrides,
    override_key,
    swept_keys,
    write_record,
)

log = logging.getLogger(__name__)

# ModelCheckpoint checks its monitor every step; before the first dev evaluation it is absent by design
warnings.filterwarnings("ignore", message=r".*could not find the monitored key.*")
# the train set is tokenised up front; worker processes would not speed up padding on 2 cores
warnings.filterwarnings("ignore", message=r".*does not have many workers.*")


def train(cfg: DictConfig) -> dict[str, Any]:
    """Run one training job; returns the final metrics (best dev, test, checkpoint path)."""
    winner = apply_sweep_winner(cfg)  # before the checks, so the winner's values are checked too
    if winner:
        log.info("from_sweep=%s: %s", cfg.from_sweep, " ".join(winner))
    corpus = prepare_run(cfg)
    # reads STS-B dev now, so a bad path fails before the model is loaded
    dev_eval: STSBDevEvaluation = instantiate_checked(cfg.eval)
    test_split = STSBenchmark(Path(cfg.eval.stsb_dir), splits=("test",))  # scored after training, read now
    L.seed_everything(cfg.seed, workers=True)

    tokenizer = instantiate(cfg.model.tokenizer)
    datamodule = instantiate(cfg.data, tokenizer=tokenizer)
    datamodule.report = corpus

    module = SentembModule(
        **{key: resolved_container(cfg[key]) for key in ("model", "pooling", "loss", "optimizer", "scheduler")},
        head=resolved_container(cfg.get("head")),
        grad_cache=cfg.get("grad_cache"),
    )
    trainer = build_trainer(cfg, extra_callbacks=[dev_eval])
    for logger in trainer.loggers:
        logger.log_hyperparams({k: resolved_container(v) for k, v in cfg.items() if k != "hydra"})  # all of it

    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    return report_best(trainer, dev_eval, test_split)


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
    best = SentembModule.load_from_checkpoint(best_path, map_location=trainer.strategy.root_device, weights_only=False)
    dev = dev_eval.dev_spearman(best)
    test = test_split.evaluate(best.encoder, batch_size=dev_eval.batch_size)["test"]
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


def resolved_container(node: Any) -> Any:
    """Resolved plain containers: what the checkpoint stores to rebuild the model exactly."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def finish_wandb(record: dict[str, Any] | None = None) -> None:
    """One W&B run per job, always finished (also after an exception), so multirun jobs never share one.

    With `record`, the run's summary gets the job's status and final metrics first (filterable in the dashboard).
    """
    wandb = sys.modules.get("wandb")
    if wandb is None or wandb.run is None:
        return
    if record is not None:
        numbers = {k: v for k, v in record["metrics"].items() if isinstance(v, int | float)}
        wandb.run.summary.update({**numbers, "status": record["status"], "message": record["message"]})
    wandb.finish(exit_code=0 if record is None or record["status"] == "ok" else 1)


@hydra.main(version_base="1.3", config_path=str(PROJECT_ROOT / "conf"), config_name="train")
def main(cfg: DictConfig) -> float | None:
    """One job. Its outcome goes to `metrics.json`; in a sweep a failed or diverged job never stops the others."""
    hydra_cfg = current_hydra()
    started = time.perf_counter()
    # until train() returns; an interrupt (KeyboardInterrupt, SystemExit) leaves this in the record
    record: dict[str, Any] = {"status": "failed", "message": "interrupted", "metrics": {}}
    error: BaseException | None = None
    try:
        record.update(status="ok", message="", metrics=train(cfg))
    except TrainingDiverged as err:
        record.update(status="diverged", message=str(err))
        error = err
    except Exception as err:  # noqa: BLE001 (recorded, then re-raised unless a sweep must go on)
        record.update(status="failed", message=f"{type(err).__name__}: {err}")
        error = err
    finally:
        record.update(job_description(cfg, hydra_cfg), wall_time_s=round(time.perf_counter() - started, 3))
        write_record(Path(cfg.paths.output_dir), record)
        finish_wandb(record)
    if error is None:
        return record["metrics"].get(cfg.get("optimized_metric") or "")
    if is_multirun(hydra_cfg):
        log.error("job %s %s: %s (the sweep goes on)", hydra_cfg.job.num, record["status"], record["message"])
        return None  # the Optuna sweeper records a failed trial
    if isinstance(error, SentembConfigError | TrainingDiverged):
        sys.exit(f"sentemb: {error}")  # the message says what and how to fix; no traceback
    raise error


def job_description(cfg: DictConfig, hydra_cfg: DictConfig | None) -> dict[str, Any]:
    """What names the job in a report: its overrides, the swept ones, seed, W&B name/group/tags."""
    overrides = job_overrides(hydra_cfg)
    swept = swept_keys(hydra_cfg)
    wandb_cfg = (cfg.get("logger") or {}).get("wandb")
    try:  # the record is written whatever failed, a logger config that cannot resolve included
        resolved = OmegaConf.to_container(wandb_cfg, resolve=True) if wandb_cfg else None
    except Exception:  # noqa: BLE001
        resolved = None
    wandb = {k: resolved.get(k) for k in ("name", "group", "tags")} if resolved else None
    return {
        "overrides": overrides,
        "swept": {override_key(o): o.split("=", 1)[1] for o in overrides if override_key(o) in swept},
        "seed": cfg.seed,
        "job": hydra_cfg.job.num if is_multirun(hydra_cfg) else None,
        "wandb": wandb,
    }


if __name__ == "__main__":
    # the importable module's `main`, not __main__'s: submitit (launcher=...) then pickles the job by reference
    from sentemb.train import main as entry_point

    entry_point()
