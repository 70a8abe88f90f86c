"""OmegaConf resolvers used by conf/, and the checks that run before anything expensive."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from sentemb.data import CorpusReport, check_corpus
from sentemb.encoders.backbones import check_model_source, packaged_model_path
from sentemb.encoders.prompt import check_template
from sentemb.errors import SentembConfigError
from sentemb.paths import resolve_data_root

log = logging.getLogger(__name__)


def wandb_offline() -> bool:
    """Offline unless the user configured W&B online (WANDB_MODE=online, or an API key in the environment)."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode in ("online", "run"):
        return False
    if mode in ("offline", "dryrun", "disabled"):
        return True
    return not os.environ.get("WANDB_API_KEY")


def wandb_mode() -> str:
    """wandb.init's mode, passed explicitly: wandb reads the environment only when its process singleton starts."""
    return "offline" if wandb_offline() else "online"


def sqlite_storage(directory: str) -> str:
    """An Optuna sqlite URL in `directory`, created now: the sweeper opens it before Hydra makes the sweep dir."""
    folder = Path(directory).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'optuna.db'}"


def checkpoint_dir(ckpt_path: str | None, output_dir: str) -> str:
    """Where a run keeps its checkpoints: a resumed run goes on in the directory of the checkpoint it resumes from,
    so ModelCheckpoint's best tracking (which Lightning restores only in the same directory) continues as one run."""
    return str(Path(ckpt_path).expanduser().resolve().parent) if ckpt_path else str(Path(output_dir) / "checkpoints")


def register_resolvers() -> None:
    from sentemb.run_record import wandb_run_group, wandb_run_name

    OmegaConf.register_new_resolver("packaged_model", packaged_model_path, replace=True)
    OmegaConf.register_new_resolver("wandb_mode", wandb_mode, replace=True)
    OmegaConf.register_new_resolver("wandb_run_name", wandb_run_name, replace=True)
    OmegaConf.register_new_resolver("wandb_run_group", wandb_run_group, replace=True)
    OmegaConf.register_new_resolver("sqlite_storage", sqlite_storage, replace=True)
    OmegaConf.register_new_resolver("checkpoint_dir", checkpoint_dir, replace=True)


register_resolvers()


def instantiate_checked(node: DictConfig, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate`, letting a constructor's own SentembConfigError through unwrapped."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, SentembConfigError):
            raise err.__cause__ from None
        raise


def prepare_run(cfg: DictConfig) -> CorpusReport:
    """Validate the config and the data it names, cheapest first; nothing here loads a model.

    Fills in `paths.data_dir` with the data root actually found, so the logged config says
    where the data came from.
    """
    if not cfg.get("loss"):
        raise SentembConfigError("loss: no objective configured. Fix: pick one, e.g. loss=infonce")
    instantiate_checked(cfg.loss)  # each objective validates its own hyper-parameters (e.g. τ > 0)
    if cfg.pooling.get("template") is not None:
        check_template(cfg.pooling.template)
    instantiate_checked(cfg.pooling, hidden_size=8)  # the pooling's own checks (its MLP options), at a toy size
    check_combination(cfg)
    if str(cfg.model.backbone.get("_target_", "")).endswith("pretrained_backbone"):
        check_model_source(str(cfg.model.name_or_path))  # an unreachable hub fails here, in seconds
    dropout = cfg.model.get("dropout")
    if dropout is not None and not (isinstance(dropout, int | float) and 0.0 <= dropout < 1.0):
        raise SentembConfigError(f"model.dropout={dropout} must be a number in [0, 1), or null for the model's own")
    layers = cfg.model.get("trainable_layers")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise SentembConfigError(
            f"model.trainable_layers={layers} must be a whole number of top layers to train (>= 1), or null for all. "
            "Fix: e.g. model.trainable_layers=12 (the paradigm code's num_layers)"
        )
    check_grad_cache(cfg)
    if cfg.get("ckpt_path") and not Path(cfg.ckpt_path).expanduser().is_file():
        raise SentembConfigError(
            f"ckpt_path={cfg.ckpt_path}: no such checkpoint file. Fix: point it at a run's checkpoints/last.ckpt "
            "(written at every dev evaluation), or drop ckpt_path to start fresh"
        )
    for key in ("batch_size", "max_length"):
        value = cfg.data.get(key)
        if value is not None and value < 1:
            raise SentembConfigError(f"data.{key}={value} must be >= 1 (conf/data/).")
    if cfg.eval.every_n_steps < 1:
        raise SentembConfigError(
            f"eval.every_n_steps={cfg.eval.every_n_steps} must be >= 1, e.g. eval.every_n_steps=125"
        )
    cfg.paths.data_dir = str(resolve_data_root(cfg.paths.data_dir))
    return check_corpus(Path(cfg.data.corpus).expanduser())


def check_grad_cache(cfg: DictConfig) -> None:
    chunk = cfg.get("grad_cache")
    if chunk is None:
        return
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise SentembConfigError(
            f"grad_cache={chunk} must be a whole number of sentences per chunk (>= 1), or null for one forward. "
            "Fix: e.g. data.batch_size=512 grad_cache=64"
        )
    if chunk >= cfg.data.batch_size:
        log.warning(
            "grad_cache=%d >= data.batch_size=%d: one chunk, which only adds a forward", chunk, cfg.data.batch_size
        )


def check_combination(cfg: DictConfig) -> None:
    """Pooling × head combinations that would silently ignore a part are refused up front."""
    head = cfg.get("head")
    if not head:
        return
    pooling = str(cfg.pooling.get("_target_", "")).rsplit(".", 1)[-1]
    if pooling in ("MeanPooling", "PromptPooling") or (pooling == "HiCLPooling" and cfg.pooling.get("prompt")):
        what = (
            "pooling.prompt=true" if pooling == "HiCLPooling" else f"pooling={pooling.removesuffix('Pooling').lower()}"
        )
        raise SentembConfigError(
            f"head=sarcse with {what}: SARCSE builds the sentence vector itself from the token states, so that "
            "pooling would be ignored. Fix: pooling=cls (SARCSE on the whole sentence) or pooling=hicl "
            "(SARCSE on every segment, pooling.prompt=false)."
        )


def apply_sweep_winner(cfg: DictConfig) -> list[str]:
    """`from_sweep=<dir>`: set the best configuration of that finished sweep, except keys this job overrides itself.

    Values only (e.g. data.batch_size, optimizer.lr): a config group cannot change after composition.
    """
    source = cfg.get("from_sweep")
    if not source:
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from sentemb.run_record import current_hydra, job_overrides, override_key
    from sentemb.sweep_report import winner_overrides

    hydra_cfg = current_hydra()
    own = {override_key(o) for o in job_overrides(hydra_cfg)}
    groups = set(hydra_cfg.runtime.choices) if hydra_cfg is not None else set()
    applied = []
    for override in OverridesParser.create().parse_overrides(winner_overrides(Path(str(source)).expanduser())):
        key = override.key_or_group
        if key in own:
            continue
        if key in groups or OmegaConf.select(cfg, key, default=None) is None:
            raise SentembConfigError(
                f"from_sweep={source}: its winner sets {key}={override.value()}, which is not a value of this "
                f"config (a config group or an unknown key). Fix: pass {key}=... on the command line instead."
            )
        OmegaConf.update(cfg, key, override.value(), merge=False)
        applied.append(f"{key}={override.value()}")
    return applied
