"""What `python -m sentemb.compare A B ...` compares: each argument read as one model or as several runs (seeds).

- a run folder (its `metrics.json` says ok): one model, the weights its closing report scored (the best checkpoint),
  with the cosines that report kept (`similarities.npz`);
- a checkpoint (`.ckpt`): one model; the cosines of its run folder are reused when that run scored this file;
- an evaluation folder (`python -m sentemb.evaluate`'s, holding `results.json`): its `similarities.npz`, and its
  checkpoint for tasks it did not score;
- an exported folder (`sentemb.export`: a sentence-transformers folder, or an ONNX export): one model, with the
  cosines of its evaluation (`<folder>/eval/similarities.npz`) if it was exported with evaluate=true;
- a sweep configuration, `<sweep folder>:key=value[,key=value ...]` (or a sweep folder alone, when its jobs differ
  only in the seed): its finished jobs with those swept values; several seeds are compared by their records'
  scores, one job as the model of its run folder.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import read_json
from sentemb.common.metric_names import OLD_NAMES, sts_test_metric
from sentemb.eval.similarities import SIMILARITIES_NAME
from sentemb.eval.sts import STS_TASKS
from sentemb.eval.suite import RESULTS_SHAPE
from sentemb.runs.jobs import override_key
from sentemb.runs.record import RECORD_NAME, read_record, read_records

RESULTS = "results.json"
ONNX_RECIPE = "sentemb_onnx.json"
MODULES = "modules.json"
# `<folder>:key=value,...`: the folder, then overrides (a key is a dotted name)
SWEEP_CONFIGURATION = re.compile(r"^(?P<folder>.+?):(?P<overrides>[+~]?[A-Za-z_][\w.]*=.*)$")
FIX = (
    "Fix: pass a run folder, a checkpoint (.ckpt), an evaluation folder (results.json), an exported folder, or a "
    "sweep configuration <sweep folder>:key=value[,key=value]"
)


@dataclass
class Contender:
    """One side of a comparison: a model (`model` says how to load it, `cached` its stored cosines) or `seeds`
    ({task: {seed: test score}} from the jobs' records)."""

    label: str
    model: tuple[str, Path] | None = None  # ("checkpoint" | "exported" | "onnx", path)
    cached: list[Path] = field(default_factory=list)
    seeds: dict[str, dict[int, float]] | None = None
    jobs: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # task → why a job's recorded score of it is no score

    def check_scores(self, tasks: list[str]) -> None:
        """A task compared whose recorded score is no number (`refused`) stops the comparison, naming file and key."""
        for task in tasks:
            if task in self.refused:
                raise SentembConfigError(self.refused[task])

    @property
    def kind(self) -> str:
        return "seeds" if self.seeds is not None else "model"


def contender(argument: str) -> Contender:
    """The contender an argument names (module docstring), refused with the reason and the fix otherwise."""
    match = SWEEP_CONFIGURATION.match(argument)
    if match and not Path(argument).exists():
        return sweep_configuration(argument, Path(match["folder"]).expanduser(), match["overrides"].split(","))
    path = Path(argument).expanduser()
    if not path.exists():
        raise SentembConfigError(f"compare: {argument} does not exist. {FIX}")
    if path.is_file():
        if path.suffix != ".ckpt":
            raise SentembConfigError(f"compare: {argument} is a file but not a checkpoint (.ckpt). {FIX}")
        return Contender(argument, ("checkpoint", path), cached=run_cache_of(path))
    if (path / RECORD_NAME).is_file():
        return run_folder(argument, path)
    if (path / RESULTS).is_file():
        return evaluation_folder(argument, path)
    if (path / ONNX_RECIPE).is_file():  # its eval/ scored the torch encoder it came from, not this graph: encoded
        return Contender(argument, ("onnx", path))
    if (path / MODULES).is_file():
        return Contender(argument, ("exported", path), cached=existing(path / "eval" / SIMILARITIES_NAME))
    if any(path.rglob(RECORD_NAME)):
        return sweep_configuration(argument, path, [])
    raise SentembConfigError(f"compare: {argument} is a folder sentemb did not write (no {RECORD_NAME}). {FIX}")


def existing(path: Path) -> list[Path]:
    return [path] if path.is_file() else []


def run_folder(label: str, folder: Path) -> Contender:
    """A training run: the weights its closing report scored, and the cosines it kept."""
    record = read_record(folder)
    metrics = record.get("metrics") or {}
    if record["status"] != "ok":
        raise SentembConfigError(
            f"compare: {folder}/{RECORD_NAME} says status={record['status']}: the run did not finish, so it has no "
            "scored weights. Fix: compare a finished run, or one of its checkpoints (.ckpt)"
        )
    cached = existing(folder / SIMILARITIES_NAME)
    checkpoint = own_best_checkpoint(folder, metrics)
    if checkpoint is None:  # callbacks=none: the scored final weights were not saved
        return Contender(label, None, cached=cached)
    return Contender(label, ("checkpoint", checkpoint), cached=cached)


def own_best_checkpoint(folder: Path, metrics: dict[str, Any]) -> Path | None:
    """The run folder's own copy of the checkpoint its record names (`best_checkpoint`; None: none was kept). A run
    folder copied or moved elsewhere keeps its original's absolute path in its record: the file of that name in
    this folder's checkpoints/ is the one read, never the original's (which may hold other weights by now), and if
    this folder lacks it, the comparison says so where it must encode with it; a recorded path that names no file of
    a checkpoints/ folder is refused with the reason."""
    best = metrics.get("best_checkpoint")
    if best is None or best == "":
        return None
    record = folder / RECORD_NAME
    if not isinstance(best, str):
        raise SentembConfigError(f"compare: {record}: metrics.best_checkpoint={best!r} is not a path. {RECORD_FIX}")
    recorded = Path(best).expanduser()
    if recorded.is_absolute() and recorded.parent.name != CHECKPOINTS:
        raise SentembConfigError(
            f"compare: {record}: metrics.best_checkpoint={best} is not a file of a run folder's {CHECKPOINTS}/, so "
            f"it is no checkpoint of this run folder; it was not read. {RECORD_FIX}"
        )
    return folder / CHECKPOINTS / recorded.name  # missing: refused where it must encode (stored_similarities)


CHECKPOINTS = "checkpoints"
RECORD_FIX = "Fix: restore the run folder's metrics.json as its run wrote it, or compare a checkpoint (.ckpt) by path"


def run_cache_of(checkpoint: Path) -> list[Path]:
    """The similarities.npz of the run a checkpoint belongs to, when that run's closing report scored this file."""
    folder = checkpoint.resolve().parent.parent
    record = read_record(folder) if (folder / RECORD_NAME).is_file() else None
    try:
        best = own_best_checkpoint(folder, (record or {}).get("metrics") or {})
    except SentembConfigError:  # the record names no checkpoint of that folder: its cosines are not this file's
        return []
    same = best is not None and best.resolve() == checkpoint.resolve()
    return existing(folder / SIMILARITIES_NAME) if same else []


def evaluation_folder(label: str, folder: Path) -> Contender:
    """`python -m sentemb.evaluate`'s folder: its cosines, and its checkpoint (if any) for what it did not score."""
    results = read_json(folder / RESULTS, RESULTS_SHAPE)
    source = results.get("source") if isinstance(results, dict) else None
    checkpoint = source.get("checkpoint") if isinstance(source, dict) else None
    onnx = source.get("onnx") if isinstance(source, dict) else None
    model = ("checkpoint", Path(checkpoint)) if isinstance(checkpoint, str) else None
    model = ("onnx", Path(onnx)) if isinstance(onnx, str) else model
    return Contender(label, model, cached=existing(folder / SIMILARITIES_NAME))


def sweep_configuration(label: str, folder: Path, overrides: list[str]) -> Contender:
    """The finished jobs of a sweep with the swept values `overrides` (key=value, as the jobs' records hold them)."""
    if not folder.is_dir():
        raise SentembConfigError(f"compare: {label}: {folder} is not a folder. {FIX}")
    malformed = [o for o in overrides if "=" not in o]
    if malformed:
        raise SentembConfigError(
            f"compare: {label}: {', '.join(malformed)} is not key=value. Fix: {folder}:key=value[,key=value], "
            "e.g. loss=focal,loss.tau=0.05"
        )
    wanted = {override_key(o): o.split("=", 1)[1] for o in overrides}
    records = [(d, r) for d, r in read_records(folder) if r["status"] == "ok"]
    jobs = []
    for directory, record in records:
        values = {override_key(o): o.split("=", 1)[1] for o in record.get("overrides") or []}
        if all(values.get(key) == value for key, value in wanted.items()):
            jobs.append((directory, record, values))
    if not jobs:
        raise SentembConfigError(
            f"compare: {label}: no finished job of {folder} has {', '.join(overrides) or 'any record'}. "
            "Fix: name the swept values as the sweep's sweep.csv writes them (e.g. loss=focal,loss.tau=0.05)"
        )
    differing = sorted(
        key for key in {k for _, _, v in jobs for k in v}
        if key != "seed" and len({v.get(key) for _, _, v in jobs}) > 1
    )  # fmt: skip
    if differing:
        raise SentembConfigError(
            f"compare: {label}: its {len(jobs)} jobs differ in {', '.join(differing)}, not only in the seed. "
            f"Fix: name one configuration, e.g. {folder}:{differing[0]}=<value>"
        )
    if len(jobs) == 1:
        directory, _, _ = jobs[0]
        return run_folder(label, directory)
    seeds = [record.get("seed") for _, record, _ in jobs]
    if len(set(seeds)) != len(seeds):
        raise SentembConfigError(f"compare: {label}: two of its jobs ran the same seed ({seeds}). Fix: name one job")
    scores: dict[str, dict[int, float]] = {}
    refused: dict[str, str] = {}
    for task in STS_TASKS:
        try:
            values = {r["seed"]: recorded_test_score(d, r.get("metrics") or {}, task) for d, r, _ in jobs}
        except SentembConfigError as err:  # refused if the task is compared (it may be left out with --tasks)
            refused[task] = str(err)
            continue
        if all(value is not None for value in values.values()):
            scores[task] = values
    return Contender(label, seeds=scores, jobs=[str(d) for d, _, _ in jobs], refused=refused)


def recorded_test_score(directory: Path, metrics: dict[str, Any], task: str) -> float | None:
    """A job's recorded test score of an STS task (STS-B's also under its name from before today's metric names);
    None where the job was not scored on it (no such key). A score recorded but not a finite number (`true`, a
    string, `null`: a score that could not be computed) is refused naming the file and the key, never counted."""
    name = sts_test_metric(task)
    key = next((k for k in (name, *(old for old, new in OLD_NAMES.items() if new == name)) if k in metrics), None)
    if key is None:
        return None
    value = metrics[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        what = "null: a score that could not be computed" if value is None else f"{value!r}, not a number"
        raise SentembConfigError(
            f"compare: {directory / RECORD_NAME}: metrics.{key} is {what}; a test score is a finite number, so this "
            f"job's {task} cannot be compared. Fix: leave {task} out (--tasks), or score the job again (python -m "
            "sentemb.evaluate on its best checkpoint)"
        )
    return float(value)


def task_names(contenders: list[Contender], asked: list[str]) -> list[str]:
    """The STS tasks to compare: `asked`, or for several runs each, the tasks every contender's jobs were scored on."""
    if asked:
        return asked
    if all(c.kind == "seeds" for c in contenders):
        shared: Any = set(STS_TASKS)
        for c in contenders:
            shared &= set(c.seeds or {}) | set(c.refused)  # a score recorded as no number: refused, never skipped
        return [task for task in STS_TASKS if task in shared]
    return list(STS_TASKS)
