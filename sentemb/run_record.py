"""`metrics.json` in every run directory: what a job did, for sweep reports (not W&B's binary logs).

    {"status": "ok" | "failed" | "diverged", "message": ..., "metrics": {...}, "overrides": [...],
     "swept": {key: value}, "seed": 42, "wall_time_s": 12.3, "wandb": {"name", "group", "tags"}}

`swept` holds the job's overrides of the keys its sweep varies (see `swept_keys`), the part that
names the job; `overrides` all of its command-line overrides.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

RECORD_NAME = "metrics.json"
STATUSES = ("ok", "failed", "diverged")


class TrainingDiverged(RuntimeError):
    """A non-finite loss: the job stops (its sweep goes on) and is recorded as `diverged`."""


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
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf

        original = [str(o) for o in OmegaConf.load(multirun).hydra.overrides.task]
        parsed = OverridesParser.create().parse_overrides(original)
        keys += [o.key_or_group for o in parsed if o.is_sweep_override()]
    return list(dict.fromkeys(keys))


def short_name(overrides: list[str], swept: list[str]) -> str:
    """The job's swept overrides, e.g. `loss.m=0.3 loss.r=1.5 seed=2` (all overrides if none is swept)."""
    chosen = [o for o in overrides if override_key(o) in swept] if swept else overrides
    return " ".join(chosen)


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN/inf: a non-finite float is written as null."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


def write_record(directory: Path, record: dict[str, Any]) -> Path:
    """Write `metrics.json` atomically (a sweep report may read while jobs still run)."""
    if record.get("status") not in STATUSES:
        raise ValueError(f"status {record.get('status')!r} is not one of {STATUSES}")
    directory.mkdir(parents=True, exist_ok=True)
    clean = {**record, "metrics": {k: finite_or_none(v) for k, v in (record.get("metrics") or {}).items()}}
    path = directory / RECORD_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(clean, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def read_records(sweep_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every job's record under a sweep directory, in job order."""
    found = [(p.parent, json.loads(p.read_text())) for p in Path(sweep_dir).rglob(RECORD_NAME)]
    return sorted(found, key=lambda item: (len(item[0].parts), _number_or_name(item[0].name)))


def _number_or_name(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (10**9, name)


def current_hydra() -> DictConfig | None:
    """The running job's Hydra config (None outside a Hydra app)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def is_multirun(hydra_cfg: DictConfig | None) -> bool:
    return hydra_cfg is not None and "MULTIRUN" in str(hydra_cfg.get("mode"))


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
