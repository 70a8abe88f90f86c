"""A job's outcome: its record (`metrics.json`) kept around its training, then its exit status.

`recorded_job` writes `running` when the job starts (a job killed outright then says so), and
when the block ends the outcome, W&B's run finished with it:

- `ok`, with the metrics the block put in the record;
- `preempted` (a preemption signal wrote last.ckpt for this step, or arrived outside a training
  step, where it stops the job at once): handed to whoever requeues the job, then the process
  exits with the signal's status (a sweep cannot go on: the whole process is being stopped);
- `diverged` or `failed`: in a sweep logged, and the sweep goes on (the Optuna sweeper records a
  failed trial); a single run exits with its message (SentembConfigError, TrainingDiverged,
  CheckpointNotWritten: no traceback) or re-raises;
- `failed` by an interrupt (Ctrl-C, SystemExit): recorded as interrupted, which a re-run resumes,
  and re-raised.

A preemption signal never ends a job with status 0: while the block runs, this module's handlers
raise `Preempted` (outside training steps; sentemb.training.checkpoints' LastCheckpoint takes over during them),
and Lightning's SIGTERMException (a SystemExit with code 0) counts as a preemption too.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sentemb.common.errors import CheckpointNotWritten, Preempted, SentembConfigError, TrainingDiverged
from sentemb.runs.ddp_jobs import process_rank, record_rank_failure
from sentemb.runs.jobs import is_multirun, job_description
from sentemb.runs.record import write_record
from sentemb.runs.rerun_policy import Restart
from sentemb.runs.wandb_runs import finish_wandb
from sentemb.training.checkpoint_files import PREEMPTION_SIGNALS

log = logging.getLogger(__name__)


@contextmanager
def recorded_job(
    cfg: DictConfig, hydra_cfg: DictConfig | None, restart: Restart | None, rank0: bool
) -> Iterator[dict[str, Any]]:
    """The job's record around the block, which sets `status="ok"` and the metrics in it; rank 0 writes it.

    Leaving the block by an exception records it (`stopped_by`), then `settle` decides: the block's
    exception goes on, the process exits, or (a sweep going on past the job) nothing more happens.
    """
    output_dir = Path(cfg.paths.output_dir)
    started = time.perf_counter()
    # a job killed outright (node failure, SIGKILL) leaves `running`: its next start resumes it
    record: dict[str, Any] = {"status": "running", "message": "", "metrics": {}}
    if rank0:
        write_record(output_dir, {**record, **job_description(cfg, hydra_cfg)})
    error: Exception | None = None
    try:
        with preemption_stops_the_job(cfg):  # its handlers are gone before `settle` hands the signal on
            yield record
    except BaseException as caught:
        err = as_preemption(caught)
        record.update(stopped_by(err))
        if not isinstance(err, Exception):
            raise  # KeyboardInterrupt, SystemExit: recorded as an interrupt (a re-run resumes it), and on its way
        error = err
    finally:
        record.update(job_description(cfg, hydra_cfg), wall_time_s=round(time.perf_counter() - started, 3))
        if restart is not None and restart.action == "resume":
            record["resumed"] = [*restart.previous.get("resumed", []), restart.previous["status"]]
        if rank0:
            write_record(output_dir, record)
        finish_wandb(record)
    if error is not None:
        settle(error, record, hydra_cfg)


@contextmanager
def preemption_stops_the_job(cfg: DictConfig) -> Iterator[None]:
    """A preemption signal in the block raises `Preempted` where it arrives; the handlers found are back after.

    Lightning chains the handler it finds after its own SIGTERM notifier, so a signal during the model's build,
    the dev evaluation at start or the closing test stops the job at once as preempted (Lightning alone would
    let it end with status 0); LastCheckpoint's handlers replace these during training steps and put them back.
    """
    if threading.current_thread() is not threading.main_thread():  # Python allows handlers there only
        yield
        return
    previous = {signum: signal.signal(signum, raise_preempted) for signum in preemption_signals(cfg)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def preemption_signals(cfg: DictConfig) -> list[signal.Signals]:
    """The signals LastCheckpoint is configured with (`callbacks.last_checkpoint.signals`), else the usual ones."""
    last_checkpoint = (cfg.get("callbacks") or {}).get("last_checkpoint") or {}
    names = last_checkpoint.get("signals") or PREEMPTION_SIGNALS
    # a misspelt name is LastCheckpoint's to refuse, with its fix, once the job's checks run
    return [
        getattr(signal, str(name)) for name in names if isinstance(getattr(signal, str(name), None), signal.Signals)
    ]


def raise_preempted(signum: int, frame: Any) -> None:
    raise Preempted(signum)


def as_preemption(err: BaseException) -> BaseException:
    """Lightning's SIGTERMException (a SystemExit with code 0, which a scheduler would take for success) as the
    preemption it is; any other exception as it is."""
    exceptions = sys.modules.get("lightning.pytorch.utilities.exceptions")  # not imported: not raised (a check's error)
    if exceptions is None or not isinstance(err, exceptions.SIGTERMException):
        return err
    preempted = Preempted(int(signal.SIGTERM))
    preempted.__cause__ = err
    return preempted


def stopped_by(err: BaseException) -> dict[str, Any]:
    """The record's fields for a job that `err` stopped."""
    if isinstance(err, Preempted):
        return {"status": "preempted", "message": str(err), "step": err.step, "signal": signal.Signals(err.signum).name}
    if isinstance(err, TrainingDiverged):
        return {"status": "diverged", "message": str(err)}
    if isinstance(err, Exception):
        return {"status": "failed", "message": f"{type(err).__name__}: {err}"}
    return {"status": "failed", "message": "interrupted", "interrupted": True}


def settle(error: Exception, record: dict[str, Any], hydra_cfg: DictConfig | None) -> None:
    """A recorded failure's exit status: returns only when the job's sweep goes on past it."""
    record_rank_failure(error)
    if isinstance(error, Preempted):  # the whole process is being stopped: the sweep cannot go on either
        requeue(error.signum)
        sys.exit(128 + error.signum)  # the shell's status for a process stopped by that signal
    if is_multirun(hydra_cfg):
        log.error("job %s %s: %s (the sweep goes on)", hydra_cfg.job.num, record["status"], record["message"])
        return  # the Optuna sweeper records a failed trial
    if isinstance(error, SentembConfigError | TrainingDiverged | CheckpointNotWritten):
        sys.exit(f"sentemb: {error}")  # the message says what and how to fix; no traceback
    raise error


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
