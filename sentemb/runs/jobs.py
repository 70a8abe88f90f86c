"""What names a job: its Hydra runtime config, command-line overrides, the keys its sweep varies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from sentemb.common.file_values import Shape, checked, parse_yaml


def job_overrides(hydra_cfg: DictConfig | None) -> list[str]:
    """The job's own command-line overrides (`key=value` strings), sweep values filled in."""
    if hydra_cfg is None:
        return []
    return [str(o) for o in hydra_cfg.overrides.task]


def override_key(override: str) -> str:
    """`+loss.m=0.3` → `loss.m`."""
    return override.split("=", 1)[0].lstrip("+~")


def swept_keys(hydra_cfg: DictConfig | None) -> list[str]:
    """Keys this job's sweep varies: the sweeper's `params`, plus the sweep overrides of the command line.

    The basic sweeper saves the original command line (with its `a,b` lists) as `multirun.yaml`
    in the sweep directory before it launches the jobs; the Optuna sweeper keeps its search space
    in `hydra.sweeper.params`.
    """
    if not is_multirun(hydra_cfg):
        return []
    keys = [str(key) for key in (hydra_cfg.sweeper.get("params") or {})]
    multirun = Path(str(hydra_cfg.sweep.dir)) / "multirun.yaml"
    if multirun.is_file():
        saved = parse_yaml(multirun, "Fix: restore the sweep's multirun.yaml as Hydra wrote it")
        task = ((saved.get("hydra") or {}).get("overrides") or {}).get("task") if isinstance(saved, dict) else None
        # override strings, parsed for their keys only (never applied): the user's interpolations are text here
        original = [str(o) for o in checked(task or [], multirun, Shape(text=("",)))]
        parsed = OverridesParser.create().parse_overrides(original)
        keys += [o.key_or_group for o in parsed if o.is_sweep_override()]
    return list(dict.fromkeys(keys))


def short_name(overrides: list[str], swept: list[str]) -> str:
    """The job's swept overrides, e.g. `loss.m=0.3 loss.r=1.5 seed=2` (all overrides if none is swept)."""
    chosen = [o for o in overrides if override_key(o) in swept] if swept else overrides
    return " ".join(chosen)


def current_hydra() -> DictConfig | None:
    """The running job's Hydra config (None outside a Hydra app)."""
    return HydraConfig.get() if HydraConfig.initialized() else None


def is_multirun(hydra_cfg: DictConfig | None) -> bool:
    return hydra_cfg is not None and "MULTIRUN" in str(hydra_cfg.get("mode"))


def job_description(cfg: DictConfig, hydra_cfg: DictConfig | None) -> dict[str, Any]:
    """What names the job in a report: its overrides, the swept ones, seed, W&B name/group/tags."""
    overrides = job_overrides(hydra_cfg)
    swept = swept_keys(hydra_cfg)
    wandb_cfg = (cfg.get("logger") or {}).get("wandb")
    try:  # the record is written whatever failed, a logger config that cannot resolve included
        resolved = OmegaConf.to_container(wandb_cfg, resolve=True) if wandb_cfg else None
    except Exception:  # noqa: BLE001
        resolved = None
    wandb = {k: resolved.get(k) for k in ("name", "group", "tags")} if resolved else None
    return {
        "overrides": overrides,
        "swept": {override_key(o): o.split("=", 1)[1] for o in overrides if override_key(o) in swept},
        "seed": cfg.seed,
        "job": hydra_cfg.job.num if is_multirun(hydra_cfg) else None,
        "wandb": wandb,
    }
