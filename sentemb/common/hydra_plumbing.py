"""Hydra plumbing: the resolvers conf/ uses, a checked `instantiate`, resolved containers, composing a config.

It imports nothing else from sentemb, so any part can use it without pulling in the rest. The
resolvers are named here by dotted path and imported on their first use (as Hydra's own
`_target_` strings are), so each lives beside what it is about; they are registered when this
module is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

# name in conf/ (${name:...}) → the function that computes it
RESOLVERS = {
    "packaged_model": "sentemb.encoders.models.backbones.packaged_model_path",
    "wandb_mode": "sentemb.common.wandb_mode.wandb_mode",
    "wandb_run_name": "sentemb.runs.wandb_runs.wandb_run_name",
    "wandb_run_group": "sentemb.runs.wandb_runs.wandb_run_group",
    "sqlite_storage": "sentemb.runs.sweeps.sqlite_storage",
    "checkpoint_dir": "sentemb.training.checkpoint_files.checkpoint_dir",
    "run_dir_name": "sentemb.runs.rerun_policy.run_dir_name",
    "fastest_precision": "sentemb.training.precision.fastest_precision",
}


def _deferred(path: str) -> Any:
    def resolve(*args: Any) -> Any:
        return get_method(path)(*args)

    return resolve


def register_resolvers() -> None:
    for name, path in RESOLVERS.items():
        OmegaConf.register_new_resolver(name, _deferred(path), replace=True)


register_resolvers()


def instantiate_checked(node: Any, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate`, letting a constructor's own ValueError (SentembConfigError is one) through
    unwrapped: its message already names the config key and the fix."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, ValueError):
            raise err.__cause__ from None
        raise


def resolved_container(node: Any) -> Any:
    """Resolved plain containers: what a checkpoint stores to rebuild the model exactly."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def part_name(node: Any) -> str:
    """A part config's name for display: its registry name (`cls`), or for a config written before registry names,
    the class its `_target_` named (`sentemb.encoders.pooling.CLSPooling` → `CLSPooling`); '' for none."""
    node = node or {}
    return str(node.get("name") or str(node.get("_target_", "")).rsplit(".", 1)[-1])


def compose_config(
    config_dir: Path, config_name: str, overrides: list[str], output_dir: Path | None = None
) -> DictConfig:
    """`config_name` composed with `overrides` as its command would (Hydra's runtime config set), for scripts."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    return cfg
