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

A record is read as data (sentemb.common.file_values): its keys are `RECORD_KEYS`, its values plain, and the
override strings are text that is compared and shown; a sweep's winner parses them and checks each value again
before it applies one (sentemb.runs.sweeps.apply_sweep_winner).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import Shape, read_json
from sentemb.common.published_files import publish_text

RECORD_NAME = "metrics.json"
STATUSES = ("ok", "failed", "diverged", "preempted", "running")
# every key a record may hold (write_record refuses others, so a new one is added here first)
RECORD_KEYS = (
    "status", "message", "metrics", "overrides", "swept", "seed", "job", "wandb", "wall_time_s",
    "resumed", "interrupted", "step", "signal",
)  # fmt: skip
RECORD_SHAPE = Shape(keys={"": RECORD_KEYS}, text=("overrides", "swept", "message"))
FIX = "Fix: restore the file, or move the run directory away to start that job afresh"


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN/inf: a non-finite float is written as null."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


def write_record(directory: Path, record: dict[str, Any]) -> Path:
    """Write `metrics.json` atomically (a sweep report may read while jobs still run)."""
    if record.get("status") not in STATUSES:
        raise ValueError(f"status {record.get('status')!r} is not one of {STATUSES}")
    unknown = sorted(set(record) - set(RECORD_KEYS))
    if unknown:
        raise ValueError(f"record keys {unknown} are not in RECORD_KEYS (sentemb.runs.record)")
    directory.mkdir(parents=True, exist_ok=True)
    clean = {**record, "metrics": {k: finite_or_none(v) for k, v in (record.get("metrics") or {}).items()}}
    return publish_text(directory / RECORD_NAME, json.dumps(clean, indent=2, default=str) + "\n")


def read_record(directory: Path) -> dict[str, Any] | None:
    """The record in `directory`, or None if it has none."""
    path = Path(directory) / RECORD_NAME
    if not path.is_file():
        return None
    # written atomically, so only a hand edit, a full disk or a file from elsewhere is refused here
    return checked_record(read_json(path, RECORD_SHAPE, FIX), path)


def checked_record(record: Any, path: Path) -> dict[str, Any]:
    """A record's shape (a dict with a known status, its metrics a dict, its overrides a list of strings), beyond the
    plain values `read_json` checked."""
    if not isinstance(record, dict):
        raise SentembConfigError(f"{path}: holds a {type(record).__name__}, not a job's record (a dict). {FIX}")
    if record.get("status") not in STATUSES:
        raise SentembConfigError(f"{path}: status={record.get('status')!r} is not one of {', '.join(STATUSES)}. {FIX}")
    for key, kind in (("metrics", dict), ("overrides", list), ("swept", dict), ("wandb", dict)):
        if record.get(key) is not None and not isinstance(record[key], kind):
            raise SentembConfigError(f"{path}: {key} must be a {kind.__name__}. {FIX}")
    if not all(isinstance(o, str) for o in record.get("overrides") or []):
        raise SentembConfigError(f"{path}: overrides must be strings (key=value). {FIX}")
    return record


def read_records(sweep_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every job's record under a sweep directory, in job order."""
    found = [(p.parent, read_record(p.parent)) for p in Path(sweep_dir).rglob(RECORD_NAME)]
    return sorted(found, key=lambda item: (len(item[0].parts), _job_order(item[0].name)))


def _job_order(name: str) -> tuple[str, int, str]:
    """`7`: job 7; `7-20250101-120000` (hparams_search=optuna's job folders): its invocation's start, then job 7
    (a resumed study numbers its jobs from 0 again); any other name after those, by name."""
    number, _, started = name.partition("-")
    return (started, int(number), "") if number.isdigit() else ("\uffff", 10**9, name)
