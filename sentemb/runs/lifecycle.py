"""A training job from its start to its exit, around the training recipe it is given.

A run directory has one writer: the job first takes its lock (sentemb.common.folder_lock), so a
second command on a live directory is refused before it reads or writes anything. What the run
directory already holds then decides whether the job runs (sentemb.runs.rerun_policy); nothing is
written before that, so a refused or skipped job changes no byte of it. An accepted job then names
itself in the lock file, writes Hydra's files and its log (sentemb.runs.job_files), and its training
runs inside its record, which also settles its exit status (sentemb.runs.job_outcome).

The job hands the recipe a config ready for it: a finished sweep's winner (from_sweep=) set before the
recipe's checks, so they check its values too; and, once those checks passed and before the model is
built, the job's W&B steps: an online server probed, the run id its checkpoints keep set (`run_recipe`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sentemb.common.errors import SentembConfigError
from sentemb.common.folder_lock import FolderLock, take_folder_lock
from sentemb.common.metric_names import read_metric
from sentemb.common.paths import absolute_data_paths
from sentemb.runs.ddp_jobs import launch_ranks, needs_rank_launch, process_rank
from sentemb.runs.job_files import HYDRA_SUBDIR, check_folders, job_log, logger_folders, save_hydra_files
from sentemb.runs.job_outcome import recorded_job
from sentemb.runs.jobs import current_hydra, is_multirun, job_overrides
from sentemb.runs.rerun_policy import Restart, plan_restart, set_old_checkpoints_aside
from sentemb.runs.wandb_runs import check_wandb_reachable, wandb_run_id
from sentemb.training.checkpoint_files import CHECKPOINTS, checkpoint_dir, remove_partial_checkpoints

log = logging.getLogger(__name__)

JobStep = Callable[[DictConfig], None]  # the job's own steps the recipe takes before it builds the model
Recipe = Callable[[DictConfig, JobStep], dict[str, Any]]  # one job's training: config and job step in, metrics out


def run_job(cfg: DictConfig, train: Recipe) -> float | None:
    """Run directory lock, restart decision, `train(cfg, before_build)`, record, exit status; returns the optimized
    metric for sweepers (None for a job its sweep goes on past)."""
    hydra_cfg = current_hydra()  # None outside a Hydra app
    try:  # before the restart decision: a directory another live command writes in is neither read nor written
        lock = lock_run_directory(cfg, hydra_cfg)
    except SentembConfigError as err:
        return refuse(err, hydra_cfg)
    try:
        resumed = lock_resumed_run(cfg)
    except SentembConfigError as err:
        if lock is not None:
            lock.release()
        return refuse(err, hydra_cfg)
    try:
        return run_locked(cfg, hydra_cfg, train, lock)
    finally:
        if lock is not None:  # released per job: a multirun runs its jobs one after another in this process
            lock.release()  # a refused or skipped job's new lock file goes with it; an accepted job's stays
        if resumed is not None:
            resumed.release(remove=resumed.created, restore=True)  # that run's folder as this job found it


def lock_resumed_run(cfg: DictConfig) -> FolderLock | None:
    """ckpt_path=<a checkpoint of another run folder>: this run's checkpoints go on beside it (`checkpoint_dir`),
    so that folder is this job's too, and locked as its own (None: no such checkpoint, or a rank worker)."""
    ckpt = cfg.get("ckpt_path")
    if not ckpt or process_rank() != 0 or cfg.get("ddp_worker"):
        return None
    folder = Path(checkpoint_dir(ckpt, cfg.paths.output_dir))
    run = folder.parent if folder.name == CHECKPOINTS else folder
    if not run.is_dir() or run.resolve() == Path(cfg.paths.output_dir).resolve():
        return None
    lock = take_folder_lock(
        run,
        f"ckpt_path={ckpt} (its run folder {run}, where this run's checkpoints go on)",
        "wait for the command writing there to finish, or copy the checkpoint into a folder of its own first",
    )
    lock.claim()
    return lock


def lock_run_directory(cfg: DictConfig, hydra_cfg: DictConfig | None) -> FolderLock | None:
    """The run directory's lock, taken by the process that owns the job; a DDP rank worker takes none (the process
    that started it, rank 0 or the sweep job launching its ranks, holds it)."""
    if process_rank() != 0 or cfg.get("ddp_worker"):
        return None
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)  # Hydra has made it already; the lock file lives in it
    if is_multirun(hydra_cfg):
        named = f"the job's folder {output_dir} (hydra.sweep.dir)"
        fix = "wait for it to finish (run the sweep again then: finished jobs are skipped), or another hydra.sweep.dir"
    else:
        named = f"hydra.run.dir={output_dir}"
        fix = "wait for it to finish (the same command then skips or resumes this run), or another hydra.run.dir=..."
    return take_folder_lock(output_dir, named, fix, wait_s=REQUEUE_LOCK_WAIT_S if requeued() else 0.0)


# a requeued job may start on another node before the file system lets go of its lost node's lock (an NFSv4 lease
# runs out after ~90 s): it waits that long for its own folder rather than fail and not be requeued again
REQUEUE_LOCK_WAIT_S = 180.0


def requeued() -> bool:
    """This process is a SLURM job started again (a requeue, submitit's included)."""
    return os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0")


def run_locked(cfg: DictConfig, hydra_cfg: DictConfig | None, train: Recipe, lock: FolderLock | None) -> float | None:
    """The job once its run directory is this process's (or its job's, for a rank worker)."""
    output_dir, rank0 = Path(cfg.paths.output_dir), process_rank() == 0
    try:  # before anything is written: a bad checkpoint or a foreign run directory leaves the directory as it was
        check_folders(output_dir, written_folders(cfg, output_dir))  # a link planted there is never written through
        restart = None if cfg.get("ckpt_path") or cfg.get("ddp_worker") else plan(cfg, hydra_cfg)
    except SentembConfigError as err:
        return refuse(err, hydra_cfg)
    if restart is not None and restart.action == "skip":
        log.info("%s: %s", output_dir, restart.reason)
        return optimized_metric(restart.previous["metrics"], cfg)
    # accepted: only now does the job write into its run directory (.hydra/, its log, its checkpoints, its record)
    if lock is not None:
        lock.claim()  # the lock file names this process: a second command is refused naming it
        for path in remove_partial_checkpoints(Path(checkpoint_dir(cfg.get("ckpt_path"), output_dir))):
            log.info("removed %s: a checkpoint write that never finished (its process was killed)", path)
    absolute_data_paths(cfg.data)  # the saved config names the file read, not a path relative to where it ran
    if rank0 and not cfg.get("ddp_worker"):  # a sweep job's ranks run in the job's directory: the job wrote .hydra/
        save_hydra_files(cfg, hydra_cfg, output_dir)
    with job_log(output_dir, hydra_cfg):
        if restart is not None:
            start(restart, output_dir, rank0)
        return run_accepted(cfg, hydra_cfg, restart, rank0, train)


def written_folders(cfg: DictConfig, output_dir: Path) -> dict[Path, str]:
    """The folders a training job writes into (its path: who writes there): .hydra/, its checkpoints' folder and its
    loggers' (`logger_folders`)."""
    checkpoints = Path(checkpoint_dir(cfg.get("ckpt_path"), output_dir))
    folders = {output_dir / HYDRA_SUBDIR: "sentemb.train (Hydra's files)", checkpoints: "sentemb.train (checkpoints)"}
    return folders | logger_folders(cfg.get("logger"))


def run_accepted(
    cfg: DictConfig, hydra_cfg: DictConfig | None, restart: Restart | None, rank0: bool, train: Recipe
) -> float | None:
    """An accepted job: its training (resumed if planned so; on the ranks it launches, if it launches them) inside
    its record."""
    resume_from = restart.checkpoint if restart is not None and restart.action == "resume" else None
    if resume_from is not None:
        cfg.ckpt_path = str(resume_from)
    with recorded_job(cfg, hydra_cfg, restart, rank0) as record:
        supervised = needs_rank_launch(cfg, hydra_cfg)
        metrics = launch_ranks(cfg, hydra_cfg, resume_from) if supervised else run_recipe(cfg, train)
        record.update(status="ok", metrics=metrics)
    return optimized_metric(record["metrics"], cfg)  # a failed job its sweep goes on past has none: None


def run_recipe(cfg: DictConfig, train: Recipe) -> dict[str, Any]:
    """The recipe as a job (or each rank of one) runs it: the sweep winner first, the W&B steps handed in."""
    winner = []
    if cfg.get("from_sweep"):  # sweeps' module reads results with scipy and draws with matplotlib: imported for it
        from sentemb.runs.sweeps import apply_sweep_winner

        winner = apply_sweep_winner(cfg)  # before the recipe's checks, so the winner's values are checked too
    if winner:
        log.info("from_sweep=%s: %s", cfg.from_sweep, " ".join(winner))
    return train(cfg, before_build)


def before_build(cfg: DictConfig) -> None:
    """The job's W&B steps, which the recipe takes once its checks passed and its STS-B splits were read: after
    them, so a config they refuse leaves no W&B run id behind; before the model is built."""
    check_wandb_reachable(cfg.get("logger"))  # W&B online without its server: refused in 3 s, before the model loads
    keep_wandb_run_id(cfg)


def keep_wandb_run_id(cfg: DictConfig) -> None:
    """The W&B run continues across resumes: its id lives beside the checkpoints the run resumes from."""
    wandb_cfg = (cfg.get("logger") or {}).get("wandb")
    if wandb_cfg and wandb_cfg.get("id") is None and process_rank() == 0:  # only rank 0 logs to W&B
        wandb_cfg.id = wandb_run_id(Path(checkpoint_dir(cfg.get("ckpt_path"), cfg.paths.output_dir)))


def optimized_metric(metrics: dict[str, Any], cfg: DictConfig) -> float | None:
    """`optimized_metric`'s value in a job's metrics (this run's, or a skipped job's earlier record's), else None."""
    # the one place a job's metrics are read by that name; read_metric also finds an old record's names
    return read_metric(metrics, cfg.get("optimized_metric"))


def refuse(err: SentembConfigError, hydra_cfg: DictConfig | None) -> None:
    """A job its run directory refuses: in a sweep logged (the sweep goes on), else the command exits with why."""
    if is_multirun(hydra_cfg):
        log.error("job %s: %s (the sweep goes on)", hydra_cfg.job.num, err)
        return None
    sys.exit(f"sentemb: {err}")


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
        from sentemb.training.checkpoints import check_checkpoint_path  # torch: only a resumed run reads a checkpoint

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
