"""A training job from its start to its exit, around the training recipe it is given.

What the run directory already holds decides whether the job runs (sentemb.runs.rerun_policy);
nothing is written before that, so a refused or skipped job changes no byte of it. An accepted
job then writes Hydra's files and its log (sentemb.runs.job_files), and its training runs inside
its record, which also settles its exit status (sentemb.runs.job_outcome).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import read_metric
from sentemb.runs.ddp_jobs import launch_ranks, needs_rank_launch, process_rank
from sentemb.runs.job_files import job_log, save_hydra_files
from sentemb.runs.job_outcome import recorded_job
from sentemb.runs.jobs import is_multirun, job_overrides
from sentemb.runs.rerun_policy import Restart, plan_restart, set_old_checkpoints_aside
from sentemb.training.exact_resume import check_checkpoint_path

log = logging.getLogger(__name__)

Recipe = Callable[[DictConfig], dict[str, Any]]  # one job's training: its config in, its final metrics out


def run_job(cfg: DictConfig, hydra_cfg: DictConfig | None, train: Recipe) -> float | None:
    """Restart decision, `train(cfg)`, record, exit status; returns the optimized metric for sweepers (None for a
    job its sweep goes on past)."""
    output_dir, rank0 = Path(cfg.paths.output_dir), process_rank() == 0
    try:  # before anything is written: a bad checkpoint or a foreign run directory leaves the directory as it was
        restart = None if cfg.get("ckpt_path") or cfg.get("ddp_worker") else plan(cfg, hydra_cfg)
    except SentembConfigError as err:
        return refuse(err, hydra_cfg)
    if restart is not None and restart.action == "skip":
        log.info("%s: %s", output_dir, restart.reason)
        return optimized_metric(restart.previous["metrics"], cfg)
    # accepted: only now does the job write into its run directory (.hydra/, its log, its checkpoints, its record)
    if rank0 and not cfg.get("ddp_worker"):  # a sweep job's ranks run in the job's directory: the job wrote .hydra/
        save_hydra_files(cfg, hydra_cfg, output_dir)
    with job_log(output_dir, hydra_cfg):
        if restart is not None:
            start(restart, output_dir, rank0)
        return run_accepted(cfg, hydra_cfg, restart, rank0, train)


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
        metrics = launch_ranks(cfg, hydra_cfg, resume_from) if supervised else train(cfg)
        record.update(status="ok", metrics=metrics)
    return optimized_metric(record["metrics"], cfg)  # a failed job its sweep goes on past has none: None


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
