"""Exact resume: `checkpoints/last.ckpt` after every dev evaluation, with what Lightning does not save itself.

Lightning's checkpoint already holds the weights, optimizer, scheduler, loop progress, the
StatefulDataLoader's position (sentemb.data) and every callback's state (ModelCheckpoint's best,
STSBDevEvaluation's dev history). Added here: the global RNG states (dropout's masks), so
`ckpt_path=<run>/checkpoints/last.ckpt` continues exactly as the uninterrupted run would have.

A preemption signal (SIGTERM, SIGUSR1, SIGUSR2: what SLURM and submitit send before a kill) is
noted by its handler and acted on at the end of the step: last.ckpt is written for that step and
`Preempted` stops the run (sentemb.runs.job_outcome records it and requeues; a re-run resumes it).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Checkpoint

from sentemb.common.errors import Preempted, SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.encoders.build import check_checkpoint_parts
from sentemb.encoders.checkpoint import read_checkpoint
from sentemb.training.callbacks import STSBDevEvaluation
from sentemb.training.distributed import world_size

log = logging.getLogger(__name__)

LAST = "last.ckpt"


def check_checkpoint_path(ckpt_path: str | None, cfg: Mapping[str, Any] | None = None, key: str = "ckpt_path") -> None:
    """ckpt_path, when set: a whole sentemb checkpoint (read with its tensors left on disk, nothing in it run) of the
    model, pooling and head that `cfg` builds, all before any corpus is read or model built."""
    if not ckpt_path:
        return
    checkpoint = read_checkpoint(ckpt_path, key=key, mmap=True)
    # without cfg: the file and its parts alone
    parts = ("model", "pooling", "head", "adapter") if cfg is not None else ()
    asked = {part: resolved_container(cfg.get(part)) for part in parts}
    fix = (
        "resume with the run's own model=, pooling=, head= and adapter= (its .hydra/overrides.yaml), or start a new run"
    )
    check_checkpoint_parts(checkpoint["hyper_parameters"], asked, ckpt_path, key or "ckpt_path", fix)


def checkpoint_dir(ckpt_path: str | None, output_dir: str) -> str:
    """Where a run keeps its checkpoints (the `checkpoint_dir` resolver of conf/callbacks): a resumed run goes on in
    the directory of the checkpoint it resumes from, so ModelCheckpoint's best tracking (which Lightning restores
    only in the same directory) continues as one run."""
    return str(Path(ckpt_path).expanduser().resolve().parent) if ckpt_path else str(Path(output_dir) / "checkpoints")


def rng_states() -> dict[str, Any]:
    """Every global RNG a training step draws from: rank 0's, and under several processes every rank's as `ranks`.

    The ranks start from one seed (seed_everything) but part ways at their first dropout on CPU (nn.Dropout draws
    a number per element, and each rank's batch has its own token count): each resumes with its own. Gathered from
    every rank, so every rank calls this (Lightning saves a checkpoint on all of them).
    """
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    own = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        # tensors and plain numbers only: checkpoints stay loadable with torch.load(weights_only=True)
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss),
        "python": random.getstate(),
    }
    if world_size() == 1:
        return own
    ranks: list[Any] = [None] * world_size()
    dist.all_gather_object(ranks, own)
    return {**ranks[0], "ranks": ranks}


def set_rng_states(states: dict[str, Any]) -> None:
    """This rank's saved states (rank 0's where the checkpoint holds no per-rank states or another world size's)."""
    ranks = states.get("ranks")
    if ranks is not None and len(ranks) == world_size() > 1:
        states = ranks[dist.get_rank()]
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    kind, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    random.setstate(states["python"])


PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")


class LastCheckpoint(Checkpoint):
    """`<dirpath>/last.ckpt`, rewritten after each dev evaluation and when a preemption signal arrives (replaced
    atomically, never half-written).

    A `Checkpoint`, so Lightning runs it after ModelCheckpoint (checkpoint callbacks go last, in
    their configured order): the file then holds this step's best-checkpoint tracking too. Its
    signal handlers replace Lightning's while training runs (Lightning's SIGTERM handler broadcasts
    from inside the handler) and are restored after.
    """

    def __init__(self, dirpath: str | Path, signals: list[str] | tuple[str, ...] = PREEMPTION_SIGNALS) -> None:
        unknown = [name for name in signals if not isinstance(getattr(signal, str(name), None), signal.Signals)]
        if unknown:
            raise SentembConfigError(
                f"callbacks.last_checkpoint.signals: {unknown} are not signal names. Fix: use names such as "
                f"{list(PREEMPTION_SIGNALS)}"
            )
        self.dirpath = Path(dirpath)
        self.signals = [getattr(signal, str(name)) for name in signals]
        self.received: int | None = None  # set by the handler only; acted on at the end of a step
        self.preempted: Preempted | None = None  # the fit stopped for a preemption signal
        self._previous: dict[int, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.received, self.preempted = None, None
        if threading.current_thread() is threading.main_thread():  # Python allows handlers there only
            self._previous = {signum: signal.signal(signum, self._note) for signum in self.signals}

    def _note(self, signum: int, frame: Any) -> None:
        self.received = self.received or signum  # no work in a handler: the step may be mid-way

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        dev = next((c for c in trainer.callbacks if isinstance(c, STSBDevEvaluation)), None)
        evaluated = dev is not None and bool(dev.history) and dev.history[-1][0] == trainer.global_step
        received = self.received is not None
        if trainer.world_size > 1:  # every rank stops at the same step, whichever rank the signal reached
            received = trainer.strategy.reduce_boolean_decision(received, all=False)
        if evaluated or received:
            self.save(trainer)
        if received:  # Lightning ends the fit after this step's logging; `raise_if_preempted` then stops the job
            signum = self.received or int(signal.SIGTERM)  # another rank's signal: SLURM sends TERM to all
            self.preempted = Preempted(signum, trainer.global_step, str(self.dirpath / LAST))
            trainer.should_stop = True
            log.warning("%s: stopping", self.preempted)

    def save(self, trainer: L.Trainer) -> None:
        partial = self.dirpath / f".{LAST}.partial"
        # the whole state, not the weights alone (said, so Lightning logs no default); a barrier: rank 0 writes
        trainer.save_checkpoint(partial, False)
        if trainer.is_global_zero:
            os.replace(partial, self.dirpath / LAST)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.restore_handlers()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.restore_handlers()

    def restore_handlers(self) -> None:
        """Lightning's handlers back, before Lightning's teardown puts back the ones it found."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


def raise_if_preempted(trainer: L.Trainer) -> None:
    """After `fit`: a fit that a preemption signal stopped raises `Preempted` (not scored, recorded as preempted)."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, LastCheckpoint) and callback.preempted is not None:
            raise callback.preempted
