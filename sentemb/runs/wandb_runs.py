"""Weights & Biases: online or offline, a job's run name and group, and finishing a job's run."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

from sentemb.runs.jobs import current_hydra, is_multirun, job_overrides, short_name, swept_keys


def wandb_offline() -> bool:
    """Offline unless the user configured W&B online (WANDB_MODE=online, or an API key in the environment)."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode in ("online", "run"):
        return False
    if mode in ("offline", "dryrun", "disabled"):
        return True
    return not os.environ.get("WANDB_API_KEY")


def wandb_mode() -> str:
    """wandb.init's mode, passed explicitly: wandb reads the environment only when its process singleton starts."""
    return "offline" if wandb_offline() else "online"


def wandb_run_name(fallback: str) -> str:
    """W&B `name`: the job's swept overrides in short form (`loss.m=0.3 loss.r=1.5 seed=2`), else `fallback`."""
    hydra_cfg = current_hydra()
    overrides = job_overrides(hydra_cfg)
    return short_name(overrides, swept_keys(hydra_cfg)) or fallback if is_multirun(hydra_cfg) else fallback


def wandb_run_group(sweep_name: str | None, fallback: str) -> str:
    """W&B `group`: the sweep (`sweep_name=`, else its multirun directory's name); a single run: `fallback`."""
    hydra_cfg = current_hydra()
    if not is_multirun(hydra_cfg):
        return fallback
    return str(sweep_name) if sweep_name else Path(str(hydra_cfg.sweep.dir)).name


RUN_ID_FILE = "wandb_run_id"


def wandb_run_id(checkpoint_dir: Path) -> str:
    """The W&B run id kept beside a run's checkpoints (created on first use): a resumed or requeued run continues the
    same W&B run, and a fresh start (its old checkpoints set aside) gets a new one."""
    path = Path(checkpoint_dir) / RUN_ID_FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(uuid.uuid4().hex[:12] + "\n")  # W&B takes any [a-z0-9] id; it makes 8-character ones
    return path.read_text().strip()


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
