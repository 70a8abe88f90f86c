"""`python -m sentemb.train [group=option ...] [key=value ...]`: train, keep the best STS-B dev
checkpoint, report STS-B test of that checkpoint (under callbacks=none: of the final weights, and
the report says so). Returns the optimized metric for sweepers.

`train` is the recipe; the job around it (sentemb.runs.lifecycle) skips, resumes or starts afresh
a run directory that already holds a run (sentemb.runs.rerun_policy), and records the outcome; a
preemption signal stops the run with a step-aligned last.ckpt (sentemb.training.exact_resume).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig

from sentemb.common.command_line import checked_command_line
from sentemb.common.hydra_plumbing import instantiate_checked, resolved_container
from sentemb.common.paths import CONF_DIR
from sentemb.common.process import configure_process
from sentemb.encoders.build import check_loaded_length
from sentemb.eval.sts import STSBenchmark
from sentemb.runs.ddp_jobs import process_rank
from sentemb.runs.jobs import current_hydra
from sentemb.runs.lifecycle import run_job
from sentemb.runs.sweeps import apply_sweep_winner
from sentemb.runs.wandb_runs import check_wandb_reachable, wandb_run_id
from sentemb.training.callbacks import STSBDevEvaluation
from sentemb.training.checks import prepare_run
from sentemb.training.exact_resume import checkpoint_dir, raise_if_preempted
from sentemb.training.module import SentembModule
from sentemb.training.trainer import build_trainer, report_best

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Run one training job; returns the final metrics (best dev, test, checkpoint path)."""
    winner = apply_sweep_winner(cfg)  # before the checks, so the winner's values are checked too
    if winner:
        log.info("from_sweep=%s: %s", cfg.from_sweep, " ".join(winner))
    prepare_run(cfg)
    check_wandb_reachable(cfg.get("logger"))  # W&B online without its server: refused in 3 s, before the model loads
    # reads STS-B dev now, so a bad path fails before the model is loaded
    dev_eval: STSBDevEvaluation = instantiate_checked(cfg.eval)
    test_split = STSBenchmark(Path(cfg.eval.stsb_dir), splits=("test",))  # scored after training, read now
    L.seed_everything(cfg.seed, workers=True)

    keep_wandb_run_id(cfg)
    module = SentembModule.from_config(cfg)
    # a hub model the pre-run checks could not read (not stored yet): its positions, before the first batch
    check_loaded_length(module.encoder.backbone, resolved_container(cfg.model), cfg.data.get("max_length"))
    datamodule = instantiate(cfg.data, tokenizer=module.encoder.tokenizer)
    trainer = build_trainer(cfg, extra_callbacks=[dev_eval])
    for logger in trainer.loggers:
        logger.log_hyperparams({k: resolved_container(v) for k, v in cfg.items() if k != "hydra"})  # all of it

    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=True)  # nothing runs
    raise_if_preempted(trainer)
    return report_best(trainer, dev_eval, test_split)


def keep_wandb_run_id(cfg: DictConfig) -> None:
    """The W&B run continues across resumes: its id lives beside the checkpoints the run resumes from."""
    wandb_cfg = (cfg.get("logger") or {}).get("wandb")
    if wandb_cfg and wandb_cfg.get("id") is None and process_rank() == 0:  # only rank 0 logs to W&B
        wandb_cfg.id = wandb_run_id(Path(checkpoint_dir(cfg.get("ckpt_path"), cfg.paths.output_dir)))


@checked_command_line  # an unquoted non-ASCII override: named with its fix, before Hydra's lexer
@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    """One job. Its outcome goes to `metrics.json`; in a sweep a failed or diverged job never stops the others."""
    configure_process()
    return run_job(cfg, current_hydra(), train)  # the recipe passed in: runs/ sits below the commands


if __name__ == "__main__":
    # the importable module's `main`, not __main__'s: submitit (launcher=...) then pickles the job by reference
    from sentemb.train import main as entry_point

    entry_point()
