"""What an accepted job writes into its run directory besides its record: Hydra's .hydra/ files and its log.

conf/train.yaml turns both off in Hydra (which would write them before the job decides whether it
runs at all), so a refused or skipped job changes no byte of a finished run's directory; the job
writes them here once it is accepted (sentemb.runs.lifecycle).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from omegaconf import DictConfig, OmegaConf

from sentemb.common.errors import SentembConfigError
from sentemb.common.published_files import open_for_append, publish_text

HYDRA_SUBDIR = ".hydra"  # where Hydra's run_job would save the job's config (its hydra.output_subdir default)
HYDRA_LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's default job_logging format


def save_hydra_files(cfg: DictConfig, hydra_cfg: DictConfig | None, output_dir: Path) -> None:
    """<run>/.hydra/{config,hydra,overrides}.yaml as Hydra's run_job writes them (hydra.core.utils._save_config).

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
    folder = output_dir / HYDRA_SUBDIR
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
