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

RECORD_NAME = "metrics.json"
STATUSES = ("ok", "failed", "diverged")


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
