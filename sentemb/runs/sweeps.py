"""A sweep's `metrics.json` files → one answer (`python -m sentemb.sweep_report`, and after every multirun).

Writes into the sweep directory:
- `sweep.csv`: a row per job: its swept values, seed, status, metrics, wall time, message;
- `sweep.md`: configurations (jobs that differ only in `seed` form one row) sorted by mean best
  STS-B dev, mean ± std over seeds with n; the lead over the runner-up against the seed noise;
  failed and diverged jobs with their messages;
- a grid sweep's figures: `sweep_<param>.png` per swept numeric parameter (the paradigm paper's
  Figure 6): mean best dev against the parameter, one line per value of the other swept parameter
  with the most values, error bars = std over the jobs in each point (seeds, and a third parameter
  if any); `sweep_heatmap.png`: mean best dev over the two swept parameters with the most values;
- an Optuna study's figures instead (hparams_search=optuna, sentemb.runs.optuna_study):
  `optuna_history.png`, `optuna_importances.png`, `optuna_slice.png`;
- `sweep_tests.csv` (jobs run with several seeds): every configuration against the best by the paired t-test over
  the seeds both ran, Holm-corrected over the STS test tasks (`seed_tests`; docs/sweeps.md#seeds);
- `best_overrides.txt`: the winning configuration's overrides, for reading.

Numbers people read (`sweep.md`, the figures, `best_overrides.txt`) have 4 significant digits, an
Optuna sample included (0.3075, not 0.30745401188473626); `sweep.csv` and `from_sweep=<dir>`, which
reads the records again, keep the exact values, so the winner is retrained as it ran.

It also runs by itself at the end of every multirun (`SweepReportCallback` of sentemb.runs.sweep_callback, a Hydra
callback in conf/train.yaml) and logs its table and figures to W&B, in the sweep's group.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import Shape, checked
from sentemb.common.folder_lock import take_folder_lock
from sentemb.common.metric_names import (
    BEST_STEP,
    DEV_SPEARMAN_BEST_RESCORED,
    TEST_SPEARMAN,
    read_metric,
    sts_test_metric,
)
from sentemb.common.published_files import publish_text, published
from sentemb.common.wandb_mode import wandb_mode
from sentemb.eval.sts import STS_TASKS
from sentemb.runs.jobs import current_hydra, job_overrides, override_key
from sentemb.runs.optuna_study import optuna_report
from sentemb.runs.record import RECORD_NAME, STATUSES, read_records
from sentemb.runs.seed_tests import TESTS_NAME, seed_tests, tests_note, versus_best
from sentemb.runs.sweep_figures import four_digits, grid_figures, readable


def job_rows(sweep_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """A row per job and the swept parameters (keys whose override differs between jobs, or that a sweep swept).
    Beside STS-B test (`test`), a row has `test_<task>` for each other STS task any job was scored on after
    training (eval.test_tasks)."""
    records = read_records(sweep_dir)
    if not records:
        raise SentembConfigError(
            f"{sweep_dir}: no {RECORD_NAME} below it. Fix: pass a multirun directory of `python -m sentemb.train -m`."
        )
    values: list[dict[str, str]] = [
        {override_key(o): o.split("=", 1)[1] for o in record.get("overrides", [])} for _, record in records
    ]
    keys = {k for v in values for k in v}
    varying = {k for k in keys if len({v.get(k) for v in values}) > 1}
    swept = varying | {k for _, record in records for k in record.get("swept", {})}
    params = [k for k in dict.fromkeys(k for v in values for k in v) if k in swept and k != "seed"]
    tasks = [t for t in STS_TASKS if t != "STSBenchmark" and any(sts_test_metric(t) in (r.get("metrics") or {})
                                                                   for _, r in records)]  # fmt: skip
    rows = []
    for (directory, record), overrides in zip(records, values, strict=True):
        metrics = record.get("metrics") or {}
        rows.append(
            {
                "job": directory.name,
                **{p: overrides.get(p, "") for p in params},
                "seed": record.get("seed"),
                "status": record["status"],
                "best_dev": read_metric(metrics, DEV_SPEARMAN_BEST_RESCORED),  # an old record's old names too
                "best_step": read_metric(metrics, BEST_STEP),
                "test": read_metric(metrics, TEST_SPEARMAN),
                **{f"test_{task}": metrics.get(sts_test_metric(task)) for task in tasks},
                "wall_time_s": record.get("wall_time_s"),
                "wandb_name": (record.get("wandb") or {}).get("name", ""),
                "message": record.get("message", ""),
            }
        )
    return rows, params


def configurations(rows: list[dict[str, Any]], params: list[str]) -> list[dict[str, Any]]:
    """Finished jobs grouped by their swept values (seeds pooled), best mean dev first."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if row["status"] == "ok" and row["best_dev"] is not None:
            groups.setdefault(tuple(row[p] for p in params), []).append(row)
    out = []
    for key, members in groups.items():
        dev = [m["best_dev"] for m in members]
        test = [m["test"] for m in members if m["test"] is not None]
        out.append(
            {
                **dict(zip(params, key, strict=True)),
                "dev_mean": statistics.fmean(dev),
                "dev_std": statistics.stdev(dev) if len(dev) > 1 else math.nan,
                "test_mean": statistics.fmean(test) if test else math.nan,
                "test_std": statistics.stdev(test) if len(test) > 1 else math.nan,
                "step_mean": statistics.fmean(m["best_step"] for m in members),
                "n": len(members),
                "seeds": sorted(m["seed"] for m in members),
            }
        )
    return sorted(out, key=lambda c: -c["dev_mean"])


def pooled_seed_std(configs: list[dict[str, Any]]) -> tuple[float, int]:
    """√(Σ (n_i − 1) s_i² / Σ (n_i − 1)) over configurations run with several seeds; (nan, 0) if none."""
    dof = sum(c["n"] - 1 for c in configs if c["n"] > 1)
    if not dof:
        return math.nan, 0
    return math.sqrt(sum((c["n"] - 1) * c["dev_std"] ** 2 for c in configs if c["n"] > 1) / dof), dof


def _pm(mean: float, std: float) -> str:
    """`mean ± std`, the mean to 4 significant digits and the std to as many decimals (83.50 ± 0.71)."""
    text = four_digits(mean)
    if math.isnan(mean) or math.isnan(std):
        return text
    decimals = len(text.partition(".")[2]) if "e" not in text else None
    return f"{text} ± {four_digits(std) if decimals is None else f'{std:.{decimals}f}'}"


def markdown(
    sweep_dir: Path,
    rows: list[dict[str, Any]],
    params: list[str],
    configs: list[dict[str, Any]],
    notes: Sequence[str] = (),
    tests: Sequence[dict[str, Any]] = (),
) -> str:
    """sweep.md: the table of configurations with each one's paired t-test against the best (`tests`, from
    `seed_tests`), the lead over the runner-up, the jobs that did not finish, `notes` (the Optuna study's)."""
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    unfinished = "".join(f", {counts[s]} {s}" for s in ("preempted", "running") if counts[s])  # resume: rerun it
    lines = [
        f"# Sweep {sweep_dir.name}",
        "",
        f"{len(rows)} jobs: {counts['ok']} ok, {counts['failed']} failed, {counts['diverged']} diverged{unfinished}. "
        f"Swept: {', '.join(f'`{p}`' for p in params) or 'nothing but the seed'}. "
        "STS-B Spearman ×100 of each job's best dev checkpoint; mean ± std over seeds.",
        "",
        *table_head(["rank", *params, "best dev", "test", "best step", "n", "seeds", "vs best (paired t, dev)"]),
    ]
    for rank, c in enumerate(configs, start=1):
        cells = [str(rank), *(readable(c[p]) for p in params), _pm(c["dev_mean"], c["dev_std"])]
        cells += [_pm(c["test_mean"], c["test_std"]), f"{c['step_mean']:.0f}", str(c["n"])]
        cells += [", ".join(str(s) for s in c["seeds"]), versus_best(list(tests), c, params)]
        lines.append(table_row(cells))
    lines.append("")
    lines += tests_note(configs, tests)
    noise, dof = pooled_seed_std(configs)
    if len(configs) > 1:
        lead = configs[0]["dev_mean"] - configs[1]["dev_mean"]
        if dof:
            verdict = "larger" if lead > 2 * noise * math.sqrt(2 / configs[0]["n"]) else "not larger"
            lines.append(
                f"The best configuration leads the runner-up by {four_digits(lead)} points; the pooled seed std is "
                f"{four_digits(noise)} ({dof} degrees of freedom), so the lead is {verdict} than two standard errors "
                "of a difference of means."
            )
        else:
            lines.append(
                f"The best configuration leads the runner-up by {four_digits(lead)} points. "
                "One seed per configuration: no seed noise is measured (add `seed=1,2,3` to the sweep to measure it)."
            )
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        lines += [
            "",
            "## Failed, diverged and unfinished jobs",
            "",
            *table_head(["job", *params, "seed", "status", "message"]),
        ]
        for r in bad:
            message = str(r["message"]).replace("|", "\\|").replace("\n", " ")[:300]
            lines.append(table_row([r["job"], *(readable(r[p]) for p in params), str(r["seed"]), r["status"], message]))
    if notes:
        lines += ["", "## Optuna study", "", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def table_head(columns: list[str]) -> list[str]:
    """A markdown table's header and separator lines, one cell per column (a sweep over seeds alone has no
    parameter columns: none is left empty)."""
    return [table_row(columns), table_row(["---"] * len(columns))]


def table_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import csv

    with published(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_report(sweep_dir: Path) -> dict[str, Any]:
    """Read every job's metrics.json below `sweep_dir`, write the report files under the sweep folder's lock (a
    second report at once is refused, naming the first); returns what it wrote."""
    sweep_dir = Path(sweep_dir)
    rows, params = job_rows(sweep_dir)  # first: a folder without records is named as such, and nothing is made
    lock = take_folder_lock(sweep_dir, f"{sweep_dir} (its sweep report)", "wait for that report to finish")
    try:
        lock.claim()
        return write_locked_report(sweep_dir, rows, params)
    finally:
        lock.release(remove=lock.created, restore=True)  # a lock file this report made goes with it


def write_locked_report(sweep_dir: Path, rows: list[dict[str, Any]], params: list[str]) -> dict[str, Any]:
    """`write_report` once the sweep folder is this process's."""
    configs = configurations(rows, params)
    write_csv(sweep_dir / "sweep.csv", rows)
    optuna = optuna_report(sweep_dir)  # None: not an Optuna study, so a grid's figures
    pngs, notes = optuna if optuna is not None else (grid_figures(sweep_dir, rows, params), [])
    tests = seed_tests(rows, params, configs)
    if any(c["n"] > 1 for c in configs):  # a table of seed tests needs seeds
        write_csv(sweep_dir / TESTS_NAME, tests)
    report = markdown(sweep_dir, rows, params, configs, notes, tests)
    publish_text(sweep_dir / "sweep.md", report)
    if configs:
        readable_winner = {**configs[0], **{p: readable(configs[0][p]) for p in params}}
        publish_text(sweep_dir / "best_overrides.txt", "\n".join(as_overrides(readable_winner, params)) + "\n")
    return {
        "rows": rows, "params": params, "configurations": configs, "tests": tests, "markdown": report, "figures": pngs,
    }  # fmt: skip


def winner_overrides(sweep_dir: Path) -> list[str]:
    """The best configuration's overrides of a finished sweep (stage 1 → stage 2 of the paradigm paper's grid)."""
    rows, params = job_rows(Path(sweep_dir))
    configs = configurations(rows, params)
    if not configs:
        raise SentembConfigError(f"from_sweep={sweep_dir}: no job of that sweep finished. Fix: name a finished sweep.")
    return as_overrides(configs[0], params)


def as_overrides(config: dict[str, Any], params: list[str]) -> list[str]:
    """A configuration's swept values as `key=value` overrides."""
    return [f"{p}={config[p]}" for p in params]


def log_to_wandb(result: dict[str, Any], project: str, group: str, directory: Path) -> None:
    """One extra run in the sweep's group (job_type sweep-report): the table and the figures."""
    import wandb

    run = wandb.init(
        project=project, group=group, name=f"{group} report", job_type="sweep-report", dir=directory, mode=wandb_mode()
    )
    columns = list(result["rows"][0])
    run.log({"sweep/jobs": wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in result["rows"]])})
    if result["tests"]:  # the paired t-tests against the best configuration (sweep_tests.csv)
        names = list(result["tests"][0])
        rows = [[str(r[c]) if c == "separable" else r[c] for c in names] for r in result["tests"]]  # True/"best"
        run.log({"sweep/tests": wandb.Table(columns=names, data=rows)})
    run.log({f"sweep/{png.stem}": wandb.Image(str(png)) for png in result["figures"]})
    run.summary["sweep/markdown"] = result["markdown"]
    run.finish()


def sqlite_storage(directory: str) -> str:
    """An Optuna sqlite URL in `directory`, created now: the sweeper opens it before Hydra makes the sweep dir."""
    folder = Path(directory).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'optuna.db'}"


# top-level keys a sweep winner never sets: where the run reads and writes, what it resumes or loads, how it runs;
# nor a key with a `_` part (`loss._target_`, `optimizer._partial_`: Hydra's instructions of what to build)
NOT_FROM_SWEEP = ("hydra", "paths", "ckpt_path", "from_sweep", "auto_resume", "ddp_worker", "logger", "callbacks")
WINNER_FIX = "Fix: pass the values you want on the command line instead of from_sweep="
# the config nodes that are parts: their `name` says which registered part is built, which a winner never changes
PART_KEYS = ("loss", "pooling", "head", "model.backbone", "model.tokenizer")


def apply_sweep_winner(cfg: DictConfig) -> list[str]:
    """`from_sweep=<dir>`: set the best configuration of that finished sweep, except keys this job overrides itself.

    Values only (e.g. data.batch_size, optimizer.lr): a config group cannot change after composition.
    """
    source = cfg.get("from_sweep")
    if not source:
        return []
    hydra_cfg = current_hydra()
    own = {override_key(o) for o in job_overrides(hydra_cfg)}
    groups = set(hydra_cfg.runtime.choices) if hydra_cfg is not None else set()
    applied = []
    for override in OverridesParser.create().parse_overrides(winner_overrides(Path(str(source)).expanduser())):
        key = override.key_or_group
        if key in own:
            continue
        # the one rule for values read from files: plain, no interpolation, no `_target_`, at any depth
        checked(override.value(), f"from_sweep={source} (its winner's {RECORD_NAME} files)", Shape(), WINNER_FIX)
        names_a_part = key.endswith(".name") and key.rsplit(".", 1)[0] in PART_KEYS  # which part, not its values
        if key.split(".", 1)[0] in NOT_FROM_SWEEP or names_a_part or any(p.startswith("_") for p in key.split(".")):
            raise SentembConfigError(
                f"from_sweep={source}: its winner sets {key}, which a sweep record may not set (it names files, code "
                f"or how sentemb runs, not a hyper-parameter). {WINNER_FIX}"
            )
        if key in groups or OmegaConf.select(cfg, key, default=None) is None:
            raise SentembConfigError(
                f"from_sweep={source}: its winner sets {key}={override.value()}, which is not a value of this "
                f"config (a config group or an unknown key). Fix: pass {key}=... on the command line instead."
            )
        OmegaConf.update(cfg, key, override.value(), merge=False)
        applied.append(f"{key}={override.value()}")
    return applied
