"""`metrics.json` in every run directory: what a job did, for sweep reports (not W&B's binary logs).

    {"status": "ok" | "failed" | "diverged" | "preempted" | "running", "message": ..., "metrics": {...},
     "overrides": [...], "swept": {key: value}, "seed": 42, "wall_time_s": 12.3, "wandb": {"name", "group", "tags"},
     "interrupted": false}

`running` is written when a job starts, so a job killed outright (node failure, SIGKILL) says so;
`preempted`: a preemption signal wrote `checkpoints/last.ckpt` and stopped it; `interrupted`: a
`failed` job that an interrupt (Ctrl-C, SystemExit) stopped. Those three resume on restart
(sentemb.runs.rerun_policy).

`swept` holds the job's overrides of the keys its sweep varies (see `swept_keys`), the part that
names the job; `overrides` all of its command-line overrides.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sentemb.common.errors import SentembConfigError

RECORD_NAME = "metrics.json"
STATUSES = ("ok", "failed", "diverged", "preempted", "running")


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


def read_record(directory: Path) -> dict[str, Any] | None:
    """The record in `directory`, or None if it has none."""
    path = Path(directory) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:  # written atomically, so only a hand edit or a full disk gets here
        raise SentembConfigError(
            f"{path}:{err.lineno}: not valid JSON ({err.msg}). Fix: restore the file, or move the run directory "
            "away to start that job afresh"
        ) from err


def read_records(sweep_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every job's record under a sweep directory, in job order."""
    found = [(p.parent, json.loads(p.read_text())) for p in Path(sweep_dir).rglob(RECORD_NAME)]
    return sorted(found, key=lambda item: (len(item[0].parts), _job_order(item[0].name)))


def _job_order(name: str) -> tuple[str, int, str]:
    """`7`: job 7; `7-20250101-120000` (hparams_search=optuna's job folders): its invocation's start, then job 7
    (a resumed study numbers its jobs from 0 again); any other name after those, by name."""
    number, _, started = name.partition("-")
    return (started, int(number), "") if number.isdigit() else ("\uffff", 10**9, name)
