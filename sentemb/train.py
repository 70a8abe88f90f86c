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
from hydra.utils import instantiate
from omegaconf import DictConfig

from sentemb.common.errors import SentembConfigError, TrainingDiverged
from sentemb.common.hydra_plumbing import instantiate_checked, resolved_container
from sentemb.common.paths import CONF_DIR
from sentemb.eval.sts import STSBenchmark
from sentemb.runs.jobs import current_hydra, is_multirun, job_description
from sentemb.runs.record import write_record
from sentemb.runs.sweeps import apply_sweep_winner
from sentemb.runs.wandb_runs import finish_wandb
from sentemb.training.callbacks import STSBDevEvaluation
from sentemb.training.checks import prepare_run
from sentemb.training.module import SentembModule
from sentemb.training.trainer import build_trainer, report_best

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
    prepare_run(cfg)
    # reads STS-B dev now, so a bad path fails before the model is loaded
    dev_eval: STSBDevEvaluation = instantiate_checked(cfg.eval)
    test_split = STSBenchmark(Path(cfg.eval.stsb_dir), splits=("test",))  # scored after training, read now
    L.seed_everything(cfg.seed, workers=True)

    module = SentembModule.from_config(cfg)
    datamodule = instantiate(cfg.data, tokenizer=module.encoder.tokenizer)
    trainer = build_trainer(cfg, extra_callbacks=[dev_eval])
    for logger in trainer.loggers:
        logger.log_hyperparams({k: resolved_container(v) for k, v in cfg.items() if k != "hydra"})  # all of it

    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    return report_best(trainer, dev_eval, test_split)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
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


if __name__ == "__main__":
    # the importable module's `main`, not __main__'s: submitit (launcher=...) then pickles the job by reference
    from sentemb.train import main as entry_point

    entry_point()
