"""`python -m sentemb.sweep_report <multirun dir>`: a sweep's `metrics.json` files → one answer.

Writes into the sweep directory:
- `sweep.csv`: a row per job: its swept values, seed, status, metrics, wall time, message;
- `sweep.md`: configurations (jobs that differ only in `seed` form one row) sorted by mean best
  STS-B dev, mean ± std over seeds with n; the lead over the runner-up against the seed noise;
  failed and diverged jobs with their messages;
- `sweep_<param>.png` per swept numeric parameter (the paradigm paper's Figure 6): mean best dev
  against the parameter, one line per value of the other swept parameter with the most values,
  error bars = std over the jobs in each point (seeds, and a third parameter if any);
- `sweep_heatmap.png`: mean best dev over the two swept parameters with the most values;
- `best_overrides.txt`: the winning configuration's overrides (`from_sweep=<dir>` applies them).

It also runs by itself at the end of every multirun (`SweepReportCallback`, a Hydra callback in
conf/train.yaml) and logs its table and figures to W&B, in the sweep's group.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sentemb.errors import SentembConfigError
from sentemb.run_record import RECORD_NAME, override_key, read_records

DEV, TEST, STEP = "stsb/best_dev_spearman", "stsb/test_spearman", "stsb/best_step"


def job_rows(sweep_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """A row per job and the swept parameters (keys whose override differs between jobs, or that a sweep swept)."""
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
    rows = []
    for (directory, record), overrides in zip(records, values, strict=True):
        metrics = record.get("metrics") or {}
        rows.append(
            {
                "job": directory.name,
                **{p: overrides.get(p, "") for p in params},
                "seed": record.get("seed"),
                "status": record["status"],
                "best_dev": metrics.get(DEV),
                "best_step": metrics.get(STEP),
                "test": metrics.get(TEST),
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
    return "–" if math.isnan(mean) else f"{mean:.2f}" if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"


def markdown(sweep_dir: Path, rows: list[dict[str, Any]], params: list[str], configs: list[dict[str, Any]]) -> str:
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "failed", "diverged")}
    lines = [
        f"# Sweep {sweep_dir.name}",
        "",
        f"{len(rows)} jobs: {counts['ok']} ok, {counts['failed']} failed, {counts['diverged']} diverged. "
        f"Swept: {', '.join(f'`{p}`' for p in params) or 'nothing but the seed'}. "
        "STS-B Spearman ×100 of each job's best dev checkpoint; mean ± std over seeds.",
        "",
        "| rank | " + " | ".join(params) + " | best dev | test | best step | n | seeds |",
        "|---|" + "---|" * len(params) + "---|---|---|---|---|",
    ]
    for rank, c in enumerate(configs, start=1):
        cells = [c[p] for p in params]
        lines.append(
            f"| {rank} | " + " | ".join(cells) + f" | {_pm(c['dev_mean'], c['dev_std'])} | "
            f"{_pm(c['test_mean'], c['test_std'])} | {c['step_mean']:.0f} | {c['n']} | "
            + ", ".join(str(s) for s in c["seeds"])
            + " |"
        )
    lines.append("")
    noise, dof = pooled_seed_std(configs)
    if len(configs) > 1:
        lead = configs[0]["dev_mean"] - configs[1]["dev_mean"]
        if dof:
            verdict = "larger" if lead > 2 * noise * math.sqrt(2 / configs[0]["n"]) else "not larger"
            lines.append(
                f"The best configuration leads the runner-up by {lead:.2f} points; the pooled seed std is "
                f"{noise:.2f} ({dof} degrees of freedom), so the lead is {verdict} than two standard errors "
                "of a difference of means."
            )
        else:
            lines.append(
                f"The best configuration leads the runner-up by {lead:.2f} points. One seed per configuration: "
                "no seed noise is measured (add `seed=1,2,3` to the sweep to measure it)."
            )
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        lines += [
            "",
            "## Failed and diverged jobs",
            "",
            "| job | " + " | ".join(params) + " | seed | status | message |",
        ]
        lines.append("|---|" + "---|" * len(params) + "---|---|---|")
        for r in bad:
            message = str(r["message"]).replace("|", "\\|").replace("\n", " ")[:300]
            lines.append(
                f"| {r['job']} | " + " | ".join(r[p] for p in params) + f" | {r['seed']} | {r['status']} | {message} |"
            )
    return "\n".join(lines) + "\n"


def _numeric(values: list[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except ValueError:
        return None


def _ordered(values: list[str]) -> list[str]:
    numbers = _numeric(values)
    return [v for _, v in sorted(zip(numbers, values, strict=True))] if numbers else sorted(values)


def figures(sweep_dir: Path, rows: list[dict[str, Any]], params: list[str]) -> list[Path]:
    """sweep_<param>.png per numeric parameter, and sweep_heatmap.png over the two with the most values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok" and r["best_dev"] is not None]
    levels = {p: _ordered(list({r[p] for r in ok})) for p in params}
    by_size = sorted((p for p in params if len(levels[p]) > 1), key=lambda p: -len(levels[p]))
    written = []
    for param in by_size:
        xs = _numeric(levels[param])
        if xs is None:
            continue
        other = next((p for p in by_size if p != param), None)
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for line in levels[other] if other else [None]:
            means, stds = [], []
            for level in levels[param]:
                devs = [r["best_dev"] for r in ok if r[param] == level and (other is None or r[other] == line)]
                means.append(statistics.fmean(devs) if devs else math.nan)
                stds.append(statistics.stdev(devs) if len(devs) > 1 else 0.0)
            ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=f"{other}={line}" if other else None)
        ax.set(xlabel=param, ylabel="best STS-B dev Spearman", title=f"{sweep_dir.name}: {param}")
        if other:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = sweep_dir / f"sweep_{param}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    if len(by_size) >= 2:
        rows_param, cols_param = by_size[0], by_size[1]
        grid = [
            [
                statistics.fmean(d)
                if (d := [r["best_dev"] for r in ok if r[rows_param] == a and r[cols_param] == b])
                else math.nan
                for b in levels[cols_param]
            ]
            for a in levels[rows_param]
        ]
        fig, ax = plt.subplots(figsize=(1.2 * len(levels[cols_param]) + 2.5, 0.8 * len(levels[rows_param]) + 1.8))
        image = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(levels[cols_param])), levels[cols_param])
        ax.set_yticks(range(len(levels[rows_param])), levels[rows_param])
        ax.set(xlabel=cols_param, ylabel=rows_param, title=f"{sweep_dir.name}: mean best dev")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if not math.isnan(value):
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", color="white", fontsize=8)
        fig.colorbar(image, ax=ax)
        fig.tight_layout()
        path = sweep_dir / "sweep_heatmap.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import csv

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_report(sweep_dir: Path) -> dict[str, Any]:
    """Read every job's metrics.json below `sweep_dir`, write the report files; returns what it wrote."""
    sweep_dir = Path(sweep_dir)
    rows, params = job_rows(sweep_dir)
    configs = configurations(rows, params)
    write_csv(sweep_dir / "sweep.csv", rows)
    report = markdown(sweep_dir, rows, params, configs)
    (sweep_dir / "sweep.md").write_text(report, encoding="utf-8")
    if configs:
        (sweep_dir / "best_overrides.txt").write_text("\n".join(as_overrides(configs[0], params)) + "\n")
    pngs = figures(sweep_dir, rows, params)
    return {"rows": rows, "params": params, "configurations": configs, "markdown": report, "figures": pngs}


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

    from sentemb.config import wandb_mode

    run = wandb.init(
        project=project, group=group, name=f"{group} report", job_type="sweep-report", dir=directory, mode=wandb_mode()
    )
    columns = list(result["rows"][0])
    run.log({"sweep/jobs": wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in result["rows"]])})
    run.log({f"sweep/{png.stem}": wandb.Image(str(png)) for png in result["figures"]})
    run.summary["sweep/markdown"] = result["markdown"]
    run.finish()


class SweepReportCallback(Callback):
    """Hydra callback: the report (and its W&B run) at the end of every multirun."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            result = write_report(sweep_dir)
        except SentembConfigError as err:  # e.g. every job failed before writing anything
            print(f"sentemb: no sweep report: {err}", file=sys.stderr)
            return
        print(f"\n{result['markdown']}\n(sweep report in {sweep_dir})")
        wandb_cfg = (config.get("logger") or {}).get("wandb")
        if wandb_cfg:
            log_to_wandb(result, str(wandb_cfg.project), str(config.get("sweep_name") or sweep_dir.name), sweep_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="a multirun directory (holding <job>/metrics.json)")
    args = parser.parse_args(argv)
    try:
        result = write_report(args.sweep_dir)
    except SentembConfigError as err:
        print(f"sentemb: {err}", file=sys.stderr)
        return 1
    print(result["markdown"])
    print(f"written: sweep.csv, sweep.md, {', '.join(p.name for p in result['figures'])} in {args.sweep_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
