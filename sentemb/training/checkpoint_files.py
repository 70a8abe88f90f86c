"""A run folder's checkpoint files by name and place, torch-free: what the job around a run (sentemb.runs) and the
`checkpoint_dir` resolver need before torch or lightning is imported (sentemb.training.checkpoints writes and reads
the files themselves, and re-exports these names)."""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = "checkpoints"  # a run folder's checkpoint folder
LAST = "last.ckpt"
BEST_FILENAME = "best-step{step}"  # ModelCheckpoint's filename template: best-step<N>.ckpt
PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")


def run_checkpoints(output_dir: str | Path) -> Path:
    """A run folder's checkpoint folder, `<output_dir>/checkpoints`."""
    return Path(output_dir) / CHECKPOINTS


def checkpoint_dir(ckpt_path: str | None, output_dir: str) -> str:
    """Where a run keeps its checkpoints (the `checkpoint_dir` resolver of conf/callbacks): a resumed run goes on in
    the directory of the checkpoint it resumes from, so ModelCheckpoint's best tracking (which Lightning restores
    only in the same directory) continues as one run."""
    return str(Path(ckpt_path).expanduser().resolve().parent) if ckpt_path else str(run_checkpoints(output_dir))


def remove_partial_checkpoints(folder: Path) -> list[Path]:
    """The temporary files of checkpoint writes that never finished (a process killed mid-write: `write_atomically`'s
    and LastCheckpoint's `.<name>.partial`) in `folder`, removed; the job that now holds the folder calls this.
    Never a checkpoint: those are renamed into place whole."""
    found = sorted(folder.glob(".*.partial")) if folder.is_dir() else []
    for path in found:
        path.unlink(missing_ok=True)
    return found
