"""Weights & Biases for training jobs: the online server's check, a job's run name and group, finishing its run.

Whether W&B logs online at all is decided in sentemb.common.wandb_mode.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import getproxies, proxy_bypass

from sentemb.common.errors import SentembConfigError
from sentemb.common.published_files import publish_text
from sentemb.common.wandb_mode import wandb_mode
from sentemb.runs.jobs import current_hydra, is_multirun, job_overrides, short_name, swept_keys

WANDB_SERVER = "https://api.wandb.ai"  # wandb's default; WANDB_BASE_URL names a self-hosted one


def check_wandb_reachable(cfg_logger: Mapping[str, Any] | None, timeout: float = 3.0) -> None:
    """A W&B logger that logs online needs its server: one TCP probe (`timeout` s), else a SentembConfigError.

    Without it the job loads the model, then wandb.init retries for ~2 minutes and fails with a raw CommError.
    Offline loggers (the default without W&B configured) are not probed.
    """
    for name, node in (cfg_logger or {}).items():
        if not node or not str(node.get("_target_", "")).endswith("WandbLogger"):
            continue
        mode = node.get("mode") or wandb_mode()  # null: wandb decides from the environment, as wandb_mode does
        if str(mode) != "online":
            continue
        url = os.environ.get("WANDB_BASE_URL") or WANDB_SERVER
        host, port = probe_address(url)
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as err:
            raise SentembConfigError(
                f"logger.{name} logs online ({online_reason(name, node.get('mode'))}) but the W&B server "
                f"({host}:{port}) does not answer: {str(err) or type(err).__name__}; the job would fail after ~2 "
                "minutes of retries. Fix: WANDB_MODE=offline (the run is kept under the run directory's wandb/; "
                "`wandb sync <that folder>` uploads it later), or logger=csv, or check the network / WANDB_BASE_URL"
            ) from None


def probe_address(url: str) -> tuple[str, int]:
    """The (host, port) a connection to `url` opens first: its proxy's if the environment sets one for it."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    proxy = getproxies().get(parsed.scheme) if host and not proxy_bypass(host) else None
    if proxy:
        parsed = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        host = parsed.hostname or host
    return host, parsed.port or (80 if parsed.scheme == "http" else 443)


def online_reason(name: str, mode: Any) -> str:
    """Why logger.<name> is online, naming the setting (never the API key's value)."""
    if os.environ.get("WANDB_MODE", "").lower() in ("online", "run"):
        return "WANDB_MODE=online"
    if os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
        return "WANDB_API_KEY is set and WANDB_MODE is not"
    return f"logger.{name}.mode={mode}"


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
    if not os.path.lexists(path):  # W&B takes any [a-z0-9] id; it makes 8-character ones
        with contextlib.suppress(FileExistsError):  # made meanwhile (or a link planted there): read below, as found
            publish_text(path, uuid.uuid4().hex[:12] + "\n", replace=False)
    try:  # a link there is refused: the id is this run's own file, not one read elsewhere (nor a huge one read whole)
        run_id = "<a link>" if path.is_symlink() else read_head(path).strip()
    except OSError as err:
        run_id = f"<unreadable: {err.strerror}>"
    if not RUN_ID.fullmatch(run_id):  # read from a file: an id, nothing else reaches wandb.init
        raise SentembConfigError(
            f"{path}: {run_id[:40]!r} is not a W&B run id (letters and digits, 1-64). Fix: delete the file (the run "
            "then logs to a new W&B run) or restore it"
        )
    return run_id


RUN_ID = re.compile(r"[A-Za-z0-9]{1,64}")


def read_head(path: Path) -> str:
    """The first bytes of `path` as text: an id is at most 64 characters, a longer file is refused as it is."""
    with path.open("rb") as handle:
        return handle.read(128).decode("utf-8", errors="replace")


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
