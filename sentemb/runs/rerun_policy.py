"""What a job does when its run directory already holds a run: skip it, resume it, or start afresh.

The same command run again into the same directory (a requeued SLURM job, a re-run sweep with
`hydra.sweep.dir=<dir>`) reads that directory's `metrics.json`:

- `ok`: skipped, its record reused (a finished job is never retrained);
- `preempted`, `running` (killed outright) or `failed` by an interrupt: resumed from its own
  `checkpoints/last.ckpt` (`auto_resume=false` turns this off);
- `failed` or `diverged`: in a sweep skipped unless `sweep.retry_failed=true`; a single run
  starts afresh. A fresh start over an old run moves its `checkpoints/` aside: nothing is lost.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sentemb.common.errors import SentembConfigError
from sentemb.runs.record import RECORD_NAME, read_record
from sentemb.training.checkpoint_files import LAST, run_checkpoints

log = logging.getLogger(__name__)

RESUMABLE = ("preempted", "running")


@dataclass(frozen=True)
class Restart:
    action: Literal["fresh", "resume", "skip"]
    reason: str
    checkpoint: Path | None = None
    previous: dict[str, Any] | None = None


def interrupted(record: dict[str, Any]) -> bool:
    """Stopped before it could finish (preemption, a kill, Ctrl-C), not by its own error."""
    return record["status"] in RESUMABLE or (record["status"] == "failed" and bool(record.get("interrupted")))


def plan_restart(
    output_dir: Path, overrides: list[str], *, in_sweep: bool, retry_failed: bool, auto_resume: bool
) -> Restart:
    """Decide from the directory alone (no side effects), so every rank of a DDP job decides the same."""
    previous = read_record(output_dir)
    if previous is None:
        return Restart("fresh", "a new run directory")
    if previous.get("overrides", overrides) != overrides:
        raise SentembConfigError(
            f"{output_dir / RECORD_NAME} belongs to a job run with {previous['overrides']}, not {overrides}. "
            "Fix: give this job its own directory (hydra.run.dir=... or a new hydra.sweep.dir), or move that one away"
        )
    status, last = previous["status"], run_checkpoints(output_dir) / LAST
    if status == "ok":
        return Restart("skip", "finished (metrics.json: ok); its record is reused", previous=previous)
    if interrupted(previous):
        if auto_resume and last.is_file():
            return Restart("resume", f"{status}, resumed from {last}", last, previous)
        why = f"no {last} was written before it stopped" if auto_resume else "auto_resume=false"
        return Restart("fresh", f"{status}; started afresh ({why})", previous=previous)
    if in_sweep and not retry_failed:
        return Restart("skip", f"{status} before (sweep.retry_failed=true re-runs it)", previous=previous)
    return Restart("fresh", f"{status} before; started afresh", previous=previous)


def set_old_checkpoints_aside(output_dir: Path) -> Path | None:
    """A fresh start over an old run: its checkpoints/ → checkpoints.previous-<n>/ (not overwritten, not deleted)."""
    old = run_checkpoints(output_dir)
    if not old.is_dir() or not any(old.iterdir()):
        return None
    number = 1
    while (aside := old.with_name(f"{old.name}.previous-{number}")).exists():
        number += 1
    old.rename(aside)
    return aside


def run_dir_name(timestamp: str) -> str:
    """A single run's directory name: `slurm-<job id>` in a SLURM batch job, so a requeued job (which SLURM starts
    again with the same id) finds its own run; else `timestamp`. Interactive allocations get the timestamp."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    if not job or os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return timestamp
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"slurm-{job}_{task}" if os.environ.get("SLURM_ARRAY_JOB_ID") and task else f"slurm-{job}"
