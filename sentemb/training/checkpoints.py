"""Checkpoint writing, in one place: what a checkpoint holds, its names, its folder, its atomic write, its FSDP form.

A run's checkpoints live in `<run>/checkpoints/` (`run_checkpoints`; a resumed run goes on beside
the checkpoint it resumed from: `checkpoint_dir`, the resolver conf/callbacks uses):

- `best-step<N>.ckpt`: the best STS-B dev score so far (`BestCheckpoint`, callbacks=default's model_checkpoint);
- `last.ckpt` (`LAST`): rewritten after every dev evaluation and at a preemption signal (`LastCheckpoint`), what
  `ckpt_path=` and auto-resume continue exactly from.

Lightning's checkpoint already holds the weights, optimizer, scheduler, loop progress, the
StatefulDataLoader's position (sentemb.data) and every callback's state (BestCheckpoint's best,
STSBDevEvaluation's dev history). `CheckpointContents` (SentembModule's hooks) adds the global
RNG states (dropout's masks), so `ckpt_path=<run>/checkpoints/last.ckpt` continues exactly as
the uninterrupted run would have, and keeps an adapter run's trained weights only; and where its
scores were computed (`run_environment`), which a rescore's warning compares with its own.

A checkpoint may move (a run folder copied or moved, a last.ckpt copied): BestCheckpoint maps the
files its best tracking names into the folder the run now goes on in (`moved_tracking`), and the
pre-run check refuses a checkpoint whose best file is not beside it (`check_best_tracking`).

A preemption signal (SIGTERM, SIGUSR1, SIGUSR2: what SLURM and submitit send before a kill) is
noted by its handler and acted on at the end of the step: last.ckpt is written for that step and
`Preempted` stops the run (sentemb.runs.job_outcome records it and requeues; a re-run resumes it).

Every file is written whole or not at all (`AtomicCheckpointIO`: a temporary name, fsync, a
rename); trainer=fsdp gathers its checkpoint into one such file on rank 0 (`GatheredCheckpoints`).
Reading checkpoints is sentemb.encoders.checkpoint's.
"""

from __future__ import annotations

import errno
import io
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
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import nn

from sentemb.common.errors import CheckpointNotWritten, Preempted, SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.common.metric_names import DEV_SETS, DEV_SPEARMAN
from sentemb.common.published_files import publish_bytes
from sentemb.encoders.build import check_base_fingerprint, check_checkpoint_parts
from sentemb.encoders.checkpoint import model_label, read_checkpoint
from sentemb.encoders.models.adapters import base_fingerprint
from sentemb.training.callbacks import STSBDevEvaluation
from sentemb.training.checkpoint_files import (  # noqa: F401 - names of the run folder's files, kept importable here
    BEST_FILENAME,
    CHECKPOINTS,
    LAST,
    PREEMPTION_SIGNALS,
    checkpoint_dir,
    remove_partial_checkpoints,
    run_checkpoints,
)
from sentemb.training.distributed import world_size

log = logging.getLogger(__name__)

# state-dict keys of a module's own state (torch's get_extra_state / set_extra_state), `<module>._extra_state`
EXTRA_STATE = "_extra_state"
BACKBONE = "encoder.backbone."  # the pretrained (or adapted) model's keys in SentembModule's state dict


def check_checkpoint_path(
    ckpt_path: str | None, cfg: Mapping[str, Any] | None = None, key: str = "ckpt_path"
) -> dict[str, Any] | None:
    """ckpt_path, when set: a whole sentemb checkpoint (read with its tensors left on disk, nothing in it run) of the
    model, pooling and head that `cfg` builds, all before any corpus is read or model built. Returns what it read
    (None without ckpt_path), so later checks of the same file need not read and CRC-check it again."""
    if not ckpt_path:
        return None
    checkpoint = read_checkpoint(ckpt_path, key=key, mmap=True)
    # without cfg: the file and its parts alone
    parts = ("model", "pooling", "head", "adapter") if cfg is not None else ()
    asked = {part: resolved_container(cfg.get(part)) for part in parts}
    fix = (
        "resume with the run's own model=, pooling=, head= and adapter= (its .hydra/overrides.yaml), or start a new run"
    )
    check_checkpoint_parts(checkpoint["hyper_parameters"], asked, ckpt_path, key or "ckpt_path", fix)
    check_best_tracking(checkpoint, ckpt_path, f"{key}={ckpt_path}" if key else str(ckpt_path))
    return checkpoint


# ---- what a checkpoint holds ----


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


ENVIRONMENT = "environment"  # a checkpoint's key: `run_environment` as it was saved


def run_environment(device: torch.device) -> dict[str, Any]:
    """What a float computation's last bits depend on besides its weights and inputs: the device, the CPU threads
    (how sums are split), torch's version and the CPU kernels it dispatches to (ATEN_CPU_CAPABILITY)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return {
        "device": name,
        "threads": torch.get_num_threads(),
        "torch": str(torch.__version__),  # a str subclass torch would pickle as its own class
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
    }


def environment_differences(saved: Mapping[str, Any] | None, now: Mapping[str, Any]) -> list[str] | None:
    """`key saved -> now` for each entry of `run_environment` that differs (None: the checkpoint records none)."""
    if not isinstance(saved, Mapping):
        return None
    return [f"{key} {saved.get(key)} -> {value}" for key, value in now.items() if saved.get(key) != value]


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


class CheckpointContents:
    """What a SentembModule checkpoint holds beyond Lightning's own, and the checks of a checkpoint loaded into it.

    Mixed into the LightningModule (`class SentembModule(CheckpointContents, L.LightningModule)`); it reads only
    `strict_loading`, `encoder`, `hparams.model` and `_trainer`.

    - **RNG streams**: `rng_states`, every rank's own under several processes (`rng_states()`); a resumed fit sets
      them back (not a load for evaluation), so its dropout masks are the uninterrupted run's.
    - **An adapter run** (`strict_loading` False: a LoRA backbone): the state dict is cut to `trained_keys()`, the
      base model is rebuilt from its name at load, and `base_model` (its label and config fingerprint) says which
      base the weights go with; loading refuses another base and a checkpoint lacking a trained key.
    - **Every part's own state**: a pooling, head or loss submodule that must carry state across a resume declares
      it the torch way, as a persistent buffer (`register_buffer`) or with `get_extra_state` / `set_extra_state`
      (the `<module>._extra_state` key). Full runs save the whole state dict; an adapter run's `trained_keys` keep
      every persistent buffer outside `encoder.backbone.` and every `_extra_state`, so such state is saved,
      restored and resumed with nothing to add here. Non-persistent buffers are rebuilt by their module, not saved.
    """

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_states"] = rng_states()  # resumes draw the dropout masks the uninterrupted run would have
        # where its dev scores were computed: a rescore elsewhere may differ in the last bits, and says which differs
        checkpoint[ENVIRONMENT] = run_environment(self.device)
        if not self.strict_loading:  # adapter run: the trained weights only, and which base they go with
            kept = self.trained_keys()
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in kept}
            checkpoint["base_model"] = {
                "name": model_label(self.hparams.model),
                "config_sha256": base_fingerprint(self.encoder.backbone),
            }

    def trained_keys(self) -> set[str]:
        """State-dict keys of what this run changes: trainable parameters, every persistent buffer outside the
        backbone, and every module's extra state (`get_extra_state`)."""
        keys = {name for name, p in self.named_parameters() if p.requires_grad}
        keys |= {name for name in persistent_buffers(self) if not name.startswith(BACKBONE)}
        # a negatives part's own copies of trained weights (a momentum encoder: ξ's copies of the adapter's weights)
        for prefix, owner in self.named_modules():
            if isinstance(owner, KeepsTrainedCopies):
                keys |= {f"{prefix}.{name}" if prefix else name for name in owner.saved_with_adapter()}
        return keys | extra_state_keys(self)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if not self.strict_loading:  # an adapter checkpoint must hold every trained weight (the rest is the base)
            named = f"ckpt_path={self.trainer.ckpt_path}" if self._trainer is not None else "the checkpoint"
            check_base_fingerprint(checkpoint, self.encoder.backbone, named)
            missing = sorted(self.trained_keys() - set(checkpoint["state_dict"]))
            if missing:
                raise SentembConfigError(
                    f"the checkpoint lacks {len(missing)} trained weights of this run (e.g. {missing[0]}): it was "
                    "written with another adapter, pooling or head. Fix: resume with the run's own config"
                )
        if self._trainer is not None and "rng_states" in checkpoint:  # resuming a fit, not loading for evaluation
            set_rng_states(checkpoint["rng_states"])


class KeepsTrainedCopies:
    """A part that holds copies of trained weights of its own (a negatives part's momentum encoder): an adapter run's
    checkpoint keeps the keys it names (`saved_with_adapter`) beside the trained weights."""

    def saved_with_adapter(self) -> set[str]:
        """State-dict keys (relative to the part) an adapter run's checkpoint keeps: none by default."""
        return set()


def persistent_buffers(module: nn.Module) -> list[str]:
    """The state-dict keys of `module`'s buffers (each once), the non-persistent ones left out as torch leaves them
    out of a state dict."""
    return [
        f"{prefix}.{name}" if prefix else name
        for prefix, owner in module.named_modules()
        for name, buffer in owner.named_buffers(recurse=False)
        if buffer is not None and name not in owner._non_persistent_buffers_set
    ]


def extra_state_keys(module: nn.Module) -> set[str]:
    """The `_extra_state` state-dict keys of `module`: one per submodule whose class defines `get_extra_state`
    (torch's own test in `nn.Module._save_to_state_dict`)."""
    return {
        f"{prefix}.{EXTRA_STATE}" if prefix else EXTRA_STATE
        for prefix, owner in module.named_modules()
        if getattr(type(owner), "get_extra_state", nn.Module.get_extra_state) is not nn.Module.get_extra_state
    }


# ---- the callbacks that write checkpoints ----


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint keeping the best STS-B dev score: `best-step<N>.ckpt`, monitoring DEV_SPEARMAN
    (max). `monitor` may name a dev set as eval.select does (conf/callbacks/default.yaml: ${eval.select}): that set's
    Spearman is monitored (stsb_dev: DEV_SPEARMAN, sickr_dev: sickr/dev/spearman). Every other ModelCheckpoint
    argument (save_top_k, every_n_train_steps, save_on_train_epoch_end, ...) is passed on; its state in a checkpoint
    is ModelCheckpoint's, under ModelCheckpoint's key (`state_key`)."""

    def __init__(
        self,
        dirpath: str | Path | None = None,
        *,
        filename: str = BEST_FILENAME,
        monitor: str = DEV_SPEARMAN,
        mode: str = "max",
        auto_insert_metric_name: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=DEV_SETS[monitor].spearman if monitor in DEV_SETS else monitor,
            mode=mode,
            auto_insert_metric_name=auto_insert_metric_name,
            **kwargs,
        )

    @property
    def state_key(self) -> str:
        # ModelCheckpoint's own key: checkpoints written with a plain ModelCheckpoint resume their best tracking
        return ModelCheckpoint.__qualname__ + super().state_key.removeprefix(type(self).__qualname__)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """ModelCheckpoint's saved state with its files mapped into this run's checkpoint folder (`moved_tracking`):
        a run copied elsewhere (`cp -a run run2`), or resumed from a copied last.ckpt, goes on with the best score,
        step and file the uninterrupted run has. Lightning restores them only where the folder's path is the same
        (it warns "dirpath has changed" and forgets the best score, so the next dev score became the 'best' whatever
        it was); the pre-run check (`check_best_tracking`) has made sure the files are here."""
        super().load_state_dict(moved_tracking(state_dict, self.dirpath))


TRACKED_FILES = ("best_model_path", "kth_best_model_path", "last_model_path")  # ModelCheckpoint's state's files


def moved_tracking(state: Mapping[str, Any], dirpath: str | Path | None) -> dict[str, Any]:
    """ModelCheckpoint's saved state with each file it tracks (the best, the k best with their scores, the last)
    renamed into `dirpath` (a file of the folder the state was saved in keeps its name there), and `dirpath` as its
    folder; as saved where the folder is the same (or no folder is known)."""
    saved = state.get("dirpath")
    if dirpath is None or saved is None or Path(saved) == Path(dirpath):
        return dict(state)

    def moved(path: str) -> str:
        return str(Path(dirpath) / Path(path).name) if path and Path(path).parent == Path(saved) else path

    files = {key: moved(state[key]) for key in TRACKED_FILES if isinstance(state.get(key), str)}
    best_k = {moved(path): score for path, score in (state.get("best_k_models") or {}).items()}
    return {**state, **files, "best_k_models": best_k, "dirpath": str(dirpath)}


def check_best_tracking(checkpoint: Mapping[str, Any], ckpt_path: str, named: str) -> None:
    """A resumed run's best-checkpoint tracking can go on where the checkpoint now lives (its folder, where the run's
    checkpoints go on: `checkpoint_dir`): every file its ModelCheckpoint state keeps as a best is there, under its
    name. Else refused before anything loads: resumed without it, the run would forget its best score, keep the next
    dev score's weights as the best whatever it was, and report the best logged step's score beside another step's
    weights."""
    folder = Path(checkpoint_dir(ckpt_path, "."))
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if not str(key).startswith(ModelCheckpoint.__qualname__) or not isinstance(state, Mapping):
            continue
        moved = moved_tracking(state, folder)
        kept = [*(moved.get("best_k_models") or {}), moved.get("best_model_path") or ""]
        missing = next((Path(path) for path in kept if path and not Path(path).is_file()), None)
        if missing is not None:
            original = Path(state.get("dirpath") or folder) / missing.name
            raise SentembConfigError(
                f"{named}: the run it continues keeps {missing.name} as its best checkpoint (monitoring "
                f"{state.get('monitor')}), and {folder}, where this run's checkpoints go on, has no such file: resumed "
                "without it, the run would forget its best score and report a later step's weights as the best. "
                f"Fix: copy {missing.name} beside the checkpoint (it was written as {original}), or resume the run "
                "folder it came from"
            )


def best_checkpoint_callback(trainer: L.Trainer, monitor: str = DEV_SPEARMAN) -> ModelCheckpoint | None:
    """The ModelCheckpoint that keeps the best `monitor` score (the selecting dev set's Spearman; callbacks=default's
    model_checkpoint), or None."""
    return next(
        (c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.monitor == monitor), None
    )


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


# ---- the write ----


class AtomicCheckpointIO(TorchCheckpointIO):
    """Every checkpoint a run writes (best-step*.ckpt, last.ckpt; trainer=fsdp's file gathered on rank 0 too) is
    whole or absent: written under a temporary name in its folder, then renamed over the target.

    Lightning writes the target itself, so a full disk left a truncated best-step*.ckpt that nothing removed; a
    failed write here removes its temporary file and raises `CheckpointNotWritten`, naming the file and the fix.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):  # remote storage: Lightning's fsspec transaction
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        write_atomically(checkpoint, Path(path))


def checkpoint_plugins() -> list[Any]:
    """The Trainer plugins of sentemb's checkpoint writes (build_trainer's default `plugins`): the atomic write."""
    return [AtomicCheckpointIO()]


def write_atomically(checkpoint: dict[str, Any], path: Path) -> None:
    """`checkpoint` at `path`, replaced in one rename; on failure no file is left and the target is untouched."""
    buffer = io.BytesIO()
    # serialised first, as Lightning does: torch.save into a file turns the OSError of a failed write into an
    # errno-less RuntimeError
    torch.save(checkpoint, buffer)
    try:  # fsynced (a delayed ENOSPC is reported before the rename), renamed over the target, never written through a
        publish_bytes(path, buffer.getbuffer())  # link; its temporary file goes on failure (published_files)
    except OSError as err:
        raise CheckpointNotWritten(checkpoint_error(path, err)) from err


def checkpoint_error(path: Path, err: OSError) -> str:
    """The message of a checkpoint that could not be written: the file, the system's reason, the fix."""
    reason = err.strerror or str(err)
    code = f" ({errno.errorcode[err.errno]})" if err.errno in errno.errorcode else ""
    return (
        f"could not write the checkpoint {path}: {reason}{code}; no partial file was left and the previous "
        f"checkpoints are untouched. Fix: free space in {path.parent} (`df -h {path.parent}`; or raise the quota, "
        "or the folder's permissions), or run with hydra.run.dir=<a folder on a disk with room> (checkpoints go "
        "to its checkpoints/)"
    )


# ---- trainer=fsdp ----


class GatheredCheckpoints:
    """The checkpoints of a sharded strategy (mixed in before Lightning's ModelParallelStrategy: sentemb.training.
    sharding.FullyShardedStrategy) as one file gathered on rank 0, written by `AtomicCheckpointIO` as any other, so
    `read_checkpoint`, evaluation, export and exact resume read it as they read any other; and the resume of such a
    file into the shards."""

    # Lightning's save_distributed_checkpoint: False, one file gathered on rank 0 (not a folder of per-rank shards)
    distributed_checkpoint = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, save_distributed_checkpoint=self.distributed_checkpoint, **kwargs)

    def load_checkpoint(self, checkpoint_path: str | Path, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's load into the shards, after the strategy's setup (the weights load into the shards).

        By then Lightning has built the training loader (for configure_optimizers' estimated_stepping_batches) and
        iterated it once, and a loader's saved position is restored only where it is built (Lightning issue 20550):
        the loader is dropped here, so the fit loop builds it again after this restore, at the run's position (the
        datamodule's and the loader's own state). The file's weights go back in the returned checkpoint: Lightning
        pops them, and `CheckpointContents` checks an adapter checkpoint's keys there.
        """
        trainer = self.lightning_module.trainer
        trainer.fit_loop._combined_loader = None
        path = Path(self.broadcast(checkpoint_path))
        checkpoint = super().load_checkpoint(path, weights_only)
        if "state_dict" not in checkpoint and path.is_file():  # mmap: the tensors stay on disk
            state = torch.load(path, mmap=True, map_location="cpu", weights_only=weights_only)
            checkpoint["state_dict"] = state["state_dict"]
        return checkpoint
