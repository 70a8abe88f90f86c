"""Callbacks that interrupt a run on cue, for the preemption, sweep and DDP tests (put in with `+callbacks.x=...`)."""

from __future__ import annotations

import os
import signal

import lightning as L
from hydra.core.hydra_config import HydraConfig


def this_job() -> int | None:
    """The sweep job number of this process (None in a single run)."""
    return HydraConfig.get().job.get("num") if HydraConfig.initialized() else None


class SignalAt(L.Callback):
    """Sends this process `signal` at the end of step `step` (of sweep job `job` only, if given), as SLURM would."""

    def __init__(self, step: int, job: int | None = None, signal: str = "SIGTERM") -> None:
        self.step, self.job, self.signum = step, job, getattr(__import__("signal"), signal)

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step and (self.job is None or self.job == this_job()):
            os.kill(os.getpid(), self.signum)


class SignalAtStart(L.Callback):
    """Sends this process `signal` as training starts, before its first step (the dev evaluation at start is then
    running or about to: the callbacks before this one have run)."""

    def __init__(self, signal: str = "SIGTERM") -> None:
        self.signum = getattr(__import__("signal"), signal)

    def on_train_start(self, trainer: L.Trainer, *args) -> None:
        os.kill(os.getpid(), self.signum)


class FailOnRank(L.Callback):
    """Raises on global rank `rank` only, at step `step` (rank -1: never)."""

    def __init__(self, rank: int, step: int = 1) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"made to fail on rank {self.rank} at step {self.step}")


__all__ = ["SignalAt", "SignalAtStart", "FailOnRank", "signal"]
