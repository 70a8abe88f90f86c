"""`python -m sentemb.train [group=option ...] [key=value ...]`: train, keep the best STS-B dev
checkpoint, report STS-B test of that checkpoint (under callbacks=none: of the final weights, and
the report says so). Returns the optimized metric for sweepers.

`train` is the recipe; the job around it (sentemb.runs.lifecycle) skips, resumes or starts afresh
a run directory that already holds a run (sentemb.runs.rerun_policy), sets a finished sweep's winner
(from_sweep=) before the recipe's checks, hands it the job's W&B steps, and records the outcome; a
preemption signal stops the run with a step-aligned last.ckpt (sentemb.training.checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from sentemb.common.command_line import checked_train_command_line
from sentemb.common.hydra_plumbing import instantiate_checked, resolved_container
from sentemb.common.paths import CONF_DIR
from sentemb.common.process import configure_process
from sentemb.training.checks import prepare_run

# torch, lightning and transformers are imported where the model is built, after the checks: a config or data error
# is answered in under 2 seconds, before they load (tests/test_fast_feedback.py)


def train(cfg: DictConfig, before_build: Callable[[DictConfig], None] | None = None) -> dict[str, Any]:
    """Run one training job; returns the final metrics (best dev, test, checkpoint path).

    `before_build(cfg)`: the job's own steps (sentemb.runs.lifecycle.before_build: an online W&B server probed, the
    W&B run id its checkpoints keep set), taken once the checks passed and the STS-B splits were read.
    """
    prepare_run(cfg)
    import lightning as L
    from hydra.utils import instantiate

    from sentemb.data.labelled import in_domain_note
    from sentemb.encoders.build import check_loaded_length
    from sentemb.training.checkpoints import raise_if_preempted
    from sentemb.training.module import SentembModule
    from sentemb.training.trainer import build_trainer, report_best

    # reads STS-B dev and the test tasks scored after training now, so a bad path fails before the model is loaded
    dev_eval = instantiate_checked(cfg.eval)
    if before_build is not None:
        before_build(cfg)
    L.seed_everything(cfg.seed, workers=True)

    module = SentembModule.from_config(cfg)
    # a hub model the pre-run checks could not read (not stored yet): its positions, before the first batch
    check_loaded_length(module.encoder.backbone, resolved_container(cfg.model), cfg.data.get("max_length"))
    # the views the step parts read beyond the anchor and positive, made by the data
    datamodule = instantiate(cfg.data, tokenizer=module.encoder.tokenizer, views=module.data_views())
    trainer = build_trainer(cfg, extra_callbacks=[dev_eval])
    for logger in trainer.loggers:
        logger.log_hyperparams({k: resolved_container(v) for k, v in cfg.items() if k != "hydra"})  # all of it

    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=True)  # nothing runs
    raise_if_preempted(trainer)
    metrics = report_best(trainer, dev_eval, Path(cfg.paths.output_dir))
    note = in_domain_note(cfg.data)
    if note is not None:  # STS-B after STS-B train, SICK-R after SICK train: said beside the scores and recorded
        print(note)
        metrics["in_domain"] = note
    return metrics


@checked_train_command_line  # an unquoted non-ASCII override, a preset's old flat name: each with its fix
@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    """One job. Its outcome goes to `metrics.json`; in a sweep a failed or diverged job never stops the others."""
    configure_process()
    from sentemb.runs.lifecycle import run_job

    return run_job(cfg, train)  # the recipe passed in: runs/ sits below the commands


if __name__ == "__main__":
    # the importable module's `main`, not __main__'s: submitit (launcher=...) then pickles the job by reference
    from sentemb.train import main as entry_point

    entry_point()
