"""`python -m sentemb.train [group=option ...] [key=value ...]`: train, keep the best STS-B dev
checkpoint, report STS-B test of that checkpoint (under callbacks=none: of the final weights, and
the report says so). Returns the optimized metric for sweepers. A run directory that already holds
a run is skipped, resumed or started afresh (sentemb.runs.restart); a preemption signal stops the
run with a step-aligned last.ckpt (sentemb.training.resume).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from sentemb.common.errors import Preempted, SentembConfigError, TrainingDiverged
from sentemb.common.hydra_plumbing import instantiate_checked, resolved_container
from sentemb.common.log_noise import silence_known_noise
from sentemb.common.paths import CONF_DIR
from sentemb.eval.sts import STSBenchmark
from sentemb.runs.ddp_jobs import launch_ranks, needs_rank_launch, process_rank, record_rank_failure
from sentemb.runs.jobs import current_hydra, is_multirun, job_description, job_overrides
from sentemb.runs.record import write_record
from sentemb.runs.restart import Restart, plan_restart, set_old_checkpoints_aside
from sentemb.runs.sweeps import apply_sweep_winner
from sentemb.runs.wandb_runs import check_wandb_reachable, finish_wandb, wandb_run_id
from sentemb.training.callbacks import STSBDevEvaluation
from sentemb.training.checks import prepare_run
from sentemb.training.module import SentembModule
from sentemb.training.resume import check_checkpoint_path, checkpoint_dir, raise_if_preempted
from sentemb.training.trainer import build_trainer, report_best

log = logging.getLogger(__name__)

HYDRA_SUBDIR = ".hydra"  # where Hydra's run_job would save the job's config (its hydra.output_subdir default)
HYDRA_LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's default job_logging format

silence_known_noise()  # each line silenced is listed, with its reason, in sentemb/common/log_noise.py


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


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg: DictConfig) -> float | None:
    """One job. Its outcome goes to `metrics.json`; in a sweep a failed or diverged job never stops the others."""
    return run_job(cfg, current_hydra())


def run_job(cfg: DictConfig, hydra_cfg: DictConfig | None) -> float | None:
    """`main` without Hydra's decorator: restart decision, training, record, exit status."""
    output_dir, rank0 = Path(cfg.paths.output_dir), process_rank() == 0
    try:  # before anything is written: a bad checkpoint or a foreign run directory leaves the directory as it was
        restart = None if cfg.get("ckpt_path") or cfg.get("ddp_worker") else plan(cfg, hydra_cfg)
    except SentembConfigError as err:
        if is_multirun(hydra_cfg):
            log.error("job %s: %s (the sweep goes on)", hydra_cfg.job.num, err)
            return None
        sys.exit(f"sentemb: {err}")
    if restart is not None and restart.action == "skip":
        log.info("%s: %s", output_dir, restart.reason)
        return restart.previous["metrics"].get(cfg.get("optimized_metric") or "")
    # accepted: only now does the job write into its run directory (.hydra/, its log, its checkpoints, its record)
    if rank0 and not cfg.get("ddp_worker"):  # a sweep job's ranks run in the job's directory: the job wrote .hydra/
        save_hydra_files(cfg, hydra_cfg, output_dir)
    with job_log(output_dir, hydra_cfg):
        if restart is not None:
            start(restart, output_dir, rank0)
        return run_accepted(cfg, hydra_cfg, restart, rank0)


def run_accepted(cfg: DictConfig, hydra_cfg: DictConfig | None, restart: Restart | None, rank0: bool) -> float | None:
    """An accepted job: training (resumed if planned so), its record, its exit status."""
    output_dir = Path(cfg.paths.output_dir)
    if restart is not None and restart.action == "resume":
        cfg.ckpt_path = str(restart.checkpoint)
    started = time.perf_counter()
    # a job killed outright (node failure, SIGKILL) leaves `running`: its next start resumes it
    record: dict[str, Any] = {"status": "running", "message": "", "metrics": {}}
    if rank0:
        write_record(output_dir, {**record, **job_description(cfg, hydra_cfg)})
    error: BaseException | None = None
    try:
        supervised = needs_rank_launch(cfg, hydra_cfg)
        metrics = launch_ranks(cfg, hydra_cfg, restart.checkpoint if restart else None) if supervised else train(cfg)
        record.update(status="ok", metrics=metrics)
    except Preempted as err:
        record.update(status="preempted", message=str(err), step=err.step, signal=signal.Signals(err.signum).name)
        error = err
    except TrainingDiverged as err:
        record.update(status="diverged", message=str(err))
        error = err
    except Exception as err:  # noqa: BLE001 (recorded, then re-raised unless a sweep must go on)
        record.update(status="failed", message=f"{type(err).__name__}: {err}")
        error = err
    except BaseException:  # KeyboardInterrupt, SystemExit: recorded as an interrupt, which a restart resumes
        record.update(status="failed", message="interrupted", interrupted=True)
        raise
    finally:
        record.update(job_description(cfg, hydra_cfg), wall_time_s=round(time.perf_counter() - started, 3))
        if restart is not None and restart.action == "resume":
            record["resumed"] = [*restart.previous.get("resumed", []), restart.previous["status"]]
        if rank0:
            write_record(output_dir, record)
        finish_wandb(record)
    if error is None:
        return record["metrics"].get(cfg.get("optimized_metric") or "")
    record_rank_failure(error)
    if isinstance(error, Preempted):  # the whole process is being stopped: the sweep cannot go on either
        requeue(error.signum)
        sys.exit(128 + error.signum)  # the shell's status for a process stopped by that signal
    if is_multirun(hydra_cfg):
        log.error("job %s %s: %s (the sweep goes on)", hydra_cfg.job.num, record["status"], record["message"])
        return None  # the Optuna sweeper records a failed trial
    if isinstance(error, SentembConfigError | TrainingDiverged):
        sys.exit(f"sentemb: {error}")  # the message says what and how to fix; no traceback
    raise error


def plan(cfg: DictConfig, hydra_cfg: DictConfig | None) -> Restart:
    """What this job does with what its run directory already holds; raises SentembConfigError to refuse it."""
    restart = plan_restart(
        Path(cfg.paths.output_dir),
        job_overrides(hydra_cfg),
        in_sweep=is_multirun(hydra_cfg),
        retry_failed=bool(cfg.get("sweep", {}).get("retry_failed")),
        auto_resume=bool(cfg.get("auto_resume", True)),
    )
    if restart.action == "resume":
        check_checkpoint_path(str(restart.checkpoint), cfg, key="")  # a truncated last.ckpt is named with its fallback
    return restart


def start(restart: Restart, output_dir: Path, rank0: bool) -> None:
    """An accepted restart, in the job's log; rank 0 sets a replaced run's checkpoints aside."""
    if restart.previous is not None:
        log.info("%s: %s", output_dir, restart.reason)
    if restart.action == "fresh" and rank0:
        aside = set_old_checkpoints_aside(output_dir)
        if aside:
            log.info("%s: the previous run's checkpoints are kept in %s", output_dir, aside)


def save_hydra_files(cfg: DictConfig, hydra_cfg: DictConfig | None, output_dir: Path) -> None:
    """<run>/.hydra/{config,hydra,overrides}.yaml as Hydra's run_job writes them (hydra.core.utils._save_config).

    conf/train.yaml sets hydra.output_subdir: null, since Hydra writes them before the job runs, over a finished
    run's files even when the job is then refused; a user's own hydra.output_subdir means Hydra wrote them already.
    """
    if hydra_cfg is None or hydra_cfg.get("output_subdir") is not None:
        return
    task_cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    files = {
        "config.yaml": task_cfg,
        "hydra.yaml": OmegaConf.create({"hydra": hydra_cfg}),
        "overrides.yaml": hydra_cfg.overrides.task,
    }
    folder = output_dir / HYDRA_SUBDIR
    folder.mkdir(parents=True, exist_ok=True)
    for name, node in files.items():
        (folder / name).write_text(OmegaConf.to_yaml(node), encoding="utf-8")


@contextmanager
def job_log(output_dir: Path, hydra_cfg: DictConfig | None) -> Iterator[None]:
    """Hydra's `<job name>.log` in the run directory, for the accepted job only (conf/train.yaml's job_logging has
    no file handler, so a refused command appends nothing); removed at the end: a multirun runs its jobs in one
    process."""
    path = Path(os.path.abspath(output_dir / f"{hydra_cfg.job.name}.log")) if hydra_cfg is not None else None
    root = logging.getLogger()
    opened = [h for h in root.handlers if isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path]
    if path is None or opened:  # outside Hydra, or hydra/job_logging=default: Hydra opened it already
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)  # Hydra made it already; a direct call of run_job may not have
    handler = logging.FileHandler(path, encoding="utf-8")
    fmt = OmegaConf.select(hydra_cfg, "job_logging.formatters.simple.format", default=HYDRA_LOG_FORMAT)
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def requeue(signum: int) -> None:
    """Hand the preemption to whoever requeues this job: submitit's handler (requeues with its retry count and exits)
    if it installed one, else `scontrol requeue` on SLURM for USR1 (Lightning's auto-requeue signal)."""
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
    elif signum == signal.SIGUSR1 and os.environ.get("SLURM_JOB_ID") and process_rank() == 0:
        job = os.environ.get("SLURM_ARRAY_JOB_ID")
        job = f"{job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if job else os.environ["SLURM_JOB_ID"]
        result = subprocess.run(["scontrol", "requeue", job], check=False)
        log.info("scontrol requeue %s: exit %d", job, result.returncode)


if __name__ == "__main__":
    # the importable module's `main`, not __main__'s: submitit (launcher=...) then pickles the job by reference
    from sentemb.train import main as entry_point

    entry_point()
