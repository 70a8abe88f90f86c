"""A multirun job on several devices: the job launches its own ranks; the sweep is never launched twice.

Lightning's DDP launcher starts rank k>0 by re-running the process's command line, which in a
Hydra multirun is the whole sweep (lightning-hydra-template #393): every rank would run every job
and write every report. Here the sweep runs once; a job that needs several processes starts them
with torch's elastic launcher (torchrun's), each `python -m sentemb.train <this job's overrides>`
in the job's directory. torchrun watches them: when one fails, it stops the others (no rank waits
on a dead peer) and the job is recorded `failed` with the failing rank's message, and the sweep
goes on. Rank 0 writes the job's metrics.json; the job rewrites it with its sweep description.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sentemb.common.errors import Preempted, SentembConfigError, TrainingDiverged
from sentemb.runs.jobs import is_multirun, job_overrides, override_key
from sentemb.runs.record import read_record
from sentemb.training.checkpoint_files import run_checkpoints

log = logging.getLogger(__name__)

# keys the job sets for its ranks, replacing the job's own values
RANK_KEYS = ("hydra.run.dir", "hydra.output_subdir", "hydra.job.name", "ddp_worker", "ckpt_path")


def launched_as_rank() -> bool:
    """Started by a launcher as one rank of several (torchrun, Lightning's DDP launcher, a multi-task SLURM job)."""
    env = os.environ
    return "LOCAL_RANK" in env or int(env.get("WORLD_SIZE", 1)) > 1 or int(env.get("SLURM_NTASKS", 1)) > 1


# where a launcher puts the rank, in the order Lightning reads them (lightning.fabric.utilities.rank_zero._get_rank)
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def process_rank() -> int:
    """This process's global rank as its launcher set it (0 when it runs alone): Lightning's own flag (the object
    lightning.pytorch.utilities.rank_zero_only is), read without importing lightning; until lightning sets it on
    import, the launcher's variable Lightning would read."""
    from lightning_utilities.core.rank_zero import rank_zero_only

    rank = getattr(rank_zero_only, "rank", None)
    if rank is not None:
        return int(rank)
    return next((int(os.environ[key]) for key in RANK_VARIABLES if os.environ.get(key) is not None), 0)


def processes_per_node(trainer_cfg: DictConfig) -> int:
    """How many processes `trainer.devices` asks for on one node (1 for a single device)."""
    devices = trainer_cfg.get("devices", 1)
    if isinstance(devices, int) and devices > 0:
        return devices
    if OmegaConf.is_list(devices) or isinstance(devices, list | tuple):
        return len(devices)
    if str(devices).isdigit():
        return int(str(devices))
    if str(devices).replace(",", "").isdigit():  # "0,1": device indices
        return len(str(devices).strip(",").split(","))
    import torch

    gpu = str(trainer_cfg.get("accelerator", "auto")) in ("gpu", "cuda", "auto")
    return max(1, torch.cuda.device_count()) if gpu else 1  # "auto" / -1: what Lightning would pick


def needs_rank_launch(cfg: DictConfig, hydra_cfg: DictConfig | None) -> bool:
    """A sweep job asking for several processes that nobody launched: this job launches them."""
    strategy = str(cfg.trainer.get("strategy", "auto"))
    spawned = "spawn" in strategy or "fork" in strategy  # those start their ranks inside fit(), not from argv
    return is_multirun(hydra_cfg) and not launched_as_rank() and not spawned and processes_per_node(cfg.trainer) > 1


def hydra_quoted(value: Any) -> str:
    """A value as a Hydra override reads it back verbatim (paths with commas or spaces, names with quotes)."""
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def rank_overrides(cfg: DictConfig, hydra_cfg: DictConfig, checkpoint: Path | None) -> list[str]:
    """The job's overrides for its ranks: a single run in the job's directory, resumed from `checkpoint` if set."""
    own = [o for o in job_overrides(hydra_cfg) if override_key(o) not in RANK_KEYS]
    output_dir = Path(cfg.paths.output_dir)
    ranked = [
        f"hydra.run.dir={hydra_quoted(output_dir)}",
        "hydra.output_subdir=null",  # the job wrote .hydra/ already
        "hydra.job.name=rank${local_rank}",  # torchrun fills in each rank's number: rank0.log, rank1.log
        "ddp_worker=true",
        f"ckpt_path={hydra_quoted(checkpoint) if checkpoint else 'null'}",
    ]
    wandb_cfg = (cfg.get("logger") or {}).get("wandb")
    if wandb_cfg:  # the sweep's run name and group, which a rank (a single run) would not know
        ranked += [f"logger.wandb.{key}={hydra_quoted(wandb_cfg[key])}" for key in ("name", "group")]
    return [*own, *ranked]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_ranks(cfg: DictConfig, hydra_cfg: DictConfig, checkpoint: Path | None) -> dict[str, Any]:
    """Run this job on `trainer.devices` local processes; returns rank 0's metrics, or raises the job's failure."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if int(cfg.trainer.get("num_nodes", 1)) > 1:
        raise SentembConfigError(
            "trainer.num_nodes > 1 in a sweep run on this machine: a sweep job starts its ranks on one node. "
            "Fix: launcher=slurm with hydra.launcher.nodes=N (SLURM starts every rank of a job), or num_nodes=1"
        )
    output_dir = Path(cfg.paths.output_dir)
    processes = processes_per_node(cfg.trainer)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=processes,
        run_id=f"sentemb-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,  # a failed job is recorded; a re-run decides what next (sentemb.runs.rerun_policy)
        monitor_interval=0.2,
    )
    log.info("job %s: launching %d processes in %s", hydra_cfg.job.num, processes, output_dir)
    try:
        elastic_launch(config, sys.executable)("-m", "sentemb.train", *rank_overrides(cfg, hydra_cfg, checkpoint))
    except ChildFailedError as err:
        raise_rank_failure(output_dir, err)
    except SignalException as err:  # this process was signalled; torchrun has stopped the ranks (they checkpointed)
        rank0 = read_record(output_dir) or {}
        raise Preempted(int(err.sigval), int(rank0.get("step") or -1), str(run_checkpoints(output_dir))) from err
    rank0 = read_record(output_dir)
    if rank0 is None or rank0["status"] != "ok":
        raise RuntimeError(f"the job's rank 0 finished without an ok record in {output_dir}: {rank0}")
    return rank0["metrics"]


class RankFailed(RuntimeError):
    """One or more ranks of a job failed; the message starts with the first one to fail."""


def raise_rank_failure(output_dir: Path, err: Any) -> None:
    """The job's failure as its ranks left it: rank 0's own record if it diverged or was preempted, else the first
    rank to fail (the others were stopped by torchrun or lost their peer)."""
    rank0 = read_record(output_dir) or {}
    if rank0.get("status") == "diverged":
        raise TrainingDiverged(rank0["message"]) from err
    failures = sorted(err.failures.items(), key=lambda item: item[1].timestamp)
    if rank0.get("status") == "preempted" and all(f.exitcode == 128 + signal.SIGTERM for _, f in failures):
        raise Preempted(int(signal.SIGTERM), int(rank0.get("step") or -1), str(run_checkpoints(output_dir))) from err
    described = [f"rank {rank}: {failure_message(failure)}" for rank, failure in failures]
    raise RankFailed("; ".join(described)) from err


def failure_message(failure: Any) -> str:
    """What a failed rank reported (its error file, written by sentemb.train), else its exit code."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    if not message or "To enable traceback" in str(message):
        return f"exit code {failure.exitcode}"
    return str(message).strip().splitlines()[-1] if "Traceback" in str(message) else str(message)


def record_rank_failure(err: BaseException) -> None:
    """A rank's exception into torchrun's error file, so the job's record names it (no-op outside torchrun)."""
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(err)
