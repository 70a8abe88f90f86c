"""Exact resume: `checkpoints/last.ckpt` after every dev evaluation, with what Lightning does not save itself.

Lightning's checkpoint already holds the weights, optimizer, scheduler, loop progress, the
StatefulDataLoader's position (sentemb.data) and every callback's state (ModelCheckpoint's best,
STSBDevEvaluation's dev history). Added here: the global RNG states (dropout's masks), so
`ckpt_path=<run>/checkpoints/last.ckpt` continues exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint

from sentemb.common.errors import SentembConfigError
from sentemb.training.callbacks import STSBDevEvaluation

LAST = "last.ckpt"


def check_checkpoint_path(ckpt_path: str | None) -> None:
    """ckpt_path, when set, must be a checkpoint file."""
    if ckpt_path and not Path(ckpt_path).expanduser().is_file():
        raise SentembConfigError(
            f"ckpt_path={ckpt_path}: no such checkpoint file. Fix: point it at a run's checkpoints/last.ckpt "
            "(written at every dev evaluation), or drop ckpt_path to start fresh"
        )


def checkpoint_dir(ckpt_path: str | None, output_dir: str) -> str:
    """Where a run keeps its checkpoints (the `checkpoint_dir` resolver of conf/callbacks): a resumed run goes on in
    the directory of the checkpoint it resumes from, so ModelCheckpoint's best tracking (which Lightning restores
    only in the same directory) continues as one run."""
    return str(Path(ckpt_path).expanduser().resolve().parent) if ckpt_path else str(Path(output_dir) / "checkpoints")


def rng_states() -> dict[str, Any]:
    """Every global RNG a training step draws from (rank 0's, which every rank shares after seed_everything)."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        # tensors and plain numbers only: checkpoints stay loadable with torch.load(weights_only=True)
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss),
        "python": random.getstate(),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    kind, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    random.setstate(states["python"])


class LastCheckpoint(Checkpoint):
    """`<dirpath>/last.ckpt`, rewritten after each dev evaluation (replaced atomically, never half-written).

    A `Checkpoint`, so Lightning runs it after ModelCheckpoint (checkpoint callbacks go last, in
    their configured order): the file then holds this step's best-checkpoint tracking too.
    """

    def __init__(self, dirpath: str | Path) -> None:
        self.dirpath = Path(dirpath)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        dev = next((c for c in trainer.callbacks if isinstance(c, STSBDevEvaluation)), None)
        if dev is None or not dev.history or dev.history[-1][0] != trainer.global_step:
            return
        partial = self.dirpath / f".{LAST}.partial"
        trainer.save_checkpoint(partial)  # every rank calls it (a barrier); rank 0 writes
        if trainer.is_global_zero:
            os.replace(partial, self.dirpath / LAST)
