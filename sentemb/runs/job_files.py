"""What an accepted job writes into its run directory besides its record: Hydra's .hydra/ files and its log.

conf/train.yaml turns both off in Hydra (which would write them before the job decides whether it
runs at all), so a refused or skipped job changes no byte of a finished run's directory; the job
writes them here once it is accepted (sentemb.runs.lifecycle). conf/eval.yaml and conf/export.yaml turn
them off too: sentemb.evaluate and sentemb.export write theirs here (`command_folder`), under the folder's
lock and under their own names (`.hydra/evaluate/`, `.hydra/export/`), so that an evaluation in a training
run's folder never replaces the training's `.hydra/` files.

Nothing here, Hydra or a logger writes through a link it did not make: a folder they write into below a
run directory (`.hydra`, `checkpoints`, `csv`, `wandb`, ...) that is a symbolic link, or not a folder, is
refused before anything is written (`check_folders`), since `mkdir(exist_ok=True)` accepts a link.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from omegaconf import DictConfig, OmegaConf

from sentemb.common.errors import SentembConfigError
from sentemb.common.folder_lock import FolderLock, take_folder_lock
from sentemb.common.published_files import open_for_append, publish_text

HYDRA_SUBDIR = ".hydra"  # where Hydra's run_job would save the job's config (its hydra.output_subdir default)
HYDRA_LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's default job_logging format


def save_hydra_files(
    cfg: DictConfig, hydra_cfg: DictConfig | None, output_dir: Path, subdir: str = HYDRA_SUBDIR
) -> None:
    """<run>/<subdir>/{config,hydra,overrides}.yaml as Hydra's run_job writes them (hydra.core.utils._save_config).

    conf/train.yaml sets hydra.output_subdir: null, since Hydra writes them before the job runs, over a finished
    run's files even when the job is then refused; a user's own hydra.output_subdir means Hydra wrote them already.
    """
    if hydra_cfg is None or hydra_cfg.get("output_subdir") is not None:
        return
    task_cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    files = {
        "config.yaml": task_cfg,
        "hydra.yaml": OmegaConf.create({"hydra": hydra_cfg}),
        "overrides.yaml": hydra_cfg.overrides.task,
    }
    folder = output_dir / subdir
    folder.mkdir(parents=True, exist_ok=True)
    for name, node in files.items():
        publish_text(folder / name, OmegaConf.to_yaml(node))


class JobLogHandler(logging.FileHandler):
    """Hydra's file handler, its file opened without following a link (a link at the log's name is refused)."""

    def _open(self) -> IO[str]:
        return open_for_append(Path(self.baseFilename), self.encoding or "utf-8")


@contextmanager
def job_log(output_dir: Path, hydra_cfg: DictConfig | None) -> Iterator[None]:
    """Hydra's `<job name>.log` in the run directory, for the accepted job only (conf/train.yaml's job_logging has
    no file handler, so a refused command appends nothing); removed at the end: a multirun runs its jobs in one
    process."""
    path = Path(os.path.abspath(output_dir / f"{hydra_cfg.job.name}.log")) if hydra_cfg is not None else None
    root = logging.getLogger()
    opened = [h for h in root.handlers if isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path]
    if path is None or opened:  # outside Hydra, or hydra/job_logging=default: Hydra opened it already
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)  # Hydra made it already; a direct call of run_job may not have
    try:
        handler = JobLogHandler(path, encoding="utf-8")
    except OSError as err:  # a link (ELOOP), a folder or a FIFO at the log's name: refused, never followed
        raise SentembConfigError(
            f"{path}: the job's log cannot be opened to append ({err.strerror}): it is not a regular file (a symbolic "
            "link is refused, never written through). Fix: remove it; the job makes its log itself"
        ) from None
    fmt = OmegaConf.select(hydra_cfg, "job_logging.formatters.simple.format", default=HYDRA_LOG_FORMAT)
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def check_folders(root: Path, folders: Mapping[Path, str]) -> None:
    """Each folder in `folders` (its path: who writes there), and every folder between `root` and it, absent or a
    real folder: a symbolic link (which mkdir(exist_ok=True), Hydra and the loggers follow) or a file is refused,
    naming it, before anything is written."""
    for folder, writer in folders.items():
        inside = Path(os.path.relpath(os.path.abspath(folder), os.path.abspath(root))).parts
        steps = [root.joinpath(*inside[:n]) for n in range(1, len(inside) + 1)] if ".." not in inside else [folder]
        for path in steps:
            what = not_a_folder(path)
            if what:
                raise SentembConfigError(
                    f"{path} is {what}: {writer} writes into it, and sentemb never writes through a link it did not "
                    f"make nor over a file; nothing was written. Fix: remove it (rm {shlex.quote(str(path))}): "
                    "sentemb makes the folder itself; or pass another hydra.run.dir"
                )


def not_a_folder(path: Path) -> str:
    """What stands at `path` where a folder should be, in words ('' for a real folder or nothing)."""
    if path.is_symlink():
        return f"a symbolic link (to {os.readlink(path)})"
    if path.exists() and not path.is_dir():
        return "a file, not a folder"
    return ""


def logger_folders(loggers: Mapping[str, DictConfig] | None) -> dict[Path, str]:
    """The folders a training's loggers write into: each one's save_dir and what it makes there (W&B: `wandb/`;
    CSV, TensorBoard: `<name>/`)."""
    folders: dict[Path, str] = {}
    for key, node in (loggers or {}).items():
        if not node or not node.get("save_dir"):
            continue
        save_dir = Path(str(node.save_dir))
        folders[save_dir] = f"logger.{key}"
        inner = "wandb" if str(node.get("_target_", "")).endswith("WandbLogger") else node.get("name")
        if inner:
            folders[save_dir / str(inner)] = f"logger.{key}"
    return folders


@contextmanager
def command_folder(
    cfg: DictConfig, hydra_cfg: DictConfig, command: str, folders: Iterable[str] = (), fix: str = ""
) -> Iterator[FolderLock]:
    """The run folder of a command other than training (sentemb.evaluate, sentemb.export: Hydra's output dir), for
    the command's duration: its lock taken (a folder a live command writes in is refused, naming it, before
    anything is written), `folders` (relative: what the command writes into) and its own `.hydra/<command>/`
    checked, its Hydra files written there and its `<command>.log` opened. The lock file goes at the end if this
    command made it; a lock file it found (a training run's) gets back what it held."""
    output_dir = Path(str(hydra_cfg.runtime.output_dir))
    output_dir.mkdir(parents=True, exist_ok=True)  # Hydra has made it already; the lock file lives in it
    own = f"{HYDRA_SUBDIR}/{command}"
    lock = take_folder_lock(output_dir, f"hydra.run.dir={output_dir}", fix or "wait for it to finish, or pass "
                            "another hydra.run.dir=...")  # fmt: skip
    try:
        check_folders(output_dir, {output_dir / name: f"sentemb.{command}" for name in (own, *folders)})
        lock.claim()
        save_hydra_files(cfg, hydra_cfg, output_dir, own)
        with job_log(output_dir, hydra_cfg):
            yield lock
    finally:
        lock.release(remove=lock.created, restore=True)
